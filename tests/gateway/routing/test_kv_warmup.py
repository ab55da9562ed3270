"""Warm-ups through the gateway, against two simulators of each engine publishing KV-cache events.

One prefix group (a long tool schema) is all of the pool's traffic, so prefix affinity wants it warm on
both backends. The gateway keeps the requests on the engine that holds the group and warms the other
with the preamble's token ids (`gateway.routing.warmup`: `POST /v1/completions`, one token); once that
engine's events announce the blocks, both hold the preamble, and no request paid its prefill on a cold
engine (`affinity:spread`). The policy's side: tests/policies/test_prefix_affinity_events.py.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
from typing import Any

import httpx
import pytest

from engines.sim.launcher import free_port
from gateway.admission.tokens import mint_token
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.support import GatewayProcess, wait_until

pytestmark = pytest.mark.processes

SECRET = "test-secret-for-the-warm-ups-0123456789abc"
#: vLLM publishes only with `enable_kv_cache_events`; SGLang whenever the flag is given
ENABLE: dict[str, dict[str, Any]] = {"vllm": {"enable_kv_cache_events": True}, "sglang": {}}
ADMIN = {"Authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}


def ask(rng: random.Random, tools: list[dict[str, Any]]) -> dict[str, Any]:
    question = " ".join(f"w{rng.randrange(10_000)}" for _ in range(12))
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "tools": tools,
        "max_tokens": 2,
    }


def warmups(metrics: str, outcome: str) -> float:
    return sum(
        float(v)
        for v in re.findall(
            rf'^gateway_kv_warmups_total\{{[^}}]*outcome="{outcome}"[^}}]*\}} (\S+)', metrics, re.M
        )
    )


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_hot_groups_second_engine_is_warmed_in_the_background(engine: str) -> None:
    rng = random.Random(5)
    schema = " ".join(f"field{i} holds the value {i * 7} of the record." for i in range(200))
    tools = [{"type": "function", "function": {"name": "lookup", "description": schema, "parameters": {}}}]
    ports = [free_port(), free_port()]
    with contextlib.ExitStack() as stack:
        sims = [
            stack.enter_context(
                fast_sim(
                    engine,
                    "--kv-events-config",
                    json.dumps(
                        {**ENABLE[engine], "publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "kv"}
                    ),
                )
            )
            for port in ports
        ]
        config = single_pool_config(engine, [s.base_url for s in sims])
        config["auth"] = {"enabled": True}
        config["models"][0]["tokenizer"] = "sim"
        config["pools"][0]["kv_event_discovery"] = True
        config["routing"] = {"scrape_interval_s": 0}
        gw = stack.enter_context(GatewayProcess(config, env={"GATEWAY_JWT_SECRET": SECRET}))
        client = stack.enter_context(httpx.Client(base_url=gw.base_url, headers=ADMIN, timeout=10))
        names = [f"{engine}-0", f"{engine}-1"]

        def connected() -> bool:
            text = client.get("/metrics").text
            return all(
                f'gateway_kv_stream_connected{{backend="{n}",pool="{engine}"}} 1.0' in text for n in names
            )

        def held(body: dict[str, Any]) -> dict[str, int]:
            r = client.post("/admin/routes/explain", json=body)
            assert r.status_code == 200, r.text
            return {n: int(t) for n, t in r.json()["kv_held_tokens"].items()}

        wait_until(connected, 15, what="the subscriptions to both simulators' publishers")
        first = ask(rng, tools)
        r = client.post("/v1/chat/completions", json=first)
        assert r.status_code == 200, r.text
        wait_until(lambda: max(held(first).values()) >= 512, 10, what="the first prompt's store")
        holder = max(held(first).items(), key=lambda kv: kv[1])[0]
        routes: list[str] = []
        for _ in range(45):  # the group's share of the pool passes one backend's worth (span 2)
            r = client.post("/v1/chat/completions", json=ask(rng, tools))
            assert r.status_code == 200, r.text
            routes.append(r.headers["x-gateway-route"])
        try:
            wait_until(
                lambda: warmups(client.get("/metrics").text, "ok") == 1, 10, what="one warm-up answered"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; routes {routes}") from None
        # the other engine announced the preamble it prefilled for the warm-up
        other = next(n for n in names if n != holder)
        wait_until(lambda: held(ask(rng, tools))[other] >= 512, 10, what="the warmed engine's store")
        text = client.get("/metrics").text
        assert warmups(text, "error") == 0 and warmups(text, "skipped") == 0
        assert not [r for r in routes if "spread" in r], routes
