"""`GET /admin/engines/compare` in-process: the admin app over a recorder on an injected clock (no
gateway, no engine): its shape, the admin guard, OpenAI's 400 for a bad window, and the replica's
own view, said so, while Redis does not answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from engines.errors import ApiError
from gateway.control.admin import build_admin_app
from gateway.control.store import MemoryStore
from gateway.control.verbs import FleetControl
from gateway.core.context import Principal
from gateway.flow.compare import EngineStats, report
from policies.engine_compare import MIN_SAMPLES
from tests.gateway.flow.fake_redis import FakeRedis
from tests.gateway.flow.test_compare import FLEET, TOOLS, Clock, request

ADMIN = {"authorization": "Bearer admin"}
LOOP = {"enabled": True, "interval_s": 60.0, "last_round": None}


async def authorize(headers: dict[bytes, bytes]) -> Principal:
    if headers.get(b"authorization") != b"Bearer admin":
        raise ApiError(401, "no admin token", code="invalid_api_key")
    return Principal(user="ops", roles=frozenset({"admin"}))


class Config:
    def base_pools(self) -> list[Any]:
        return []

    async def reread_config(self) -> None:
        raise AssertionError("no reload here")


def client(stats: EngineStats) -> httpx.AsyncClient:
    async def engines(window_s: int, model: str | None) -> dict[str, Any]:
        return report(await stats.window(window_s, model), LOOP)

    app = build_admin_app(
        FleetControl(FLEET, Config(), MemoryStore()),
        authorize,
        None,
        lambda body, pin: {},
        ["m"],
        engines=engines,
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


@pytest.fixture()
async def http() -> AsyncIterator[httpx.AsyncClient]:
    stats = EngineStats(Clock())
    for _ in range(MIN_SAMPLES):
        stats.record(*request("vllm", ttft=0.01))
        stats.record(*request("sglang", ttft=0.03))
    stats.record(*request("sglang", body=TOOLS, kind="upstream_broken"))
    async with client(stats) as c:
        yield c


async def test_rows_per_model_pool_and_class_with_the_better_pool(http: httpx.AsyncClient) -> None:
    r = await http.get("/admin/engines/compare", params={"window_s": "900"}, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.headers["cache-control"] == "no-store"
    body = r.json()
    assert set(body) == {"window_s", "span_s", "scope", "note", "min_samples", "rows", "better", "rebalance"}
    assert (body["window_s"], body["scope"], body["rebalance"]) == (900, "replica", LOOP)
    assert [(row["pool"], row["traffic_class"]) for row in body["rows"]] == [
        ("sglang", "tools"),
        ("sglang", "plain"),
        ("vllm", "plain"),
    ]
    row = body["rows"][0]
    assert set(row) == {
        "model",
        "pool",
        "traffic_class",
        "requests",
        "errors",
        "error_rate",
        "output_tokens",
        "output_tokens_per_s",
        "ttft_samples",
        "ttft_p50_s",
        "ttft_p90_s",
        "ttft_p99_s",
        "tpot_samples",
        "tpot_p50_s",
        "tpot_p90_s",
        "tpot_p99_s",
        "ttft_target_requests",
        "ttft_target_met",
        "goodput_tokens_per_s",
    }
    assert (row["requests"], row["errors"], row["error_rate"]) == (1, 1, 1.0)
    (better,) = body["better"]
    assert (better["model"], better["traffic_class"], better["better"], better["worse"]) == (
        "m",
        "plain",
        "vllm",
        "sglang",
    )
    assert better["by"] == "ttft_p90" and 2.5 < better["ratio"] < 3.5


async def test_the_default_window_and_one_model(http: httpx.AsyncClient) -> None:
    body = (await http.get("/admin/engines/compare?model=m", headers=ADMIN)).json()
    assert body["window_s"] == 900 and len(body["rows"]) == 3


@pytest.mark.parametrize("window", ["abc", "30", "3601", "-60", "90.5", ""])
async def test_a_bad_window_is_openais_400(http: httpx.AsyncClient, window: str) -> None:
    r = await http.get("/admin/engines/compare", params={"window_s": window}, headers=ADMIN)
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "window_s")
    assert "60 to 3600" in error["message"]


async def test_an_unknown_model_and_a_caller_without_the_admin_role(http: httpx.AsyncClient) -> None:
    r = await http.get("/admin/engines/compare?model=nope", headers=ADMIN)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = await http.get("/admin/engines/compare")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


async def test_while_redis_is_down_the_answer_is_this_replicas_marked_so() -> None:
    redis = FakeRedis()
    stats = EngineStats(Clock())
    stats._redis = redis  # bound as `start` does
    stats.record(*request("vllm"))
    await stats.flush()
    async with client(stats) as http:
        body = (await http.get("/admin/engines/compare", headers=ADMIN)).json()
        assert body["scope"] == "fleet" and "note" not in body
        redis.down = True
        r = await http.get("/admin/engines/compare", headers=ADMIN)
        assert r.status_code == 200
        body = r.json()
        assert body["scope"] == "replica" and "unreachable" in body["note"]
        assert body["rows"][0]["requests"] == 1
