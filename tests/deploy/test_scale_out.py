"""Scale-out: 3 gateway processes + 1 real redis-server + simulators of both engines — the shape of
the compose and Kubernetes deployments, on loopback.

- limits are exact across the replicas: a burst spread over all three admits exactly the limit;
- an admin change made on one replica is applied by all three within a second;
- one replica killed (SIGKILL: no shutdown, no release) → the other two keep serving, a stream in
  flight on a survivor finishes intact, and the concurrency slots the dead replica had leased come
  back after at most one lease.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis as redis_sync

from engines.sim.launcher import SimProcess
from gateway.admission.limits_redis import LEASE_S
from gateway.admission.tokens import mint_token
from gateway.demo import SERVED
from tests.conftest import MODEL, fast_sim
from tests.support import HTTP, GatewayProcess, RedisServer, wait_until

pytestmark = pytest.mark.processes

SECRET = "scale-out-secret-" + "s" * 48
RPM = 30
ADMIN = {"authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "One word, please."}], "max_tokens": 1}


def user(name: str, tier: str | None = None) -> dict[str, str]:
    return {"authorization": "Bearer " + mint_token(SECRET, name, tier=tier)}


def replica_config(urls: dict[str, list[str]], redis_url: str) -> dict[str, Any]:
    return {
        "server": {"graceful_shutdown_s": 5},
        "models": [{"name": MODEL, "context_length": 8192}],
        "pools": [
            {
                "name": engine,
                "dialect": engine,
                "weight": 0.5,
                "models": {MODEL: SERVED[engine]},
                "backends": [{"name": f"{engine}-{i}", "url": u} for i, u in enumerate(backends)],
            }
            for engine, backends in urls.items()
        ],
        "upstream": {"health": {"interval_s": 0.5, "failure_threshold": 2, "open_s": 1.0}},
        "routing": {"scrape_interval_s": 0.5},
        "auth": {"jwt": {"secret": SECRET}},
        "limits": {
            "tiers": {
                "default": {"requests_per_minute": 0},
                "rpm": {"requests_per_minute": RPM},
                "conc": {"concurrent_requests": 2},
            },
        },
        "redis": {"url": redis_url},
    }


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:  # its own: the module owns every key in it
        yield server


@pytest.fixture(scope="module")
def replicas(redis_server: RedisServer) -> Iterator[list[GatewayProcess]]:
    with contextlib.ExitStack() as stack:
        sims: dict[str, list[SimProcess]] = {
            e: [stack.enter_context(fast_sim(e, "--itl-ms", "10")) for _ in range(2)]
            for e in ("vllm", "sglang")
        }
        urls = {e: [s.base_url for s in ss] for e, ss in sims.items()}
        gateways = [GatewayProcess(replica_config(urls, redis_server.url)) for _ in range(3)]
        for gw in gateways:
            stack.callback(gw.stop)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda g: g.start(), gateways))
        yield gateways


def _status(gw: GatewayProcess, headers: dict[str, str]) -> int:
    return HTTP.post(gw.base_url + "/v1/chat/completions", json=CHAT, headers=headers, timeout=10).status_code


async def _spread(gateways: list[GatewayProcess], headers: dict[str, str], n: int) -> list[httpx.Response]:
    """n requests at once, round-robin over the replicas (what a load balancer does)."""
    clients = [httpx.AsyncClient(base_url=g.base_url, timeout=30, headers=headers) for g in gateways]
    try:
        return list(
            await asyncio.gather(
                *(clients[i % len(clients)].post("/v1/chat/completions", json=CHAT) for i in range(n))
            )
        )
    finally:
        for c in clients:
            await c.aclose()


def test_limits_are_exact_across_replicas(replicas: list[GatewayProcess]) -> None:
    # a burst spread over the three: exactly the limit is admitted, in one atomic sequence
    responses = asyncio.run(_spread(replicas, user("burst-user", "rpm"), 3 * RPM))
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == RPM, {s: statuses.count(s) for s in set(statuses)}
    assert statuses.count(429) == 2 * RPM
    remaining = sorted(
        int(r.headers["x-ratelimit-remaining-requests"]) for r in responses if r.status_code == 200
    )
    assert remaining == list(range(RPM))
    # one third of the limit through each replica: each saw only RPM/3 requests itself, yet each
    # refuses the next one — the count is shared
    steady = user("steady-user", "rpm")
    for gw in replicas:
        for _ in range(RPM // 3):
            assert _status(gw, steady) == 200
    for gw in replicas:
        refused = HTTP.post(gw.base_url + "/v1/chat/completions", json=CHAT, headers=steady, timeout=10)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    # and another user is untouched
    assert {r.status_code for r in asyncio.run(_spread(replicas, user("other-user", "rpm"), 6))} == {200}


def _pools(gw: GatewayProcess) -> dict[str, Any]:
    r = HTTP.get(gw.base_url + "/admin/pools", headers=ADMIN, timeout=5)
    assert r.status_code == 200, r.text
    return {p["name"]: p for p in r.json()["pools"]}


def test_admin_changes_reach_every_replica(replicas: list[GatewayProcess]) -> None:
    a, b, c = replicas
    r = HTTP.put(a.base_url + "/admin/pools/sglang/weight", json={"weight": 0}, headers=ADMIN, timeout=5)
    assert (r.json()["ok"], r.json()["shared"], r.json()["persisted"]) == (True, True, True)
    wait_until(
        lambda: all(_pools(g)["sglang"]["weight"] == 0 for g in (b, c)), what="weight on every replica"
    )
    # … and it is obeyed: every replica now routes everything to the vLLM pool
    for gw in replicas:
        for _ in range(4):
            resp = HTTP.post(gw.base_url + "/v1/chat/completions", json=CHAT, headers=user("w"), timeout=10)
            assert resp.status_code == 200 and resp.headers["x-gateway-pool"] == "vllm"
    r = HTTP.put(
        b.base_url + "/admin/backends/vllm-1/drain", json={"draining": True}, headers=ADMIN, timeout=5
    )
    assert r.status_code == 200
    wait_until(
        lambda: all(
            {x["name"]: x["draining"] for x in _pools(g)["vllm"]["backends"]}["vllm-1"] for g in replicas
        ),
        1.0,
        what="drain on every replica",
    )
    HTTP.put(c.base_url + "/admin/backends/vllm-1/drain", json={"draining": False}, headers=ADMIN, timeout=5)
    HTTP.put(c.base_url + "/admin/pools/sglang/weight", json={"weight": 0.5}, headers=ADMIN, timeout=5)
    wait_until(lambda: all(_pools(g)["sglang"]["weight"] == 0.5 for g in replicas), 1.0, what="restored")


def _open_stream(base_url: str, headers: dict[str, str]) -> tuple[httpx.Client, httpx.Response]:
    client = httpx.Client(timeout=30)
    body = {**CHAT, "max_tokens": 400, "stream": True, "ignore_eos": True}
    resp = client.send(
        client.build_request("POST", base_url + "/v1/chat/completions", json=body, headers=headers),
        stream=True,
    )
    assert resp.status_code == 200, resp.read()
    return client, resp


def test_a_killed_replica_leaves_the_others_serving_and_its_slots_come_back(
    replicas: list[GatewayProcess], redis_server: RedisServer
) -> None:
    survivors, doomed = replicas[:2], replicas[2]
    conc = user("conc-user", "conc")
    # the doomed replica holds both of conc-user's slots; a survivor streams for someone else
    held = [_open_stream(doomed.base_url, conc) for _ in range(2)]
    # keep the iterators: a dropped one closes its response (and the slot with it)
    running = [resp.iter_raw() for _, resp in held]
    for chunks in running:
        next(chunks)
    assert _status(survivors[0], conc) == 429  # the limit is shared: no third slot anywhere
    bystander_client, bystander = _open_stream(survivors[1].base_url, user("bystander"))
    events = bystander.iter_lines()
    assert next(events).startswith("data: ")

    assert doomed.proc is not None
    doomed.proc.kill()  # SIGKILL: no graceful shutdown, no release of its slots
    doomed.proc.wait(5)
    for client, _ in held:
        client.close()
    # its two slots are still leased in Redis (nobody will renew them)
    r = redis_sync.Redis.from_url(redis_server.url)
    keys = [k for k in r.scan_iter("gw:rl:*:con") if b"conc-user" in k]
    assert keys and sum(r.zcard(k) for k in keys) == 2

    # the survivors keep serving everyone else, at once, …
    for gw in survivors:
        for _ in range(5):
            assert _status(gw, user("after-kill")) == 200
    # … the dead replica's leased slots come back within one lease (renewed every lease/3 until the
    # kill), on any survivor …
    wait_until(lambda: _status(survivors[0], conc) == 200, LEASE_S * 2, what="slots back")
    # … and the stream in flight on a survivor all along finishes intact
    rest = [line for line in events if line]
    assert rest[-1] == "data: [DONE]" and not any('"error"' in line for line in rest)
    bystander_client.close()
    # both slots: two concurrent streams again
    again = [_open_stream(survivors[i].base_url, conc) for i in range(2)]
    streams = [resp.iter_raw() for _, resp in again]
    for chunks in streams:
        next(chunks)
    for client, _ in again:
        client.close()
