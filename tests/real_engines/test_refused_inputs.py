"""Completions prompts that killed the real SGLang are refused by the gateway, and the engine lives.

SGLang 0.5.23's scheduler raised `IndexError` and the server exited on an empty token array inside a
batch and on a negative token id (docs/engines.md, *List prompts*). vLLM refuses those itself. The
gateway refuses them for both pools, before routing, with
OpenAI's error shape (engines/validate.py `_prompt`), so one client's bad body cannot take a backend
down for everybody. Here a gateway stands in front of each real engine and is sent each such body
(and its neighbours: an empty prompt in a batch, an id past 2³¹ − 1, an empty array):

- each answer is a 400 `invalid_request_error` naming the offending `param`;
- none of them reached the engine (the gateway's per-backend request counter stays at 0);
- afterwards the engine serves a batch through the same gateway (two prompts, two choices; the
  counter then reads 1) and its own `/health` answers 200.

Against a gateway without the check (`_prompt` returning at once) the test fails at its first body,
`[[1, 2], []]`, which the real SGLang answers with a 200 before its scheduler dies.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import MODEL
from tests.real_engines.rig import metric, real_pool_config
from tests.real_engines.servers import EngineServer
from tests.support import GatewayProcess, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.timeout(300),
]  # the first test may wait for a server's startup

# (prompt, the `param` the gateway's error names)
REFUSED: list[tuple[Any, str]] = [
    ([[1, 2], []], "prompt[1]"),  # SGLang 0.5.23: IndexError in its scheduler, the server exited
    ([[-1, 5]], "prompt[0][0]"),  # the same
    ([-3, 4], "prompt[0]"),  # a single prompt of token ids, one negative
    ([[5, 2**31]], "prompt[0][1]"),  # past a 32-bit id
    (["Once upon a time", ""], "prompt[1]"),  # SGLang served it, vLLM refused it
    ([], "prompt"),
]


def test_prompts_that_crashed_an_engine_are_refused_and_it_serves_on(real_engine: EngineServer) -> None:
    config = real_pool_config(real_engine.engine, [real_engine.base_url], real_engine.served_model_name)
    with (
        GatewayProcess(config) as gateway,
        httpx.Client(base_url=gateway.base_url, timeout=120, trust_env=False) as client,
    ):
        for prompt, param in REFUSED:
            r = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
            assert r.status_code == 400, (prompt, r.text)
            error = r.json()["error"]
            assert error["type"] == "invalid_request_error", r.text
            assert error["param"] == param, r.text
            assert error["message"], r.text
        backend = f'backend="{config["pools"][0]["name"]}-0"'
        text = client.get("/metrics").text
        assert metric(text, "gateway_backend_requests_total", backend) == 0, "a refused body was sent on"

        r = client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": [[10, 20, 30], [40, 50]], "max_tokens": 2, "ignore_eos": True},
        )
        assert r.status_code == 200, r.text
        assert sorted(c["index"] for c in r.json()["choices"]) == [0, 1]
        # the counter read 0 above is the one this request moves (counted just after its last byte)
        wait_until(
            lambda: metric(client.get("/metrics").text, "gateway_backend_requests_total", backend) == 1,
            what="the batch counted on the engine's backend",
        )
    health = httpx.get(real_engine.base_url + "/health", timeout=30, trust_env=False)
    assert health.status_code == 200, health.text
