"""Four routing processes (gateway workers) route by what the engines' KV events say they hold.

A real gateway with four workers in front of two vLLM simulators; each simulator's engine events come
from `kv_publisher.EngineEvents`, which announces what the simulator would store for the requests it
received, tokenized by the simulator itself. A document is first sent straight to the backend that is
*not* its home (as another gateway replica would have done): no worker has routed it, so only the
events can tell them where it is cached.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.demo import SERVED
from policies.features import FeatureConfig, extract_features
from policies.prefix_affinity import PrefixAffinity
from policies.types import BackendView, PoolView
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.gateway.routing.kv_publisher import EngineEvents, Publisher
from tests.support import HTTP, GatewayProcess, received_chat, wait_until

pytestmark = pytest.mark.processes

WORKERS = 4
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the document.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


def document(seed: int, words: int = 1000) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(5000)}" for _ in range(words))


def home_of(body: dict[str, Any], backends: list[str]) -> str:
    """The backend prefix affinity ranks first for `body` with nothing known (the pure policy)."""
    pool = PoolView(
        "vllm", "vllm", 1.0, frozenset({MODEL}), True, True, tuple(BackendView(b) for b in backends)
    )
    return PrefixAffinity().rank(pool, extract_features(body, FeatureConfig()))[0].name


@pytest.fixture
def fleet() -> Iterator[tuple[GatewayProcess, list[EngineEvents]]]:
    pubs = [Publisher(), Publisher()]
    try:
        with fast_sim("vllm") as s0, fast_sim("vllm") as s1:
            sims = [s0, s1]
            config = single_pool_config("vllm", [s.base_url for s in sims])
            config["models"][0]["tokenizer"] = "sim"
            config["server"]["workers"] = WORKERS
            for backend, pub in zip(config["pools"][0]["backends"], pubs, strict=True):
                backend["kv_events"] = {"endpoint": pub.endpoint, "topic": "kv"}
            with GatewayProcess(config) as gw:
                for pub in pubs:
                    pub.wait_subscribers(WORKERS)  # every worker's SUB socket, not one of them
                engines = [EngineEvents(s.base_url, p) for s, p in zip(sims, pubs, strict=True)]
                yield gw, engines
                for engine in engines:
                    engine.close()
    finally:
        for pub in pubs:
            pub.close()


def events_applied(gw: GatewayProcess, backend: str) -> float:
    """The KV events of `backend`'s stream the gateway's workers have applied, summed over them."""
    for line in HTTP.get(gw.base_url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("gateway_kv_events_total{") and f'backend="{backend}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def chat_body(doc: str, question: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"{doc}\n\n{question}"}],
        "max_tokens": 4,
        **extra,
    }


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({}, id="document"),
        # an agent's final answer: the tools go along, the gateway drops them upstream (tool_choice
        # none), so the engine's tokens have none; the gateway must tokenize what the engine gets
        pytest.param({"tools": TOOLS, "tool_choice": "none"}, id="tools-with-tool-choice-none"),
    ],
)
def test_every_worker_sends_a_document_where_its_engine_holds_it(
    fleet: tuple[GatewayProcess, list[EngineEvents]], extra: dict[str, Any]
) -> None:
    gw, engines = fleet
    doc = document(3)
    names = ["vllm-0", "vllm-1"]
    holder = 1 - names.index(home_of(chat_body(doc, "question 0", **extra), names))

    # another routing process sent the document to the holder; its engine says what it stored
    first = chat_body(doc, "question 0", **extra)
    first["model"] = SERVED["vllm"]
    for dropped in ("tools", "tool_choice"):  # what a gateway sends with tool_choice none
        first.pop(dropped, None)
    r = HTTP.post(engines[holder].base_url + "/v1/chat/completions", json=first, timeout=10)
    assert r.status_code == 200, r.text
    applied = events_applied(gw, names[holder])
    assert engines[holder].announce() >= 32  # one stored event
    wait_until(
        lambda: events_applied(gw, names[holder]) >= applied + WORKERS, what="the event in every worker"
    )

    routes = []
    # no keep-alive: each request on a new connection, which the kernel hands to any of the workers
    with httpx.Client(
        base_url=gw.base_url, timeout=10, limits=httpx.Limits(max_keepalive_connections=0)
    ) as http:
        for i in range(1, 25):
            body = chat_body(doc, f"question {i}", **extra)
            r = http.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            (j, received), *more = [
                (k, got) for k, e in enumerate(engines) if (got := received_chat(e.base_url, body))
            ]
            assert not more, f"question {i} reached both engines"
            engines[j].announce(received)  # the engine that served it stores the question's blocks too
            routes.append((j, r.headers["x-gateway-route"]))
    wrong = [(i, route) for i, route in enumerate(routes, 1) if route != (holder, "default+affinity:index")]
    assert not wrong, f"holder {holder}; requests not sent there by the events: {wrong}\n{gw.log()[-2000:]}"
