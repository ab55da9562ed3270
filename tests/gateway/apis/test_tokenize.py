"""`/tokenize` and `/detokenize` (and SGLang's `/v1/` spellings) through a gateway, over both engines'
simulators: vLLM's shapes from either engine, models of any task, admitted, limited and metered."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from engines.sim import tokenizer
from tests.conftest import MODEL
from tests.gateway.apis.conftest import EMBED_MODEL, TIGHT_TOKENS_PER_MINUTE, EngineRig

pytestmark = pytest.mark.processes

TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.mark.parametrize("path", ["/tokenize", "/v1/tokenize"])
def test_tokenize_a_prompt(engine_rig: EngineRig, path: str) -> None:
    r = engine_rig.post(path, {"model": MODEL, "prompt": TEXT})
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-pool"] == engine_rig.engine
    ids = tokenizer.encode(TEXT)
    assert r.json() == {"count": len(ids), "max_model_len": 8192, "tokens": ids, "token_strs": None}


def test_tokenize_chat_messages(engine_rig: EngineRig) -> None:
    plain = engine_rig.post("/tokenize", {"model": MODEL, "prompt": TEXT}).json()
    chat = engine_rig.post("/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": TEXT}]})
    assert chat.status_code == 200, chat.text
    assert chat.json()["count"] > plain["count"]  # the chat template's tokens too


def test_token_strings_are_vllms(engine_rig: EngineRig) -> None:
    r = engine_rig.post("/tokenize", {"model": MODEL, "prompt": "Hi there", "return_token_strs": True})
    if engine_rig.engine == "vllm":
        assert r.status_code == 200 and r.json()["token_strs"] == ["Hi", "there"]
    else:  # SGLang has none: refused rather than answered without them
        assert r.status_code == 400 and r.json()["error"]["param"] == "return_token_strs"


@pytest.mark.parametrize("path", ["/detokenize", "/v1/detokenize"])
def test_detokenize_round_trip(engine_rig: EngineRig, path: str) -> None:
    ids = engine_rig.post("/tokenize", {"model": MODEL, "prompt": TEXT}).json()["tokens"]
    r = engine_rig.post(path, {"model": MODEL, "tokens": ids})
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": tokenizer.decode(ids)} and r.json()["prompt"] == TEXT


def test_a_model_of_any_task(engine_rig: EngineRig) -> None:
    r = engine_rig.post("/tokenize", {"model": EMBED_MODEL, "prompt": TEXT})
    assert r.status_code == 200 and r.json()["count"] == len(tokenizer.encode(TEXT))
    assert r.headers["x-gateway-pool"] == f"{engine_rig.engine}-embed"
    r = engine_rig.post("/detokenize", {"model": EMBED_MODEL, "tokens": r.json()["tokens"]})
    assert r.status_code == 200 and r.json()["prompt"] == TEXT


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": "no-such-model", "prompt": "x"}, 404, None),
        ("/tokenize", {"prompt": "x"}, 400, "model"),
        ("/tokenize", {"model": MODEL}, 400, "prompt"),
        ("/tokenize", {"model": MODEL, "prompt": "x", "messages": []}, 400, "prompt"),
        ("/tokenize", {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt"),
        ("/tokenize", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, None),
        (
            "/tokenize",
            {"model": MODEL, "prompt": "x", "add_special_tokens": "yes"},
            400,
            "add_special_tokens",
        ),
        ("/detokenize", {"model": MODEL}, 400, "tokens"),
        ("/detokenize", {"model": MODEL, "tokens": [1, -2]}, 400, "tokens[1]"),
        ("/detokenize", {"model": MODEL, "tokens": "1 2"}, 400, "tokens"),
    ],
)
def test_refused_alike_for_both_engines(
    engine_rig: EngineRig, path: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    r = engine_rig.post(path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param


def test_an_image_url_is_never_forwarded(engine_rig: EngineRig) -> None:
    part = {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data/"}}
    r = engine_rig.post("/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": [part]}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0].image_url"


def test_authenticated_and_method_checked(engine_rig: EngineRig) -> None:
    r = httpx.post(engine_rig.base_url + "/tokenize", json={"model": MODEL, "prompt": "x"}, trust_env=False)
    assert r.status_code == 401
    r = httpx.get(engine_rig.base_url + "/tokenize", trust_env=False)
    assert r.status_code == 405 and r.headers["allow"] == "POST"


def test_limited_by_the_texts_tokens(engine_rig: EngineRig) -> None:
    small = engine_rig.post("/tokenize", {"model": MODEL, "prompt": "hello"}, user=engine_rig.tight)
    assert small.status_code == 200, small.text
    assert small.headers["x-ratelimit-limit-tokens"] == str(TIGHT_TOKENS_PER_MINUTE)
    big = engine_rig.post("/tokenize", {"model": MODEL, "prompt": "word " * 2000}, user=engine_rig.tight)
    assert big.status_code == 429 and big.json()["error"]["type"] == "tokens"


def test_metered_under_its_own_endpoint(engine_rig: EngineRig) -> None:
    engine_rig.post("/detokenize", {"model": MODEL, "tokens": [1001, 1002, 1003]})
    text = httpx.get(engine_rig.base_url + "/metrics", trust_env=False).text
    pool = engine_rig.engine
    for endpoint in ("tokenize", "detokenize"):
        line = f'gateway_requests_total{{endpoint="{endpoint}",model="{MODEL}",pool="{pool}",status="200"}}'
        assert line in text
    assert f'gateway_prompt_tokens_total{{model="{MODEL}",pool="{pool}"}}' in text
