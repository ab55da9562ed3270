"""Real vLLM and SGLang started with `--api-key` (every session server is: conftest.py), a gateway in
front whose pool reads the key from `api_key_env`: chat and a stream pass; a key the engine refuses
is the operator's error, a 502 `upstream_auth` to the client (tests/gateway/upstream/test_engine_keys.py
has the same against the simulators, with rotation and key files)."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.real_engines.rig import ENGINE_KEY, chat, metric, real_pool_config
from tests.real_engines.servers import EngineServer
from tests.support import HTTP, GatewayProcess

pytestmark = pytest.mark.timeout(300)  # the first test may wait for a server's startup

WRONG_ENV = "WRONG_ENGINE_KEY"


def test_the_engine_refuses_a_request_without_its_key(real_engine: EngineServer) -> None:
    body = dict(chat("no key"), model=real_engine.served_model_name)
    r = httpx.post(real_engine.base_url + "/v1/chat/completions", json=body, timeout=60, trust_env=False)
    assert r.status_code == 401, r.text


def test_chat_and_a_stream_pass_with_the_key_from_the_environment(real_engine: EngineServer) -> None:
    config = real_pool_config(real_engine.engine, [real_engine.base_url], real_engine.served_model_name)
    with GatewayProcess(config) as gw, httpx.Client(base_url=gw.base_url, timeout=120) as client:
        r = client.post("/v1/chat/completions", json=chat("with the key", max_tokens=4, ignore_eos=True))
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        body = chat("streamed with the key", max_tokens=4, ignore_eos=True, stream=True)
        body["stream_options"] = {"include_usage": True}
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
        assert events[-1] == "[DONE]"
        chunks = [orjson.loads(e) for e in events[:-1]]
        assert not any("error" in c for c in chunks)
        assert chunks[-1]["usage"]["completion_tokens"] == 4
        assert ENGINE_KEY not in gw.log()


def test_a_key_the_engine_refuses_is_a_502_upstream_auth(real_engine: EngineServer) -> None:
    config = real_pool_config(real_engine.engine, [real_engine.base_url], real_engine.served_model_name)
    config["pools"][0]["api_key_env"] = WRONG_ENV
    with GatewayProcess(config, env={WRONG_ENV: "not-the-engine-key"}) as gw:
        r = HTTP.post(gw.base_url + "/v1/chat/completions", json=chat("a wrong key"), timeout=120)
        assert r.status_code == 502, r.text
        error = r.json()["error"]
        assert error["type"] == "server_error" and error["code"] == "upstream_auth"
        assert real_engine.base_url not in r.text and "not-the-engine-key" not in r.text
        text = HTTP.get(gw.base_url + "/metrics", timeout=10).text
        assert metric(text, "gateway_upstream_errors_total", 'kind="engine_auth"') >= 1
