"""A gateway that starts beside an engine that has already served (a restart, a new replica).

The SGLang simulator with SGLang's default 1-token pages publishes its KV-cache events; a
conversation's first turn, with a long system prompt, is sent to it directly before the gateway
exists. Its second turn through the gateway is cached by the engine after the part it already held,
so the engine's store names a parent the gateway never heard of. The index places that store on the
prompt it routed and counts the prefix before it as held too, so a third conversation with the same
system prompt is known to be warm there (docs/routing.md, *Unknown parents*; a store no routed prompt
places is skipped as an orphan: tests/policies/test_kv_index.py).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from engines.sim.launcher import free_port
from gateway.admission.tokens import mint_token
from gateway.demo import SERVED
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.support import HTTP, GatewayProcess, wait_until

pytestmark = pytest.mark.processes

SECRET = "test-secret-for-the-late-start-0123456789"
USER = {"Authorization": "Bearer " + mint_token(SECRET, "alice")}
ADMIN = {"Authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
SYSTEM = "You are the archivist. " + " ".join(f"rule {i}: keep record {i * 7} intact." for i in range(80))


def chat(question: str, answer_first: bool = False) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is record 7?"}]
    if answer_first:
        messages += [{"role": "assistant", "content": "In the east wing."}]
    messages.append({"role": "user", "content": question})
    return {"model": MODEL, "messages": messages, "max_tokens": 4}


def metric(text: str, name: str) -> float | None:
    found = re.search(rf'^{name}\{{[^}}]*backend="sglang-0"[^}}]*\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else None


def test_a_late_gateway_learns_what_the_engine_held_before_it_subscribed() -> None:
    port = free_port()
    events = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "kv"})
    with fast_sim("sglang", "--page-size", "1", "--kv-events-config", events) as sim:
        # before any gateway: the conversation's first turn, straight to the engine
        first = chat("Where is record 7?")
        first["messages"] = first["messages"][:2]
        r = HTTP.post(sim.base_url + "/v1/chat/completions", json=dict(first, model=SERVED["sglang"]))
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] > 400

        config = single_pool_config("sglang", [sim.base_url])
        backend = config["pools"][0]["backends"][0]
        backend["kv_events"] = {"endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv"}
        config["models"][0]["tokenizer"] = "sim"
        config["routing"] = {"scrape_interval_s": 0}
        with GatewayProcess(config, env={"GATEWAY_JWT_SECRET": SECRET}) as gw:

            def held(body: dict[str, Any]) -> int:
                r = HTTP.post(gw.base_url + "/admin/routes/explain", json=body, headers=ADMIN, timeout=10)
                assert r.status_code == 200, r.text
                return int(r.json()["kv_held_tokens"]["sglang-0"])

            def counts() -> tuple[float | None, float | None]:
                text = HTTP.get(gw.base_url + "/metrics", timeout=10).text
                return metric(text, "gateway_kv_stores_anchored_total"), metric(
                    text, "gateway_kv_stores_orphaned_total"
                )

            def connected() -> bool:
                text = HTTP.get(gw.base_url + "/metrics", timeout=10).text
                return metric(text, "gateway_kv_stream_connected") == 1.0

            wait_until(connected, 10, what="the gateway's SUB socket connected to the engine's publisher")
            assert counts() == (0.0, 0.0)  # nothing heard: the engine stored its cache before
            time.sleep(0.5)  # the subscription reaches the publisher (ZMQ drops what precedes it)
            third = chat("Who keeps record 14?")
            assert held(third) == 0  # nothing heard: the engine's cache predates the gateway

            second = chat("And record 21?", answer_first=True)
            r = HTTP.post(gw.base_url + "/v1/chat/completions", json=second, headers=USER)
            assert r.status_code == 200, r.text
            tokens = int(r.json()["usage"]["prompt_tokens"])
            # the prompt's store anchored; the answer's chains under it as usual
            wait_until(lambda: counts() == (1.0, 0.0), 10, what="the store anchored on the routed prompt")
            # the second turn is held whole (in 64-token groups), and so is the system prompt the
            # engine had cached before the gateway started: another conversation's start is warm
            assert held(second) >= tokens - 63
            assert held(third) >= 400
