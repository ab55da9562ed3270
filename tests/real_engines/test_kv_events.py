"""The gateway's KV-event subscriber against the real engines' events, vLLM's and SGLang's.

Per engine, one gateway and one pool: the real server (`--kv-events-config`, ZMQ PUB on `tcp://*:P`:
vLLM 0.32 with 32-token blocks, SGLang 0.5.23 with its default 1-token pages) and a simulator of the
same dialect serving the same name (no events: approximate affinity for it). The model's tokenizer is
the tiny model's own directory (`models[].tokenizer`), so the gateway renders the chat template and
tokenizes as the engine does, and keys blocks over those token ids; the engines' `BlockStored` carry
the token ids they computed. If the two disagreed by one token, nothing would match.

- the same long prompt twice through the gateway: after the first, the index knows the real backend
  holds the prompt's blocks (`GET /admin/routes/explain` shows what routing sees: `kv_held_tokens`),
  and the second is routed there as a hit;
- a prompt whose rendezvous home is the simulator, sent to the engine directly (as another gateway
  would): the gateway routes it to the engine, `affinity:index` - only the engine's events can have
  told it;
- the same with a gateway that is not told where the engine publishes (`kv_event_discovery`): it asks
  the engine (vLLM's `GET /kv_event_sources`, SGLang's `GET /server_info`);
- a warm-up as the gateway sends one (`gateway.routing.warmup`: the start of a chat prompt's token ids
  as a one-token completion): the engine takes it, and caches blocks a chat request of that prompt
  reuses (the gateway's index then holds the chat's prompt up to the warmed prefix).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.admission.tokens import mint_token
from gateway.app import post_json
from gateway.core.circuit import CircuitBreaker
from gateway.core.fleet import Backend
from gateway.routing.tokens import PromptTokens, load_tokenizer
from gateway.routing.warmup import Warmups
from gateway.upstream.credentials import KeyedTransport
from gateway.upstream.h1 import H1Transport
from policies.features import FeatureConfig, extract_features
from policies.prefix_affinity import PrefixAffinity
from policies.types import BackendView, PoolView
from tests.conftest import MODEL, fast_sim
from tests.real_engines.rig import metric, real_pool_config
from tests.real_engines.servers import EngineServer
from tests.support import HTTP, GatewayProcess, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.timeout(300),
]  # the first test may wait for the server's startup

SECRET = "test-secret-for-the-real-kv-events-0123456789"
ADMIN = {"Authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
USER = {"Authorization": "Bearer " + mint_token(SECRET, "alice")}
#: the engines' KV block (page) size as they run here: what a `BlockStored` covers
BLOCK = {"vllm": 32, "sglang": 1}


def prompt(seed: int, words: int = 500) -> dict[str, Any]:
    rng = random.Random(seed)
    text = " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "omega", "sigma")) + str(rng.randrange(900))
                    for _ in range(words))  # fmt: skip
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"{text}\n\nSummarise."}],
        "max_tokens": 4,
    }


def names(engine: str) -> tuple[str, str]:
    """The pool's backends: the real server's name, the simulator's."""
    return f"{engine}-real", f"{engine}-sim"


def home(engine: str, body: dict[str, Any]) -> str:
    """The backend prefix affinity ranks first for `body` with nothing known (the pure policy)."""
    views = tuple(BackendView(n) for n in names(engine))
    pool = PoolView(engine, engine, 1.0, frozenset({MODEL}), True, True, views)
    return PrefixAffinity().rank(pool, extract_features(body, FeatureConfig()))[0].name


def with_home(engine: str, name: str, start: int) -> dict[str, Any]:
    seed = start
    while home(engine, prompt(seed)) != name:
        seed += 1
    return prompt(seed)


@contextlib.contextmanager
def gateway_beside(real_engine: EngineServer, *, discover: bool) -> Iterator[GatewayProcess]:
    """A gateway whose pool is the real engine and a simulator; it subscribes to the engine's events
    at the endpoint the config names, or (`discover`) where the engine itself says it publishes."""
    engine = real_engine.engine
    real, simulated = names(engine)
    with fast_sim(engine, "--model", real_engine.served_model_name, "--max-model-len", "4096") as sim:
        config = real_pool_config(engine, [real_engine.base_url, sim.base_url], real_engine.served_model_name)
        backends = config["pools"][0]["backends"]
        backends[0]["name"] = real
        if discover:
            config["pools"][0]["kv_event_discovery"] = True
        else:
            backends[0]["kv_events"] = {"endpoint": real_engine.kv_events_endpoint, "topic": "kv"}
        backends[1]["name"] = simulated
        config["models"][0]["tokenizer"] = str(real_engine.model_dir)
        config["routing"]["scrape_interval_s"] = 0  # routing by the events and the gateway's own counts
        with GatewayProcess(config, env={"GATEWAY_JWT_SECRET": SECRET}) as gw:
            # the SUB socket reaches the engine's publisher (ZMQ drops what precedes it)
            wait_until(lambda: connected(gw, real), 20, what=f"the subscription to {engine}'s publisher")
            yield gw


@pytest.fixture(scope="module")
def gateway(real_engine: EngineServer) -> Iterator[GatewayProcess]:
    with gateway_beside(real_engine, discover=False) as gw:
        yield gw


def connected(gateway: GatewayProcess, backend: str) -> bool:
    text = HTTP.get(gateway.base_url + "/metrics", timeout=10).text
    return metric(text, "gateway_kv_stream_connected", f'backend="{backend}"') == 1


def explain(gateway: GatewayProcess, body: dict[str, Any]) -> httpx.Response:
    return HTTP.post(gateway.base_url + "/admin/routes/explain", json=body, headers=ADMIN)


def held(gateway: GatewayProcess, body: dict[str, Any]) -> dict[str, int]:
    r = explain(gateway, body)
    assert r.status_code == 200, r.text
    explained = r.json()
    assert "kv_held_tokens" in explained, explained
    return dict(explained["kv_held_tokens"])


def send(gateway: GatewayProcess, body: dict[str, Any]) -> str:
    r = HTTP.post(gateway.base_url + "/v1/chat/completions", json=body, headers=USER, timeout=120)
    assert r.status_code == 200, r.text
    return r.headers["x-gateway-route"]


def tokens(server: EngineServer, body: dict[str, Any]) -> int:
    """The prompt's length in the engine's tokens, as the engine reports it."""
    direct = dict(body, model=server.served_model_name, max_tokens=1)
    r = HTTP.post(server.base_url + "/v1/chat/completions", json=direct, headers=server.headers, timeout=120)
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens"])


def test_the_same_long_prompt_twice_the_index_knows_the_real_engine_holds_it(
    gateway: GatewayProcess, real_engine: EngineServer
) -> None:
    engine = real_engine.engine
    real, _ = names(engine)
    body = with_home(engine, real, 0)
    before = held(gateway, body)
    assert before == {real: 0}, before  # only the real engine has a stream; it holds nothing yet
    first = send(gateway, body)
    assert first == "default+affinity:miss", first  # its home, nothing known there yet
    # the events arrive after the engine's step: at least every full block of the prompt but the last
    # (vLLM: 32-token blocks; SGLang: 1-token pages, keyed by the index in 64-token groups)
    wait_until(lambda: held(gateway, body)[real] >= 320, 20, what=f"{engine}'s BlockStored for the prompt")
    known = held(gateway, body)[real]
    second = send(gateway, body)
    assert second == "default+affinity:hit", _why(gateway, body, second)
    # in whole blocks, and nearly all of the prompt as the engine tokenized it: the index keys an
    # engine's blocks in groups of at least 64 tokens (two of vLLM's blocks, 64 of SGLang's pages),
    # so a held prompt reads as its full groups - at most a partial block and a partial group short
    assert known % BLOCK[engine] == 0 and known % 64 == 0, known
    assert known >= tokens(real_engine, body) - BLOCK[engine] - 63, known


def test_a_prompt_sent_to_the_engine_elsewhere_is_routed_there_by_its_events(
    gateway: GatewayProcess, real_engine: EngineServer
) -> None:
    routed_there_by_its_events(gateway, real_engine, 1000)


def test_the_gateway_finds_where_the_engine_publishes(real_engine: EngineServer) -> None:
    """No `kv_events` in the config, `kv_event_discovery` on the pool: the gateway asks the engine
    (vLLM's `GET /kv_event_sources`, SGLang's `GET /server_info`), subscribes, and routes by what
    it hears. The engine has served before this gateway existed (SGLang stores only what it did not
    hold, under a parent this gateway never heard of), so the gateway first learns from a prompt it
    routes there itself (docs/routing.md, *Unknown parents*)."""
    engine = real_engine.engine
    real, _ = names(engine)
    with gateway_beside(real_engine, discover=True) as gw:
        body = with_home(engine, real, 3000)
        assert send(gw, body) == "default+affinity:miss"
        wait_until(lambda: held(gw, body)[real] >= 320, 20, what=f"{engine}'s BlockStored for the prompt")
        routed_there_by_its_events(gw, real_engine, 2000)


def routed_there_by_its_events(gateway: GatewayProcess, real_engine: EngineServer, seed: int) -> None:
    """A prompt whose rendezvous home is the simulator, sent to the engine directly: the gateway
    routes it to the engine by the engine's events alone."""
    engine = real_engine.engine
    real, simulated = names(engine)
    body = with_home(engine, simulated, seed)
    direct = dict(body, model=real_engine.served_model_name)
    url = real_engine.base_url + "/v1/chat/completions"
    r = HTTP.post(url, json=direct, headers=real_engine.headers, timeout=120)
    assert r.status_code == 200, r.text
    wait_until(lambda: held(gateway, body)[real] >= 320, 20, what=f"{engine}'s BlockStored for the prompt")
    route = send(gateway, body)
    assert route == "default+affinity:index", _why(gateway, body, route)


def _why(gateway: GatewayProcess, body: dict[str, Any], route: str) -> str:
    """A failed route's context: what the gateway's explain says now (the blocks held, the backends'
    health) and its log without the access lines."""
    now = explain(gateway, body).text[:3000]
    return f"routed {route}; the explain now: {now}\nthe gateway log:\n{gateway.server_log()[-3000:]}"


def test_a_warm_up_caches_what_a_chat_request_of_the_prompt_reuses(
    gateway: GatewayProcess, real_engine: EngineServer
) -> None:
    """The gateway's warm-up request, sent by its own code (`Warmups.send`) to the real engine: the
    first 256 of a chat prompt's token ids, rendered and tokenized as the gateway does. The engine
    answers it, and its events make the chat prompt held up to the warmed prefix - which only holds
    if the completion's blocks are the chat request's."""
    engine = real_engine.engine
    real, _ = names(engine)
    body = with_home(engine, real, 4000)
    assert held(gateway, body)[real] == 0
    tokens = PromptTokens({MODEL: load_tokenizer(str(real_engine.model_dir), MODEL)})
    blocks = tokens.blocks(body)
    assert blocks is not None and blocks.tokens > 400
    warm = 256
    outcomes: list[str] = []

    async def send_one() -> None:
        # with the engine's key, as the gateway sends it (gateway/upstream/credentials.py)
        transport = KeyedTransport(
            H1Transport(connect_timeout_s=5), lambda _url: real_engine.headers["authorization"]
        )
        backend = Backend(real, real_engine.base_url, engine, CircuitBreaker(3, 1.0))
        warmups = Warmups(
            functools.partial(post_json, transport),  # the gateway's own POST
            timeout_s=120,
            on_outcome=lambda _p, _b, outcome: outcomes.append(outcome),
        )
        try:
            assert warmups.send(backend, real_engine.served_model_name, blocks.token_ids(warm))
            await warmups.wait()
        finally:
            await warmups.stop()
            await transport.aclose()

    asyncio.run(send_one())
    assert outcomes == ["ok"]
    # what the engine stored is the chat prompt's start: whole 64-token groups of the warmed 256
    wait_until(
        lambda: held(gateway, body)[real] >= warm - 64, 30, what=f"{engine}'s BlockStored for the warm-up"
    )
    assert held(gateway, body)[real] <= warm
