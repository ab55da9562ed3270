"""Budgets end to end: real gateway processes sharing a real redis-server, real simulators.

- exactness: 3 gateways, 200 concurrent streamed requests from 200 users of one tenant whose money
  budget admits exactly N of them → exactly N admitted, the rest 429 `insufficient_quota`; once the
  streams ended, `GET /admin/spend` shows the real usage (reconciled), not the reservations;
- an API key's token budget: created and raised through the admin API (audited), OpenAI's
  `insufficient_quota` through the SDK, `retry-after` only when true;
- a rolling budget's true `retry-after`; budgets surviving a gateway restart;
- spend and budget metrics without per-user labels; a Redis outage under `fail_closed`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import openai
import orjson
import pytest
import redis as redis_sync

from engines.sim.launcher import SimProcess
from gateway.admission.tokens import mint_token
from gateway.demo import SERVED
from policies.features import extract_features
from tests.conftest import MODEL, fast_sim
from tests.support import HTTP, GatewayProcess, RedisServer, wait_until

pytestmark = pytest.mark.processes

SECRET = "budget-secret-" + "b" * 40
# USD per million tokens; cached prompt tokens at half price
PRICE = {"prompt": 1.0, "cached_prompt": 0.5, "completion": 2.0}
PICOS = {k: int(v * 10**6) for k, v in PRICE.items()}  # pico-dollars per token
MAX_TOKENS = 150
N = 37


def bearer(
    user: str, *, tenant: str | None = None, tier: str | None = None, admin: bool = False
) -> dict[str, str]:
    token = mint_token(SECRET, user, tenant=tenant, tier=tier, roles=["admin"] if admin else None)
    return {"authorization": f"Bearer {token}"}


ADMIN = bearer("ops", admin=True)


def body(stream: bool = True, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story about the sea, please."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    if stream:
        out.update(stream=True, stream_options={"include_usage": True})
    return out


def reserved_nanos(b: dict[str, Any]) -> int:
    """What the gateway reserves for `b`: its prompt estimate and max_tokens, prompt uncached."""
    picos = extract_features(b).prompt_tokens * PICOS["prompt"] + b["max_tokens"] * PICOS["completion"]
    return -(-picos // 1000)


def cost_nanos(usage: dict[str, Any]) -> int:
    """What `usage` costs at PRICE, rounded up to a nano-dollar (written out here, not the gateway's code)."""
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    picos = (
        (usage["prompt_tokens"] - cached) * PICOS["prompt"]
        + cached * PICOS["cached_prompt"]
        + usage["completion_tokens"] * PICOS["completion"]
    )
    return -(-picos // 1000)


def budget_config(url: str, redis_url: str, **limits: Any) -> dict[str, Any]:
    return {
        "server": {"graceful_shutdown_s": 1},
        "models": [{"name": MODEL, "context_length": 8192, "price": PRICE}],
        "pools": [
            {
                "name": "vllm",
                "dialect": "vllm",
                "models": {MODEL: SERVED["vllm"]},
                "backends": [{"name": "vllm-0", "url": url}],
            }
        ],
        "upstream": {"health": {"interval_s": 0.5}},
        "routing": {"scrape_interval_s": 0},
        "redis": {"url": redis_url},
        "auth": {"jwt": {"secret": SECRET}},
        "limits": {"tiers": {"default": {}}, **limits},
    }


def start_all(gateways: list[GatewayProcess]) -> None:
    with concurrent.futures.ThreadPoolExecutor(len(gateways)) as pool:
        list(pool.map(lambda g: g.start(), gateways))


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    # 20 ms between tokens: a 150-token stream lasts 3 s, longer than it takes to decide 200 requests
    with fast_sim("vllm", "--itl-ms", "20") as s:
        yield s


class Outcome:
    def __init__(self, status: int, headers: dict[str, str], decided: float) -> None:
        self.status = status
        self.headers = {k.lower(): v for k, v in headers.items()}
        self.decided = decided  # when the status line arrived
        self.ended = decided
        self.body = b""
        self.usage: dict[str, Any] | None = None


async def _burst(gateways: list[GatewayProcess], n: int, b: dict[str, Any]) -> list[Outcome]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(i: int) -> Outcome:
            url = gateways[i % len(gateways)].base_url + "/v1/chat/completions"
            async with session.post(url, json=b, headers=bearer(f"user-{i}", tenant="acme")) as r:
                out = Outcome(r.status, dict(r.headers), time.monotonic())
                out.body = await r.read()
                out.ended = time.monotonic()
            if out.status == 200:
                for line in out.body.split(b"\n"):
                    if line.startswith(b"data: {") and b'"usage":{' in line:
                        event = orjson.loads(line[6:])
                        if event.get("usage"):
                            out.usage = event["usage"]
            return out

        return list(await asyncio.gather(*(one(i) for i in range(n))))


def test_money_budget_exact_across_three_gateways(sim: SimProcess, redis_server: RedisServer) -> None:
    redis_sync.Redis.from_url(redis_server.url).flushdb()
    each = reserved_nanos(body())
    budget = N * each + each - 1  # N reservations fit, N + 1 do not
    limits = {"tenants": {"acme": {"budgets": [{"period": "month", "usd": f"{budget / 10**9:.9f}"}]}}}
    gateways = [GatewayProcess(budget_config(sim.base_url, redis_server.url, **limits)) for _ in range(3)]
    try:
        start_all(gateways)
        outcomes = asyncio.run(_burst(gateways, 200, body()))
        admitted = [o for o in outcomes if o.status == 200]
        refused = [o for o in outcomes if o.status != 200]
        assert len(admitted) == N, {
            s: [o.status for o in outcomes].count(s) for s in {o.status for o in outcomes}
        }
        # the precondition of "exactly N": every decision was taken while all admitted streams ran,
        # so no reconciliation could have freed budget during the burst
        assert max(o.decided for o in outcomes) < min(o.ended for o in admitted)
        for o in refused:
            assert o.status == 429, o.body
            err = orjson.loads(o.body)["error"]
            assert (err["type"], err["code"], err["param"]) == (
                "insufficient_quota",
                "insufficient_quota",
                None,
            )
            assert err["message"].startswith(
                "You exceeded your current quota (tenant acme budget, UTC month: "
            )
            m = re.search(
                r": \$([\d.]+) of \$([\d.]+) used; this request needs up to \$([\d.]+)\)", err["message"]
            )
            assert m is not None, err["message"]
            used, limit, needs = (round(float(g) * 10**9) for g in m.groups())
            assert (used, limit, needs) == (N * each, budget, each)
            assert "The budget resets at " in err["message"] and err["message"].endswith("T00:00:00Z.")
            # the true wait is the end of the UTC month: more than a minute, so the SDK should not retry
            assert int(o.headers["retry-after"]) >= 1 and o.headers["x-should-retry"] == "false"
        usages = [o.usage for o in admitted]
        assert all(u is not None and u["completion_tokens"] == MAX_TOKENS for u in usages)
        actual = sum(cost_nanos(u) for u in usages if u is not None)
        assert actual != N * each  # the reservation was an estimate: reconciliation has work to do
        with httpx.Client(base_url=gateways[1].base_url, timeout=30, headers=ADMIN) as http:

            def month_report() -> dict[str, Any]:
                return dict(http.get("/admin/spend", params={"tenant": "acme", "period": "month"}).json())

            # A request is reconciled by its finalizer, after its response ended (docs/architecture.md):
            # the client can see its stream's end before the gateway, held for seconds on a loaded
            # machine, has reconciled it. Exact once no reservation is left.
            wait_until(
                lambda: month_report()["periods"][0]["reserved"]["usd"] == 0.0,
                timeout=20,
                what="every admitted request reconciled",
            )
            report = month_report()
            month = report["periods"][0]
            assert (report["scope"], report["shared"], month["current"]) == ("tenant", True, True)
            assert round(month["usd"] * 10**9) == actual, (month, actual)
            assert month["requests"] == N and month["reserved"] == {"tokens": 0, "usd": 0.0}
            tokens = sum(u["total_tokens"] for u in usages if u is not None)
            assert month["tokens"] == tokens and month["models"][MODEL]["requests"] == N
            [view] = month["budgets"]
            assert round(view["limit"] * 10**9) == budget and round(view["used"] * 10**9) == actual
            # a user of the tenant has their own ledger: one request each
            one = http.get("/admin/spend", params={"user": "user-0", "tenant": "acme"}).json()
            assert one["scope"] == "user" and one["tier"] == "default"
            assert sum(p["requests"] for p in one["periods"]) in (0, 2)  # day + month, if admitted
            metrics = http.get("/metrics").text
        assert 'gateway_budget_rejections_total{period="month",scope="tenant"}' in metrics
        # the money metric, summed over the replicas as Prometheus would, is the reconciled spend
        pattern = r'^gateway_spend_usd_total\{model="test-model",pool="vllm"\} (\S+)$'
        spent = 0.0
        for g in gateways:
            found = re.search(pattern, HTTP.get(g.base_url + "/metrics", timeout=10).text, re.M)
            spent += float(found.group(1)) if found else 0.0
        assert abs(spent - actual / 10**9) < 10**-9 * N, (spent, actual)
        assert "user-0" not in metrics  # no per-user labels
    finally:
        for g in gateways:
            g.stop()


@pytest.fixture(scope="module")
def gw(sim: SimProcess, redis_server: RedisServer) -> Iterator[GatewayProcess]:
    limits = {
        "tiers": {
            "default": {},
            "hourly": {"budgets": [{"period": "rolling", "window_s": 60, "tokens": 500}]},
            "rpm": {"requests_per_minute": 1000},
            "tpm": {"tokens_per_minute": 10**6},
        }
    }
    with GatewayProcess(budget_config(sim.base_url, redis_server.url, **limits)) as g:
        yield g


def test_api_key_token_budget_created_raised_and_audited(gw: GatewayProcess) -> None:
    with httpx.Client(base_url=gw.base_url, timeout=30, headers=ADMIN) as http:
        b = body(stream=False, max_tokens=20)
        each = extract_features(b).prompt_tokens + 20
        created = http.post(
            "/admin/api-keys",
            json={"user": "svc-budget", "budgets": [{"period": "day", "tokens": 2 * each + each // 2}]},
        )
        assert created.status_code == 201, created.text
        record = created.json()
        assert record["budgets"] == [{"period": "day", "tokens": 2 * each + each // 2}]
        client = openai.OpenAI(base_url=gw.base_url + "/v1", api_key=record["key"], max_retries=0)
        sdk = {**{k: v for k, v in b.items() if k != "ignore_eos"}, "extra_body": {"ignore_eos": True}}
        # requests pass while their reservation fits; once reconciled to their real usage, more may
        used = 0
        while True:
            try:
                answer = client.chat.completions.create(**sdk)
            except openai.RateLimitError as exc:
                refusal = exc
                break
            assert answer.usage is not None
            used += answer.usage.total_tokens
            assert used <= 3 * each, "the budget let through more than it holds"
        assert refusal.code == "insufficient_quota" and refusal.type == "insufficient_quota"
        assert f"API key {record['id']} budget, UTC day" in refusal.message
        headers = refusal.response.headers
        midnight = (int(time.time()) // 86400 + 1) * 86400
        assert abs(int(headers["retry-after"]) - (midnight - time.time())) <= 5
        report = http.get("/admin/spend", params={"key": record["id"], "period": "day"}).json()
        day = report["periods"][0]
        assert (report["scope"], day["tokens"], day["reserved"]["tokens"]) == ("key", used, 0)
        # (the real prompt may be longer than the estimate the reservation used: requests admitted
        # while the budget had room can end a little past it; none is admitted after it is spent)
        assert day["budgets"][0]["used"] == used
        assert day["budgets"][0]["remaining"] == max(0, 2 * each + each // 2 - used)

        raised = http.put(
            f"/admin/api-keys/{record['id']}", json={"budgets": [{"period": "day", "tokens": 10**6}]}
        )
        assert raised.status_code == 200, raised.text
        assert client.chat.completions.create(**sdk).usage is not None  # at once on this replica
        entry = http.get("/admin/audit?limit=1").json()["entries"][0]
        assert (entry["action"], entry["target"]) == ("change_api_key", record["id"])
        assert entry["before"]["budgets"] == [{"period": "day", "tokens": 2 * each + each // 2}]
        assert entry["after"]["budgets"] == [{"period": "day", "tokens": 10**6}]

        # a key whose budget is smaller than one request: never passes, so no retry-after at all
        tiny = http.post(
            "/admin/api-keys", json={"user": "svc-tiny", "budgets": [{"period": "month", "usd": 0.000001}]}
        )
        r = HTTP.post(
            gw.base_url + "/v1/chat/completions",
            json=b,
            headers={"authorization": "Bearer " + tiny.json()["key"]},
        )
        assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"
        assert "retry-after" not in r.headers and r.headers["x-should-retry"] == "false"
        assert "this request alone needs up to $" in r.json()["error"]["message"]
        for bad in ({"period": "week", "usd": 1}, {"period": "rolling", "usd": 1}, {"period": "day"}):
            refused = http.post("/admin/api-keys", json={"user": "x", "budgets": [bad]})
            assert refused.status_code == 400, refused.text


def test_rolling_budget_says_truly_when_it_frees(gw: GatewayProcess) -> None:
    headers = bearer("roller", tier="hourly")
    b = body(stream=False, max_tokens=100)
    seen = []
    with httpx.Client(base_url=gw.base_url, timeout=30, headers=headers) as http:
        for _ in range(10):
            r = http.post("/v1/chat/completions", json=b)
            seen.append(r.status_code)
            if r.status_code == 429:
                break
        assert seen[-1] == 429 and seen.count(200) >= 1, seen
        err = r.json()["error"]
        assert err["code"] == "insufficient_quota" and "user roller budget, rolling 1m" in err["message"]
        # the oldest admission leaves the 60 s window less than 60 s from now: that is the true wait
        assert 1 <= int(r.headers["retry-after"]) <= 60 and "x-should-retry" not in r.headers
        assert int(r.headers["retry-after-ms"]) <= 60_000


def test_spend_is_recorded_where_it_costs_no_extra_round_trip(
    gw: GatewayProcess, redis_server: RedisServer
) -> None:
    r = redis_sync.Redis.from_url(redis_server.url)
    b = body(stream=False, max_tokens=5)
    with httpx.Client(base_url=gw.base_url, timeout=30) as http:
        for user, tier in (("only-rpm", "rpm"), ("with-tpm", "tpm")):
            assert (
                http.post("/v1/chat/completions", json=b, headers=bearer(user, tier=tier)).status_code == 200
            )
        # a tokens/min limit is reconciled after the response anyway: its spend rides in that call
        tracked = http.get("/admin/spend", params={"user": "with-tpm", "tier": "tpm"}, headers=ADMIN).json()
        assert [p["requests"] for p in tracked["periods"]] == [1, 1]
        # requests/min needs no call after the response: recording it would add one, so it is not
        untracked = http.get("/admin/spend", params={"user": "only-rpm", "tier": "rpm"}, headers=ADMIN).json()
        assert [p["requests"] for p in untracked["periods"]] == [0, 0]
    assert r.keys("gw:sp:{u:only-rpm}*") == [] and r.keys("gw:sp:{u:with-tpm}*")


def test_a_key_budget_holds_without_any_configured_limit(sim: SimProcess, redis_server: RedisServer) -> None:
    config = budget_config(sim.base_url, redis_server.url)
    with GatewayProcess(config) as g, httpx.Client(base_url=g.base_url, timeout=30) as http:
        budgets = [{"period": "month", "tokens": 1}]
        key = http.post("/admin/api-keys", json={"user": "lone", "budgets": budgets}, headers=ADMIN).json()[
            "key"
        ]
        r = http.post(
            "/v1/chat/completions", json=body(stream=False), headers={"authorization": "Bearer " + key}
        )
        assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"
        # a principal with neither a budget nor a limit is served as before
        free = http.post(
            "/v1/chat/completions", json=body(stream=False, max_tokens=2), headers=bearer("free")
        )
        assert free.status_code == 200 and "x-ratelimit-limit-requests" not in free.headers


def test_budgets_survive_a_gateway_restart(sim: SimProcess, redis_server: RedisServer) -> None:
    limits = {"tiers": {"default": {}, "capped": {"budgets": [{"period": "month", "tokens": 400}]}}}
    headers = bearer("restarted", tier="capped")
    b = body(stream=False, max_tokens=100)
    config = budget_config(sim.base_url, redis_server.url, **limits)
    statuses = []
    with GatewayProcess(config) as first:
        while not statuses or statuses[-1] == 200:
            statuses.append(
                HTTP.post(first.base_url + "/v1/chat/completions", json=b, headers=headers).status_code
            )
    assert statuses[-1] == 429 and statuses.count(200) >= 1
    with GatewayProcess(config) as second:
        again = HTTP.post(second.base_url + "/v1/chat/completions", json=b, headers=headers)
        assert again.status_code == 429 and again.json()["error"]["code"] == "insufficient_quota"


def test_budget_checks_follow_on_redis_error(sim: SimProcess) -> None:
    own = RedisServer().start()
    limits = {
        "tiers": {"default": {"budgets": [{"period": "day", "usd": 100}]}},
        "on_redis_error": "fail_closed",
    }
    try:
        with GatewayProcess(budget_config(sim.base_url, own.url, **limits)) as g:
            headers = bearer("outage-user")
            b = body(stream=False, max_tokens=5)
            assert HTTP.post(g.base_url + "/v1/chat/completions", json=b, headers=headers).status_code == 200
            own.stop()
            down = HTTP.post(g.base_url + "/v1/chat/completions", json=b, headers=headers)
            assert down.status_code == 503 and down.json()["error"]["code"] == "rate_limiter_unavailable"
            spend = HTTP.get(g.base_url + "/admin/spend", params={"user": "outage-user"}, headers=ADMIN)
            assert spend.status_code == 503 and spend.json()["error"]["type"] == "server_error"
    finally:
        own.stop()
