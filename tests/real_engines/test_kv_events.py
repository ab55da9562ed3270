"""The gateway's KV-event subscriber against the real vLLM server's events.

One gateway, one pool: the real vLLM 0.32 server (`--kv-events-config`, ZMQ on `tcp://*:P`, block size
32) and a simulator serving the same name (no events: approximate affinity for it). The model's
tokenizer is the tiny model's own directory (`models[].tokenizer`), so the gateway renders the chat
template and tokenizes as vLLM does, and keys blocks over those token ids; vLLM's `BlockStored` carry
the token ids it computed. If the two disagreed by one token, nothing would match.

- the same long prompt twice through the gateway: after the first, the index knows the real backend
  holds the prompt's blocks (`GET /admin/routes/explain` shows what routing sees: `kv_held_tokens`),
  and the second is routed there as a hit;
- a prompt whose rendezvous home is the simulator, sent to vLLM directly (as another gateway would):
  the gateway routes it to vLLM, `affinity:index` - only vLLM's events can have told it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engines.sim.launcher import SimProcess
from gateway.admission.tokens import mint_token
from policies.features import FeatureConfig, extract_features
from policies.prefix_affinity import PrefixAffinity
from policies.types import BackendView, PoolView
from tests.conftest import MODEL, fast_sim
from tests.real_engines.rig import real_pool_config
from tests.real_engines.servers import VllmServer
from tests.support import GatewayProcess, wait_until

pytestmark = pytest.mark.timeout(300)  # the first test may wait for the server's startup

SECRET = "test-secret-for-the-real-kv-events-0123456789"
ADMIN = {"Authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
USER = {"Authorization": "Bearer " + mint_token(SECRET, "alice")}
NAMES = ["vllm-real", "vllm-sim"]


def prompt(seed: int, words: int = 500) -> dict[str, Any]:
    rng = random.Random(seed)
    text = " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "omega", "sigma")) + str(rng.randrange(900))
                    for _ in range(words))  # fmt: skip
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"{text}\n\nSummarise."}],
        "max_tokens": 4,
    }


def home(body: dict[str, Any]) -> str:
    """The backend prefix affinity ranks first for `body` with nothing known (the pure policy)."""
    pool = PoolView("vllm", "vllm", 1.0, frozenset({MODEL}), True, True, tuple(BackendView(n) for n in NAMES))
    return PrefixAffinity().rank(pool, extract_features(body, FeatureConfig()))[0].name


def with_home(name: str, start: int) -> dict[str, Any]:
    seed = start
    while home(prompt(seed)) != name:
        seed += 1
    return prompt(seed)


@pytest.fixture(scope="module")
def sim(real_vllm: VllmServer) -> Iterator[SimProcess]:
    with fast_sim("vllm", "--model", real_vllm.served_model_name, "--max-model-len", "4096") as s:
        yield s


@pytest.fixture(scope="module")
def gateway(real_vllm: VllmServer, sim: SimProcess) -> Iterator[GatewayProcess]:
    config = real_pool_config("vllm", [real_vllm.base_url, sim.base_url], real_vllm.served_model_name)
    backends = config["pools"][0]["backends"]
    backends[0].update(name="vllm-real", kv_events={"endpoint": real_vllm.kv_events_endpoint, "topic": "kv"})
    backends[1]["name"] = "vllm-sim"
    config["models"][0]["tokenizer"] = str(real_vllm.model_dir)
    config["routing"]["scrape_interval_s"] = 0  # routing by the events and the gateway's own counts
    with GatewayProcess(config, env={"GATEWAY_JWT_SECRET": SECRET}) as gw:
        time.sleep(1.0)  # the SUB socket reaches vLLM's publisher (ZMQ drops what precedes it)
        yield gw


def held(gateway: GatewayProcess, body: dict[str, Any]) -> dict[str, int]:
    r = httpx.post(gateway.base_url + "/admin/routes/explain", json=body, headers=ADMIN, timeout=30)
    assert r.status_code == 200, r.text
    explained = r.json()
    assert "kv_held_tokens" in explained, explained
    return dict(explained["kv_held_tokens"])


def send(gateway: GatewayProcess, body: dict[str, Any]) -> str:
    r = httpx.post(gateway.base_url + "/v1/chat/completions", json=body, headers=USER, timeout=120)
    assert r.status_code == 200, r.text
    return r.headers["x-gateway-route"]


def test_the_same_long_prompt_twice_the_index_knows_the_real_engine_holds_it(
    gateway: GatewayProcess, real_vllm: VllmServer
) -> None:
    body = with_home("vllm-real", 0)
    before = held(gateway, body)
    assert before == {"vllm-real": 0}, before  # only the real engine has a stream; it holds nothing yet
    first = send(gateway, body)
    assert first == "default+affinity:miss", first  # its home, nothing known there yet
    # the events arrive after vLLM's step: at least every full 32-token block of the prompt but the last
    wait_until(
        lambda: held(gateway, body)["vllm-real"] >= 32 * 10, 20, what="vLLM's BlockStored for the prompt"
    )
    known = held(gateway, body)["vllm-real"]
    second = send(gateway, body)
    assert second == "default+affinity:hit", second
    assert known % 32 == 0 and known >= 320, known


def test_a_prompt_sent_to_vllm_elsewhere_is_routed_there_by_its_events(
    gateway: GatewayProcess, real_vllm: VllmServer
) -> None:
    body = with_home("vllm-sim", 1000)
    direct = dict(body, model=real_vllm.served_model_name)
    r = httpx.post(real_vllm.base_url + "/v1/chat/completions", json=direct, timeout=120)
    assert r.status_code == 200, r.text
    wait_until(lambda: held(gateway, body)["vllm-real"] >= 320, 20, what="vLLM's BlockStored for the prompt")
    assert send(gateway, body) == "default+affinity:index"
