"""A LoRA adapter's KV cache through the gateway, against the vLLM simulator serving one.

The simulator (`--enable-lora --lora-modules tiny-lora=...`) caches an adapter's blocks apart from the
base model's and publishes them as vLLM 0.32 does (`lora_name`, every block's extra keys led by it).
The gateway serves both as public models; once an adapter store was heard, the adapter's prompts are
keyed in its namespace: what `GET /admin/routes/explain` shows held is what the engine would reuse.
The same against the real vLLM server: tests/real_engines/test_engine_lora.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from engines.sim.launcher import free_port
from gateway.admission.tokens import mint_token
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.support import GatewayProcess, wait_until

pytestmark = pytest.mark.processes

SECRET = "test-secret-for-the-lora-routing-0123456789"
ADMIN = {"Authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
ADAPTER = "adapter-public"


def chat(model: str, seed: int) -> dict[str, Any]:
    text = " ".join(f"fact {seed}.{i} is {i * 7}." for i in range(120))
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 2}


def test_an_adapters_prompts_are_held_for_the_adapter_only() -> None:
    port = free_port()
    events = json.dumps(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "kv"}
    )
    lora = [
        "--enable-lora",
        "--lora-modules",
        "tiny-lora=/adapters/tiny-lora",
        "--enable-prompt-tokens-details",
    ]
    with fast_sim("vllm", "--kv-events-config", events, *lora) as sim:
        config = single_pool_config("vllm", [sim.base_url])
        config["auth"] = {"enabled": True}
        config["pools"][0]["models"][ADAPTER] = "tiny-lora"
        config["pools"][0]["backends"][0]["kv_events"] = {
            "endpoint": f"tcp://127.0.0.1:{port}",
            "topic": "kv",
        }
        config["models"] = [{"name": m, "context_length": 8192, "tokenizer": "sim"} for m in (MODEL, ADAPTER)]
        config["routing"] = {"scrape_interval_s": 0}
        with (
            GatewayProcess(config, env={"GATEWAY_JWT_SECRET": SECRET}) as gw,
            httpx.Client(base_url=gw.base_url, headers=ADMIN, timeout=10) as client,
        ):

            def connected() -> bool:
                return bool(
                    re.search(r"^gateway_kv_stream_connected\{[^}]*\} 1", client.get("/metrics").text, re.M)
                )

            def held(body: dict[str, Any]) -> int:
                r = client.post("/admin/routes/explain", json=body)
                assert r.status_code == 200, r.text
                return int(r.json()["kv_held_tokens"]["vllm-0"])

            def cached(body: dict[str, Any]) -> int:
                r = client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                assert r.json()["model"] == body["model"]  # the public name, whichever served name
                return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

            wait_until(connected, 10, what="the subscription to the simulator's publisher")
            # the adapter's first request: nothing says yet that the model is an adapter
            first = chat(ADAPTER, 0)
            cached(first)
            wait_until(lambda: held(first) >= 512, 10, what="the adapter's first store")
            # from here on the adapter's prompts are keyed in its namespace, the base's in the base's
            adapter, base = chat(ADAPTER, 1), chat(MODEL, 1)
            assert cached(adapter) == 0
            wait_until(lambda: held(adapter) >= 512, 10, what="the adapter's store")
            assert held(base) == 0 and cached(base) == 0  # the base model reuses none of it
            wait_until(lambda: held(base) >= 512, 10, what="the base model's store")
            assert cached(adapter) >= 512 and held(chat(ADAPTER, 2)) == 0
