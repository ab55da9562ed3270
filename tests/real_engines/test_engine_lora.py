"""A LoRA adapter's prompt cache, told apart from the base model's, on the real vLLM server.

The spare vLLM 0.32 server serves the tiny model and a LoRA adapter of it (`tiny-lora`, built by
`build_lora.py`; tests/real_engines/conftest.py). vLLM caches an adapter's blocks in a namespace of its
own (its block hashes mix in the adapter's name: a base-model request never reuses them, nor the
reverse) and its KV-cache events say so: `lora_name` and every block's `extra_keys` lead with the
name. The gateway keys an adapter's stores in that namespace, learns from them that the model is
served as an adapter, and then keys that model's requests the same way; so what routing sees held
(`GET /admin/routes/explain`: `kv_held_tokens`) is what the engine would reuse.

(This module runs before tests/real_engines/test_failover.py, which kills the spare.)
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from engines.sim.launcher import free_port
from gateway.admission.tokens import mint_token
from tests.conftest import MODEL, fast_sim
from tests.real_engines.conftest import LORA_MODEL, SERVED_MODEL
from tests.real_engines.rig import ENGINE_HEADERS, kv_event_batches, metric, real_pool_config
from tests.real_engines.servers import VllmServer
from tests.support import HTTP, GatewayProcess, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.timeout(300),
]  # the first test may wait for the spare's startup

SECRET = "test-secret-for-the-real-lora-0123456789ab"
ADMIN = {"Authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
USER = {"Authorization": "Bearer " + mint_token(SECRET, "alice")}
ADAPTER = "tiny-lora-public"  # the adapter's public name (served as LORA_MODEL)


def chat(model: str, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    text = " ".join(
        rng.choice(("north", "south", "east", "west")) + str(rng.randrange(900)) for _ in range(400)
    )
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"{text}\n\nWhere to?"}],
        "max_tokens": 2,
    }


@pytest.fixture(scope="module")
def gateway(real_vllm_spare: VllmServer) -> Iterator[GatewayProcess]:
    engine = real_vllm_spare
    config = real_pool_config("vllm", [engine.base_url], SERVED_MODEL)
    pool = config["pools"][0]
    pool["models"][ADAPTER] = LORA_MODEL
    pool["backends"][0].update(name="lora", kv_events={"endpoint": engine.kv_events_endpoint, "topic": "kv"})
    base = config["models"][0]
    base["tokenizer"] = str(engine.model_dir)
    config["models"].append({**base, "name": ADAPTER})
    config["routing"]["scrape_interval_s"] = 0
    with GatewayProcess(config, env={"GATEWAY_JWT_SECRET": SECRET}) as gw:

        def connected() -> bool:
            text = HTTP.get(gw.base_url + "/metrics", timeout=10).text
            return metric(text, "gateway_kv_stream_connected", 'backend="lora"') == 1

        wait_until(connected, 20, what="the subscription to the spare's publisher")
        # The first request of an adapter is keyed as the base model's (nothing says yet that the
        # model is an adapter); the engine's store of it names the adapter, and from then on the
        # model's prompts are keyed in the adapter's namespace.
        first = chat(ADAPTER, 0)
        send(gw, first)
        wait_until(
            lambda: held(gw, first) >= 320, 20, what="vLLM's BlockStored for the adapter's first prompt"
        )
        yield gw


def held(gateway: GatewayProcess, body: dict[str, Any]) -> int:
    r = HTTP.post(gateway.base_url + "/admin/routes/explain", json=body, headers=ADMIN)
    assert r.status_code == 200, r.text
    return int(r.json()["kv_held_tokens"]["lora"])


def send(gateway: GatewayProcess, body: dict[str, Any]) -> tuple[str, int]:
    """The route's reason and the prompt tokens the engine read from its cache."""
    r = HTTP.post(gateway.base_url + "/v1/chat/completions", json=body, headers=USER, timeout=120)
    assert r.status_code == 200, r.text
    return r.headers["x-gateway-route"], int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_the_spare_serves_the_adapter(real_vllm_spare: VllmServer) -> None:
    models = HTTP.get(
        real_vllm_spare.base_url + "/v1/models", headers=real_vllm_spare.headers, timeout=10
    ).json()["data"]
    assert {(m["id"], m.get("parent")) for m in models} == {(SERVED_MODEL, None), (LORA_MODEL, SERVED_MODEL)}


def test_the_simulator_serves_and_publishes_an_adapter_as_vllm_does(real_vllm_spare: VllmServer) -> None:
    """The vLLM simulator with the same `--lora-modules`: the same model cards, and an adapter's
    `BlockStored` with the same LoRA fields (`lora_id`, `lora_name`, extra keys led by the name)."""
    path = next(m["root"] for m in models(real_vllm_spare.base_url) if m["id"] == LORA_MODEL)
    port = free_port()
    config = json.dumps(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "kv"}
    )
    flags = ["--served-model-name", SERVED_MODEL, "--enable-lora", "--lora-modules", f"{LORA_MODEL}={path}"]
    with fast_sim("vllm", *flags, "--kv-events-config", config) as sim:
        cards = {name: [(m["id"], m["root"], m["parent"]) for m in models(url) if m["id"] == LORA_MODEL]
                 for name, url in (("real", real_vllm_spare.base_url), ("sim", sim.base_url))}  # fmt: skip
        assert cards["real"] == cards["sim"] == [(LORA_MODEL, path, SERVED_MODEL)], cards
        stored = {
            name: lora_store(url, endpoint, 10 + i)
            for i, (name, url, endpoint) in enumerate(
                (("real", real_vllm_spare.base_url, real_vllm_spare.kv_events_endpoint),
                 ("sim", sim.base_url, f"tcp://127.0.0.1:{port}"))
            )
        }  # fmt: skip
    for name, event in stored.items():
        n = len(event["block_hashes"])
        assert isinstance(event["lora_id"], int) and event["lora_id"] >= 1, (name, event["lora_id"])
        assert event["lora_name"] == LORA_MODEL and event["extra_keys"] == [[LORA_MODEL]] * n, (name, event)


def models(url: str) -> list[dict[str, Any]]:
    r = HTTP.get(url + "/v1/models", headers=ENGINE_HEADERS, timeout=10)
    assert r.status_code == 200, r.text
    data: list[dict[str, Any]] = r.json()["data"]
    return data


def lora_store(url: str, endpoint: str, seed: int) -> dict[str, Any]:
    """The first `BlockStored` of the adapter's prompt sent to the engine at `url` (its events at
    `endpoint`)."""

    def send() -> None:
        body = dict(chat(LORA_MODEL, seed), max_tokens=1)
        r = HTTP.post(url + "/v1/chat/completions", json=body, headers=ENGINE_HEADERS, timeout=120)
        assert r.status_code == 200, r.text

    with contextlib.closing(kv_event_batches(endpoint, send, timeout=20)) as batches:
        for events in batches:
            for event in events:
                if isinstance(event, dict) and event.get("type") == "BlockStored" and event.get("lora_name"):
                    return event
    raise AssertionError(f"no BlockStored of the adapter from {url}")


def test_an_adapters_blocks_are_held_for_the_adapter_only(gateway: GatewayProcess) -> None:
    adapter, base = chat(ADAPTER, 1), chat(MODEL, 1)  # the same prompt, to the adapter and the base
    assert held(gateway, adapter) == 0
    route, cached = send(gateway, adapter)
    assert cached == 0
    # the engine's store names the adapter: the index learns it, and keys this model's prompts so
    wait_until(lambda: held(gateway, adapter) >= 320, 20, what="vLLM's BlockStored for the adapter's prompt")
    assert held(gateway, base) == 0  # the base model would reuse none of it...
    assert send(gateway, base)[1] == 0  # ...and it did not
    wait_until(lambda: held(gateway, base) >= 320, 20, what="vLLM's BlockStored for the base model's prompt")
    route, cached = send(gateway, adapter)  # the adapter's own blocks are reused
    assert route == "default+affinity:hit" and cached >= 320, (route, cached)


def test_a_base_models_blocks_are_not_held_for_the_adapter(gateway: GatewayProcess) -> None:
    """The other way round: a prompt the base model cached reads as held for the base model only."""
    base, adapter = chat(MODEL, 2), chat(ADAPTER, 2)
    send(gateway, base)
    wait_until(lambda: held(gateway, base) >= 320, 20, what="vLLM's BlockStored for the base model's prompt")
    assert held(gateway, adapter) == 0
    assert send(gateway, adapter)[1] == 0
