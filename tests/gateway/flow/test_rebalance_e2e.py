"""The engine comparison and the rebalancing loop end to end: a real gateway with `routing.rebalance`
on, a real redis-server, and two simulator pools that differ only in their time to first token.

The faster pool wins the comparison; each round moves one bounded step of weight toward it, with an
audit entry; a weight an admin sets stops the loop for that pool, and its DELETE hands it back. The
loop's turn is a Redis key that expires after `REBALANCE_INTERVAL_S`: the test deletes it to let the
next round start at the gateway's next look (every `REBALANCE_POLL_S`) instead of a minute later.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from gateway.admission.tokens import mint_token
from gateway.demo import SERVED
from gateway.flow.rebalance import LOCK_KEY
from policies.engine_compare import MIN_SAMPLES
from policies.rebalance import MIN_ADVANTAGE, STEP_SHARE
from tests.conftest import MODEL, fast_sim
from tests.support import GatewayProcess, RedisServer, wait_until

pytestmark = pytest.mark.processes

SECRET = "rebalance-e2e-secret-0123456789abcdef"
ADMIN = {"authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
#: a round starts within a look (5 s) of its turn; a loaded machine may take longer
ROUND_S = 30.0
STEP = STEP_SHARE * 2.0  # both pools start at weight 1


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[GatewayProcess, redis.Redis]]:
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(RedisServer())
        fast = stack.enter_context(fast_sim("vllm"))
        slow = stack.enter_context(fast_sim("sglang", "--ttft-ms", "100"))
        config: dict[str, Any] = {
            "server": {"graceful_shutdown_s": 2},
            "models": [{"name": MODEL, "context_length": 8192}],
            "pools": [
                {
                    "name": name,
                    "dialect": dialect,
                    "models": {MODEL: SERVED[dialect]},
                    "backends": [{"name": f"{name}-0", "url": sim.base_url}],
                }
                for name, dialect, sim in (("fast", "vllm", fast), ("slow", "sglang", slow))
            ],
            "upstream": {"health": {"interval_s": 0.5}},
            "routing": {"scrape_interval_s": 0, "rebalance": True},
            "redis": {"url": server.url},
            "auth": {"jwt": {"secret": SECRET}},
        }
        gw = stack.enter_context(GatewayProcess(config))
        client = stack.enter_context(contextlib.closing(redis.Redis.from_url(server.url)))
        yield gw, client


def streamed(http: httpx.Client, pool: str, n: int) -> None:
    """`n` short streamed chats pinned to `pool` (an admin's `x-gateway-pool`), each read to its end."""
    for i in range(n):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"question {i} for {pool}"}],
            "max_tokens": 4,
            "stream": True,
        }
        with http.stream("POST", "/v1/chat/completions", json=body, headers={"x-gateway-pool": pool}) as r:
            assert r.status_code == 200, r.read()
            assert r.headers["x-gateway-pool"] == pool
            r.read()


def weights(http: httpx.Client) -> dict[str, tuple[float, str]]:
    return {p["name"]: (p["weight"], p["weight_source"]) for p in http.get("/admin/pools").json()["pools"]}


def moves(http: httpx.Client) -> list[dict[str, Any]]:
    """The loop's audit entries, oldest first."""
    entries = http.get("/admin/audit").json()["entries"]
    return [e for e in reversed(entries) if e["action"] == "pool_rebalanced"]


def next_round(http: httpx.Client, client: redis.Redis) -> dict[str, Any]:
    """Hand the loop its turn now and wait for the round it runs; that round's report."""
    before = http.get("/admin/engines/compare").json()["rebalance"]["last_round"]
    client.delete(LOCK_KEY)

    def ran() -> dict[str, Any] | None:
        last: dict[str, Any] | None = http.get("/admin/engines/compare").json()["rebalance"]["last_round"]
        return last if last is not None and last != before else None

    return wait_until(ran, ROUND_S, "a rebalancing round")


def test_the_faster_pool_wins_and_the_loop_moves_weight_to_it_until_an_admin_pins_one(
    gateway: tuple[GatewayProcess, redis.Redis],
) -> None:
    gw, client = gateway
    with httpx.Client(base_url=gw.base_url, headers=ADMIN, timeout=30) as http:
        n = MIN_SAMPLES + 5
        streamed(http, "fast", n)
        streamed(http, "slow", n)

        # the comparison, through Redis
        body = http.get("/admin/engines/compare", params={"window_s": 300}).json()
        assert body["scope"] == "fleet" and body["rebalance"]["enabled"] is True
        rows = {(r["pool"], r["traffic_class"]): r for r in body["rows"]}
        assert rows[("fast", "plain")]["requests"] == rows[("slow", "plain")]["requests"] == n
        assert rows[("fast", "plain")]["ttft_p90_s"] < rows[("slow", "plain")]["ttft_p90_s"]
        (better,) = body["better"]
        assert (better["traffic_class"], better["better"], better["worse"]) == ("plain", "fast", "slow")
        assert better["ratio"] >= MIN_ADVANTAGE

        # rounds: one bounded step each toward the faster pool, each in the audit log
        for _ in range(2):
            last = next_round(http, client)
            assert len(last["moves"]) == 1, last
        entries = moves(http)
        assert len(entries) >= 2  # (a round may also have come by itself, after its interval)
        for i, e in enumerate(entries):
            assert (e["actor"], e["target"]) == ("gateway", MODEL)
            after, prev = e["after"]["weights"], e["before"]["weights"]
            assert after["fast"] == pytest.approx(prev["fast"] + STEP)
            assert after["slow"] == pytest.approx(prev["slow"] - STEP)
            assert e["after"]["why"].startswith("fast: TTFT p90")
            if i:
                assert prev == entries[i - 1]["after"]["weights"]
        now = weights(http)
        assert now["fast"] == (entries[-1]["after"]["weights"]["fast"], "rebalance")
        assert now["slow"] == (entries[-1]["after"]["weights"]["slow"], "rebalance")

        # an admin's weight: the loop leaves the pool alone
        assert http.put("/admin/pools/slow/weight", json={"weight": 0.7}).status_code == 200
        last = next_round(http, client)
        assert last["moves"] == [] and last["held"] == {MODEL: "weight set by an admin: slow"}
        assert len(moves(http)) == len(entries)
        assert weights(http) == {"fast": now["fast"], "slow": (0.7, "override")}

        # its DELETE hands it back to the loop, which goes on from its own weight
        r = http.delete("/admin/pools/slow/weight").json()
        assert (r["pool"]["weight"], r["pool"]["weight_source"]) == (now["slow"][0], "rebalance")
        last = next_round(http, client)
        assert len(last["moves"]) == 1
        assert weights(http)["slow"] == (pytest.approx(now["slow"][0] - STEP), "rebalance")
