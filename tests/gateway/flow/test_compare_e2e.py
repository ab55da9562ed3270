"""The engine comparison end to end: two gateway replicas sharing a real redis-server, in front of a
vLLM-dialect and an SGLang-dialect simulator pool that serve the same model.

Requests of several traffic classes go through either replica, each pinned to a pool (an admin's
`x-gateway-pool`); either replica's `GET /admin/engines/compare` then counts all of them, per pool
and class, once the other replica has flushed its counts (every `FLUSH_S`).
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.admission.tokens import mint_token
from gateway.demo import SERVED
from tests.conftest import MODEL, fast_sim
from tests.support import HTTP, GatewayProcess, RedisServer, wait_until

pytestmark = pytest.mark.processes

SECRET = "compare-e2e-secret-0123456789abcdef"
ADMIN = {"authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
#: the other replica flushes every 5 s; a loaded machine may take longer
FLUSHED_S = 30.0
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def replicas() -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(RedisServer())
        sims = {d: stack.enter_context(fast_sim(d)) for d in ("vllm", "sglang")}
        config: dict[str, Any] = {
            "models": [{"name": MODEL, "context_length": 32768}],
            "pools": [
                {
                    "name": dialect,
                    "dialect": dialect,
                    "models": {MODEL: SERVED[dialect]},
                    "backends": [{"name": f"{dialect}-0", "url": sim.base_url}],
                }
                for dialect, sim in sims.items()
            ],
            "routing": {"scrape_interval_s": 0},
            "redis": {"url": server.url},
            "auth": {"jwt": {"secret": SECRET}},
        }
        a = stack.enter_context(GatewayProcess(dict(config)))
        b = stack.enter_context(GatewayProcess(dict(config)))
        yield a, b


def send(gw: GatewayProcess, pool: str, cls: str, *, stream: bool = True) -> None:
    """One chat of traffic class `cls`, pinned to `pool`, read to its end."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 6, "stream": stream}
    content = "a short question"
    if cls == "tools":
        body["tools"] = TOOLS
    elif cls == "reasoning":
        body["reasoning_effort"] = "high"
    elif cls == "long_prompt":
        content = "word " * 3000  # ~3,750 estimated tokens
    body["messages"] = [{"role": "user", "content": content}]
    headers = {**ADMIN, "x-gateway-pool": pool}
    with (
        httpx.Client(base_url=gw.base_url, timeout=30) as http,
        http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        assert r.status_code == 200, r.read()
        assert r.headers["x-gateway-pool"] == pool
        r.read()


def test_either_replica_answers_the_fleets_rows_per_pool_and_traffic_class(
    replicas: tuple[GatewayProcess, GatewayProcess],
) -> None:
    a, b = replicas
    sent: Counter[tuple[str, str]] = Counter()
    for gw, pool, cls, n in (
        (a, "vllm", "plain", 3),
        (b, "vllm", "plain", 2),
        (a, "sglang", "plain", 2),
        (b, "sglang", "tools", 2),
        (a, "vllm", "long_prompt", 1),
        (b, "sglang", "reasoning", 1),
    ):
        for _ in range(n):
            send(gw, pool, cls)
            sent[(pool, cls)] += 1
    send(a, "vllm", "plain", stream=False)  # counts in requests and tokens, not in latencies
    sent[("vllm", "plain")] += 1

    def rows(gw: GatewayProcess) -> dict[tuple[str, str], dict[str, Any]]:
        """The rows of `gw`'s answer once they count every request sent, else nothing."""
        r = HTTP.get(gw.base_url + "/admin/engines/compare", params={"model": MODEL}, headers=ADMIN)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["scope"] == "fleet" and "note" not in body
        got = {(row["pool"], row["traffic_class"]): row for row in body["rows"]}
        return got if {k: v["requests"] for k, v in got.items()} == dict(sent) else {}

    for gw in (a, b):
        got = wait_until(functools.partial(rows, gw), FLUSHED_S, "the other replica's counts")
    for (pool, cls), row in got.items():
        streamed = sent[(pool, cls)] - (1 if (pool, cls) == ("vllm", "plain") else 0)
        assert row["model"] == MODEL
        assert (row["errors"], row["error_rate"]) == (0, 0.0)
        assert row["ttft_samples"] == streamed and row["ttft_p50_s"] is not None
        assert row["ttft_p50_s"] <= row["ttft_p90_s"] <= row["ttft_p99_s"]
        assert row["output_tokens"] > 0 and row["output_tokens_per_s"] > 0
    assert got[("vllm", "plain")]["tpot_samples"] >= 1
    r = HTTP.get(a.base_url + "/admin/engines/compare", params={"model": "nope"}, headers=ADMIN)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
