"""The simulators' /v1/embeddings, in each engine's dialect (real simulator processes)."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import pytest

from tests.conftest import fast_sim
from tests.support import HTTP

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def sims() -> object:
    with (
        fast_sim("vllm", "--embedding-dim", "24", "--model", "emb") as v,
        fast_sim("sglang", "--embedding-dim", "24", "--model", "emb") as s,
        fast_sim("vllm") as plain_v,
        fast_sim("sglang") as plain_s,
    ):
        yield {
            "vllm": v.base_url,
            "sglang": s.base_url,
            "plain_vllm": plain_v.base_url,
            "plain_sglang": plain_s.base_url,
        }


def _post(url: str, body: dict[str, object]) -> httpx.Response:
    return HTTP.post(url + "/v1/embeddings", json=body, timeout=10)


def test_shapes_per_dialect(sims: dict[str, str]) -> None:
    v = _post(sims["vllm"], {"model": "emb", "input": ["a cat", "a dog"]}).json()
    assert v["id"].startswith("embd-") and v["object"] == "list" and v["model"] == "emb" and "created" in v
    assert v["usage"] == {
        "prompt_tokens": 4,
        "total_tokens": 4,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }
    s = _post(sims["sglang"], {"model": "anything", "input": ["a cat", "a dog"]}).json()
    assert set(s) == {"data", "model", "object", "usage"} and s["model"] == "emb"
    assert s["usage"]["reasoning_tokens"] == 0
    # the same text, the same normalised vector, whichever dialect
    for a, b in zip(v["data"], s["data"], strict=True):
        assert a["embedding"] == b["embedding"] and a["object"] == "embedding"
        assert abs(math.sqrt(sum(x * x for x in a["embedding"])) - 1) < 1e-9


def test_base64_dimensions_and_token_ids(sims: dict[str, str]) -> None:
    for url in (sims["vllm"], sims["sglang"]):
        floats = _post(url, {"input": "hello", "dimensions": 8}).json()["data"][0]["embedding"]
        b64 = _post(url, {"input": "hello", "dimensions": 8, "encoding_format": "base64"}).json()["data"][0][
            "embedding"
        ]
        assert len(floats) == 8
        assert all(
            abs(a - b) < 1e-6
            for a, b in zip(struct.unpack("<8f", base64.b64decode(b64)), floats, strict=True)
        )
        ids = _post(url, {"input": [[1001, 1002], [7]]}).json()
        assert len(ids["data"]) == 2 and ids["usage"]["prompt_tokens"] == 3


def test_each_dialects_errors(sims: dict[str, str]) -> None:
    assert _post(sims["plain_vllm"], {"input": "x"}).status_code == 404
    r = _post(sims["plain_sglang"], {"input": "x"})
    assert r.status_code == 400 and "embedding model" in r.json()["message"]
    assert _post(sims["vllm"], {"model": "other", "input": "x"}).status_code == 404
    assert _post(sims["vllm"], {"input": "   "}).status_code == 200
    r = _post(sims["sglang"], {"input": "   "})
    assert r.status_code == 400 and r.json()["message"] == "Input cannot be empty or whitespace only"
    r = _post(sims["vllm"], {"input": "x", "dimensions": 99})
    assert (
        r.status_code == 400
        and r.json()["error"]["message"] == "Model 'emb' only supports dimensions in range [1, 24], got 99."
    )
    r = _post(sims["sglang"], {"input": "x", "dimensions": 99})
    assert r.json()["message"] == "Provided dimensions are greater than max embedding dimension: 24"
