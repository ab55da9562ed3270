"""What an operator can do through a Redis outage, and what a Redis that comes back empty costs.

Two gateways share a real redis-server (append-only file on). While it is down: every admin endpoint
that needs it answers a 503 in OpenAI's shape; an API key verified before the outage keeps working,
one never seen answers 503; a weight and a drain apply on the replica asked, marked as not persisted,
and reach the other replica when Redis is back. When Redis comes back empty: both replicas say so (a
log line, `gateway_shared_state_lost_total`), and the overrides they knew are written back.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.reliability.support import SECRET, bearer, metric, token
from tests.reliability.test_redis_outage import PersistentRedis
from tests.support import HTTP, GatewayProcess, wait_until

pytestmark = pytest.mark.processes

ADMIN = bearer(token("root", admin=True))
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def _gateway(urls: list[str], redis_url: str) -> GatewayProcess:
    config = single_pool_config(
        "vllm",
        urls,
        redis={"url": redis_url},
        auth={"jwt": {"secret": SECRET}},
        limits={"on_redis_error": "fail_open"},
        upstream={"health": {"interval_s": 3600}},
    )
    return GatewayProcess(config)


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[PersistentRedis, GatewayProcess, GatewayProcess]]:
    redis = PersistentRedis()
    redis.start()
    try:
        with contextlib.ExitStack() as stack:
            sims = [stack.enter_context(fast_sim("vllm")) for _ in range(2)]
            urls = [s.base_url for s in sims]
            a = stack.enter_context(_gateway(urls, redis.url))
            b = stack.enter_context(_gateway(urls, redis.url))
            yield redis, a, b
    finally:
        redis.cleanup()


def pools(gw: GatewayProcess) -> dict[str, Any]:
    return dict(HTTP.get(gw.base_url + "/admin/pools", headers=ADMIN, timeout=5).json())


def state(gw: GatewayProcess) -> tuple[float, bool]:
    """The pool's weight and whether backend vllm-0 is draining, as `gw` sees them."""
    pool = pools(gw)["pools"][0]
    return float(pool["weight"]), bool(pool["backends"][0]["draining"])


def chat_with(gw: GatewayProcess, key: str) -> httpx.Response:
    return HTTP.post(gw.base_url + "/v1/chat/completions", json=CHAT, headers=bearer(key), timeout=10)


def wipe(redis: PersistentRedis) -> None:
    """Restart Redis on its port with nothing in it (its data directory emptied)."""
    redis.stop()
    shutil.rmtree(redis.dir)
    Path(redis.dir).mkdir()
    redis.start()


def test_an_operator_can_act_through_an_outage_and_a_redis_that_comes_back_empty(
    fleet: tuple[PersistentRedis, GatewayProcess, GatewayProcess],
) -> None:
    redis, a, b = fleet
    made = [
        HTTP.post(a.base_url + "/admin/api-keys", json={"user": u}, headers=ADMIN, timeout=5).json()
        for u in ("known", "unseen")
    ]
    known, unseen = made[0]["key"], made[1]["key"]
    assert chat_with(a, known).status_code == 200  # verified by this replica before the outage

    redis.stop()
    for method, path in (("GET", "/admin/audit"), ("GET", "/admin/api-keys"), ("POST", "/admin/api-keys")):
        r = HTTP.request(method, a.base_url + path, headers=ADMIN, json={"user": "x"}, timeout=10)
        assert r.status_code == 503, (method, path, r.text)
        error = r.json()["error"]
        assert error["code"] == "redis_unavailable" and error["type"] == "server_error", r.text
        assert "Redis" in error["message"] and "Traceback" not in r.text
    assert chat_with(a, known).status_code == 200
    refused = chat_with(a, unseen)
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "server_error"

    r = HTTP.put(a.base_url + "/admin/pools/vllm/weight", json={"weight": 0.4}, headers=ADMIN, timeout=10)
    assert r.status_code == 200 and r.json()["persisted"] is False and r.json()["shared"] is False, r.text
    r = HTTP.put(
        a.base_url + "/admin/backends/vllm-0/drain", json={"draining": True}, headers=ADMIN, timeout=10
    )
    assert r.status_code == 200 and r.json()["persisted"] is False, r.text
    assert state(a) == (0.4, True)
    assert [p["action"] for p in pools(a)["not_persisted"]] == ["set_weight", "drain"]
    assert state(b) == (1.0, False)  # the other replica did not hear of it: Redis carries changes
    # a change that cannot be made on one replica alone is still refused
    r = HTTP.post(
        a.base_url + "/admin/pools/vllm/backends",
        json={"name": "x", "url": "http://127.0.0.1:1"},
        headers=ADMIN,
    )
    assert r.status_code == 503 and r.json()["error"]["code"] == "redis_unavailable"

    redis.start()  # the same data: the outage is over
    try:
        wait_until(
            lambda: state(b) == (0.4, True), timeout=10, what="the outage's changes reach the other replica"
        )
    except AssertionError as e:  # what each replica holds and said, for a failure on a loaded machine
        raise AssertionError(
            f"{e}; a: {state(a)}, not persisted {pools(a)['not_persisted']}; b: {state(b)}\n"
            f"a's log:\n{a.server_log()[-3000:]}\nb's log:\n{b.server_log()[-3000:]}"
        ) from None
    assert pools(a)["not_persisted"] == []
    audit = HTTP.get(b.base_url + "/admin/audit", headers=ADMIN, timeout=5).json()["entries"]
    assert [e["action"] for e in audit[:2]] == ["drain", "set_weight"]

    wipe(redis)  # Redis back with nothing in it
    wait_until(
        lambda: all(
            metric(
                HTTP.get(g.base_url + "/metrics", timeout=5).text,
                "gateway_shared_state_lost_total",
                kind="overrides",
            )
            >= 2
            for g in (a, b)
        ),
        timeout=10,
        what="both replicas report the lost overrides",
    )
    for gw in (a, b):
        log = gw.server_log()
        assert (
            "shared state (Redis) came back empty" in log and "weight:vllm" in log and "drain:vllm-0" in log
        )
        assert "API keys (1 verified here" in log or gw is b
    # one replica wrote back what they knew: the fleet keeps its weight and its drained backend
    wait_until(
        lambda: state(a) == (0.4, True) and state(b) == (0.4, True), timeout=10, what="overrides restored"
    )
    audit = HTTP.get(a.base_url + "/admin/audit", headers=ADMIN, timeout=5).json()["entries"]
    assert [e["action"] for e in audit] == ["restore_overrides"]
