"""`/v1/embeddings` with the real `openai` SDK over both engines' pools (an embedding model served by
each dialect's simulator)."""

from __future__ import annotations

import base64
import math
import struct
from typing import Any

import openai
import pytest

from tests.conftest import MODEL
from tests.gateway.apis.conftest import EMBED_DIM, EMBED_MODEL, Rig
from tests.support import HTTP

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def client(rig: Rig) -> openai.OpenAI:
    return openai.OpenAI(base_url=rig.base_url + "/v1", api_key=rig.alice, max_retries=0, timeout=30)


def _norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (_norm(a) * _norm(b))


def test_float(client: openai.OpenAI) -> None:
    texts = ["the sea is blue", "the sea is deep and blue", "stock prices fell sharply"]
    r = client.embeddings.create(model=EMBED_MODEL, input=texts, encoding_format="float")
    assert r.object == "list" and r.model == EMBED_MODEL
    assert [d.index for d in r.data] == [0, 1, 2]
    vecs = [d.embedding for d in r.data]
    assert all(len(v) == EMBED_DIM and abs(_norm(v) - 1) < 1e-6 for v in vecs)
    assert _cos(vecs[0], vecs[1]) > _cos(vecs[0], vecs[2])  # shared words: closer
    assert r.usage.prompt_tokens == r.usage.total_tokens > 0


def test_base64_is_the_same_vector(client: openai.OpenAI, rig: Rig) -> None:
    floats = client.embeddings.create(model=EMBED_MODEL, input="hello world", encoding_format="float")
    # the SDK decodes base64 itself; read the wire too
    raw = HTTP.post(
        rig.base_url + "/v1/embeddings",
        json={"model": EMBED_MODEL, "input": "hello world", "encoding_format": "base64"},
        headers={"authorization": f"Bearer {rig.alice}"},
    ).json()
    blob = raw["data"][0]["embedding"]
    assert isinstance(blob, str)
    decoded = struct.unpack(f"<{EMBED_DIM}f", base64.b64decode(blob))
    assert all(abs(a - b) < 1e-6 for a, b in zip(decoded, floats.data[0].embedding, strict=True))
    asked = client.embeddings.create(model=EMBED_MODEL, input="hello world", encoding_format="base64")
    assert asked.data[0].embedding == blob  # asked for base64: the SDK hands the string over
    # without encoding_format the SDK asks for base64 itself and decodes it
    default = client.embeddings.create(model=EMBED_MODEL, input="hello world")
    assert all(abs(a - b) < 1e-6 for a, b in zip(default.data[0].embedding, decoded, strict=True))
    assert set(raw) == {"object", "data", "model", "usage"}
    assert raw["usage"] == {
        "prompt_tokens": floats.usage.prompt_tokens,
        "total_tokens": floats.usage.total_tokens,
    }


def test_token_arrays_and_dimensions(client: openai.OpenAI) -> None:
    one = client.embeddings.create(model=EMBED_MODEL, input=[1001, 1002, 1003])
    assert len(one.data) == 1 and one.usage.prompt_tokens == 3
    many = client.embeddings.create(model=EMBED_MODEL, input=[[1001, 1002], [1003]])
    assert len(many.data) == 2 and many.usage.prompt_tokens == 3
    short = client.embeddings.create(model=EMBED_MODEL, input="hello", dimensions=8)
    assert len(short.data[0].embedding) == 8 and abs(_norm(short.data[0].embedding) - 1) < 1e-6


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": EMBED_MODEL, "input": ""}, "input"),
        ({"model": EMBED_MODEL, "input": ["ok", "   "]}, "input[1]"),
        ({"model": EMBED_MODEL, "input": []}, "input"),
        ({"model": EMBED_MODEL, "input": [1, "x"]}, "input[1]"),
        ({"model": EMBED_MODEL, "input": [[5, -1]]}, "input[0][1]"),  # integer_below_min_value
        ({"model": EMBED_MODEL, "input": [1 << 31]}, "input[0]"),  # integer_above_max_value
        ({"model": EMBED_MODEL, "input": "x", "encoding_format": "bytes"}, "encoding_format"),
        ({"model": EMBED_MODEL, "input": "x", "dimensions": 0}, "dimensions"),
        ({"model": EMBED_MODEL, "input": "word " * 1000}, "input"),
        ({"model": MODEL, "input": "a chat model"}, "model"),
    ],
)
def test_bad_input(rig: Rig, body: dict[str, Any], param: str) -> None:
    r = HTTP.post(
        rig.base_url + "/v1/embeddings", json=body, headers={"authorization": f"Bearer {rig.alice}"}
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"


def test_dimensions_beyond_the_model_is_the_engines_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=EMBED_MODEL, input="x", dimensions=EMBED_DIM + 1)
    assert isinstance(err.value.body, dict) and "dimension" in str(err.value.body["message"]).lower()


def test_an_embedding_model_on_chat_and_responses_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=EMBED_MODEL, messages=[{"role": "user", "content": "hi"}])
    assert isinstance(err.value.body, dict) and err.value.body["param"] == "model"
    assert "embedding model" in str(err.value.body["message"])
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=EMBED_MODEL, input="hi")
