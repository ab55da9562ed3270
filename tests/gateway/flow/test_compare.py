"""The engine comparison's recorder on an injected clock: what a finished request counts, the minutes
a window adds up, the fleet's view through Redis (a fake with an outage switch), and the report."""

from __future__ import annotations

from typing import Any

import pytest

from engines.base import Usage
from gateway.core.context import RequestContext
from gateway.core.fleet import Fleet
from gateway.flow.compare import (
    FLUSH_S,
    KEY_PREFIX,
    MAX_WINDOW_S,
    MIN_WINDOW_S,
    RETENTION_S,
    EngineStats,
    failed,
    report,
)
from gateway.settings import HealthSettings, ModelSettings, PoolSettings
from policies.engine_compare import MIN_SAMPLES, bucket_of, bucket_value
from policies.features import extract_features
from tests.gateway.flow.fake_redis import FakeRedis

MODEL = ModelSettings(name="m")
PLAIN = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
TOOLS = {**PLAIN, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}


def fleet() -> Fleet:
    pools = [
        PoolSettings.model_validate(
            {"name": name, "dialect": name, "models": {"m": "served"}, "backends": []}
        )
        for name in ("vllm", "sglang")
    ]
    return Fleet(pools, HealthSettings(), stale_s=10)


FLEET = fleet()


class Clock:
    def __init__(self, now: float = 6_000_030.0) -> None:  # 30 s into a minute
        self.now = now

    def __call__(self) -> float:
        return self.now


async def _receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


def request(
    pool: str = "vllm",
    *,
    ttft: float | None = 0.02,
    duration: float = 0.5,
    tokens: int = 11,
    kind: str | None = None,
    status: int = 200,
    body: dict[str, Any] = PLAIN,
    endpoint: str = "chat",
    attempts: int = 1,
    stream: bool = True,
) -> tuple[RequestContext, float]:
    """A finished request that arrived at perf time 100, and the time its answer ended."""
    ctx = RequestContext(request_id="r", endpoint=endpoint, started=100.0, headers={}, receive=_receive)  # type: ignore[arg-type]
    ctx.pool = FLEET.pools[pool]
    ctx.model = MODEL
    ctx.attempts = attempts
    ctx.stream = stream
    ctx.extras["features"] = extract_features(body)
    ctx.usage = Usage(prompt_tokens=5, completion_tokens=tokens)
    ctx.first_token_at = None if ttft is None else 100.0 + ttft
    ctx.error_kind = kind
    ctx.status = status
    return ctx, 100.0 + duration


def rows_by(body: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(r["model"], r["pool"], r["traffic_class"]): r for r in body["rows"]}


async def test_a_streamed_request_counts_its_ttft_tpot_tokens_and_class() -> None:
    stats = EngineStats(Clock())
    stats.record(*request(ttft=0.02, duration=0.52, tokens=11))  # 10 tokens after the first in 0.5 s
    stats.record(*request(body=TOOLS, ttft=None, tokens=7))  # not streamed: no latency sample
    window = await stats.window(900)
    assert window.scope == "replica" and "No Redis" in (window.note or "")
    plain = window.series[("m", "vllm", "plain")]
    assert (plain.requests, plain.errors, plain.output_tokens) == (1, 0, 11)
    assert plain.ttft == {bucket_of(0.02): 1} and plain.tpot == {bucket_of(0.05): 1}
    tools = window.series[("m", "vllm", "tools")]
    assert (tools.requests, tools.output_tokens, tools.ttft, tools.tpot) == (1, 7, {}, {})


async def test_only_requests_that_reached_an_engine_for_a_generation_count() -> None:
    stats = EngineStats(Clock())
    stats.record(*request(attempts=0, status=429))  # refused by a limit: no engine
    stats.record(*request(endpoint="embeddings"))
    ctx, end = request()
    ctx.pool = None
    stats.record(ctx, end)
    assert (await stats.window(900)).series == {}


@pytest.mark.parametrize(
    ("kind", "status", "is_failure"),
    [
        (None, 200, False),
        ("engine_500", 500, True),
        ("engine_503", 503, True),
        ("engine_400", 400, False),  # the client's request
        ("engine_error", 400, False),  # an error event that is the client's fault
        ("engine_error", 200, True),  # an error event that cut the stream
        ("upstream_broken", 200, True),
        ("idle_timeout", 200, True),
        ("upstream_timeout", 504, True),
        ("upstream_exhausted", 503, True),
        ("engine_bad_response", 502, True),
        ("client_disconnect", 200, False),
        ("client_disconnect", 499, False),
    ],
)
def test_failures_are_the_engines_and_the_upstreams_not_the_clients(
    kind: str | None, status: int, is_failure: bool
) -> None:
    assert failed(kind, status) is is_failure


async def test_a_window_adds_up_the_whole_minutes_it_touches() -> None:
    clock = Clock()
    stats = EngineStats(clock)
    stats.record(*request())  # minute 0 (30 s in)
    clock.now += 120  # minute 2
    stats.record(*request())
    stats.record(*request(kind="engine_500", status=500))
    await stats.flush()
    assert (await stats.window(60)).series[("m", "vllm", "plain")].requests == 2
    w = await stats.window(180)
    assert w.series[("m", "vllm", "plain")].requests == 3
    assert w.series[("m", "vllm", "plain")].errors == 1
    assert w.span_s == pytest.approx(210.0)  # from the start of minute -1 to 30 s into minute 2
    assert (await stats.window(900, model="other")).series == {}


async def test_minutes_older_than_the_retention_are_dropped() -> None:
    clock = Clock()
    stats = EngineStats(clock)
    stats.record(*request())
    await stats.flush()
    clock.now += RETENTION_S + 60
    stats.record(*request())
    await stats.flush()
    assert len(stats._minutes) == 1  # the memory bound: one minute left
    assert (await stats.window(MAX_WINDOW_S)).series[("m", "vllm", "plain")].requests == 1


async def test_replicas_share_their_counts_through_redis_flushed_in_batches() -> None:
    redis = FakeRedis()
    clock = Clock()
    a, b = EngineStats(clock), EngineStats(clock)
    a._redis = b._redis = redis  # bound as `start` does, without its flush task
    for _ in range(3):
        a.record(*request("vllm", ttft=0.01))
    b.record(*request("sglang", ttft=0.04))
    assert redis.round_trips == 0  # recording does no I/O
    await a.flush()
    await b.flush()
    assert redis.round_trips == 2  # one pipelined round trip a flush
    b.record(*request("sglang", ttft=0.04))  # not flushed yet: counted by b's reads
    seen = await b.window(900)
    assert seen.scope == "fleet" and seen.note is None
    assert seen.series[("m", "vllm", "plain")].requests == 3
    assert seen.series[("m", "sglang", "plain")].requests == 2
    assert seen.series[("m", "vllm", "plain")].ttft == {bucket_of(0.01): 3}
    key = f"{KEY_PREFIX}{int(clock.now // 60)}"
    assert redis.ttls[key] == RETENTION_S


async def test_counts_wait_out_a_redis_outage_and_reads_fall_back_to_this_replica() -> None:
    redis = FakeRedis()
    stats = EngineStats(Clock())
    stats._redis = redis
    stats.record(*request())
    redis.down = True
    await stats.flush()  # kept
    stats.record(*request())
    seen = await stats.window(900)
    assert seen.scope == "replica" and "unreachable" in (seen.note or "")
    assert seen.series[("m", "vllm", "plain")].requests == 2
    redis.down = False
    await stats.flush()
    assert not stats._unsent
    reader = EngineStats(Clock())
    reader._redis = redis
    assert (await reader.window(900)).series[("m", "vllm", "plain")].requests == 2


async def test_the_report_rows_and_which_pool_serves_a_class_better() -> None:
    clock = Clock()
    stats = EngineStats(clock)
    n = MIN_SAMPLES + 10
    for i in range(n):
        stats.record(*request("vllm", ttft=0.010, duration=1.0, tokens=5))
        stats.record(
            *request("sglang", ttft=0.050, duration=1.0, tokens=5, kind="engine_500" if i < 2 else None)
        )
        stats.record(*request("sglang", body=TOOLS, ttft=0.05))  # tools: sglang only, no verdict
    body = report(await stats.window(600), {"enabled": False})
    assert body["window_s"] == 600 and body["span_s"] == 630.0 and body["scope"] == "replica"
    assert body["min_samples"] == MIN_SAMPLES and body["rebalance"] == {"enabled": False}
    rows = rows_by(body)
    fast, slow = rows[("m", "vllm", "plain")], rows[("m", "sglang", "plain")]
    assert fast["requests"] == n and fast["errors"] == 0 and slow["errors"] == 2
    assert slow["error_rate"] == round(2 / n, 4)
    assert fast["ttft_p50_s"] == fast["ttft_p99_s"] == round(bucket_value(bucket_of(0.01)), 6)
    assert fast["output_tokens"] == 5 * n
    assert fast["output_tokens_per_s"] == round(5 * n / 630.0, 3)
    assert fast["tpot_p90_s"] == round(bucket_value(bucket_of(0.99 / 4)), 6)
    assert ("m", "sglang", "tools") in rows and [r["traffic_class"] for r in body["rows"]][:2] == [
        "tools",
        "plain",
    ]
    (verdict,) = body["better"]
    assert verdict["model"] == "m" and verdict["traffic_class"] == "plain"
    assert (verdict["better"], verdict["worse"], verdict["by"]) == ("vllm", "sglang", "ttft_p90")
    assert 4.5 < verdict["ratio"] < 5.5


async def test_goodput_counts_the_streamed_answers_that_met_their_ttft_target() -> None:
    redis = FakeRedis()
    target = {"vllm": 0.1, "sglang": None}  # no target: not counted
    stats = EngineStats(Clock(), ttft_target=lambda ctx: target[ctx.pool.name if ctx.pool else ""])
    stats._redis = redis
    stats.record(*request(ttft=0.05, tokens=11))  # met
    stats.record(*request(ttft=0.1, tokens=3))  # met, just
    stats.record(*request(ttft=0.2, tokens=5))  # missed
    stats.record(*request(ttft=0.05, tokens=7, kind="upstream_broken"))  # cut: missed
    stats.record(*request(ttft=None, tokens=2, kind="upstream_timeout", status=504))  # no first token
    stats.record(*request(ttft=None, stream=False))  # not streamed: no TTFT to hold to the target
    stats.record(*request("sglang", ttft=0.05))
    await stats.flush()
    reader = EngineStats(Clock())  # another replica, reading through Redis
    reader._redis = redis
    window = await reader.window(900)
    s = window.series[("m", "vllm", "plain")]
    assert (s.requests, s.targeted, s.met, s.good_tokens) == (6, 5, 2, 14)
    assert window.series[("m", "sglang", "plain")].targeted == 0
    rows = rows_by(report(window, {"enabled": False}))
    row = rows[("m", "vllm", "plain")]
    assert (row["ttft_target_requests"], row["ttft_target_met"]) == (5, 0.4)
    assert row["goodput_tokens_per_s"] == round(14 / window.span_s, 3)
    assert rows[("m", "sglang", "plain")]["ttft_target_met"] is None


def test_the_admin_routers_window_bounds_are_the_recorders() -> None:
    from gateway.control.admin import engines

    assert (engines.MIN_WINDOW_S, engines.MAX_WINDOW_S) == (MIN_WINDOW_S, MAX_WINDOW_S)
    assert FLUSH_S < MIN_WINDOW_S
