"""The engine comparison: what each request that reached an engine cost, per model × pool × traffic
class, by the minute; read back over a window as `GET /admin/engines/compare` answers it.

Recorded, once per request when its answer has ended (`EngineStats.record`, called by the root
beside the metrics), for chat and completions requests that reached an engine:
- one request, and whether it failed on the engine's or the upstream's side (an engine error or
  5xx, a stream cut or gone silent, a timeout, every backend refusing; not a 4xx the client caused,
  nor a client that left);
- its output tokens (the engine's usage);
- for a streamed answer, the time to its first token and the time per output token after it (the
  rest of the stream over the tokens after the first). A non-streamed answer arrives whole: its
  first token cannot be told from its last, so it counts in requests, errors and tokens only;
- for a streamed answer to a request with a TTFT target (`ttft_target`, from its priority class),
  whether its first token came within it without the request failing, and then its output tokens
  (goodput).
A request that failed over is counted for the pool that answered it last.

Kept by the minute (wall clock, so every replica's minutes line up), each series a
`policies.engine_compare.Series` (counts and sparse latency histograms): a request costs a few dict
updates and no I/O. Every `FLUSH_S` the new counts are added to this replica's minutes and, with
Redis, to the fleet's in one pipelined round trip: a hash per minute, `gw:{engines}:m:<minute>`
(field `model␟pool␟class␟measure`), expiring after `RETENTION_S`. A read adds the window's minutes
up: from Redis (every replica's) plus what this replica has not sent yet; without Redis, or while
it does not answer, this replica's own minutes, and the answer says so (`scope: "replica"`).
Memory is bounded: `RETENTION_S` of minutes, series only for the configured models and pools, at
most `HIST_MAX_BUCKET` buckets a histogram; counts Redis has not taken are dropped with their minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from redis.exceptions import RedisError

from gateway.core.context import RequestContext
from gateway.core.outage_log import OutageLog
from gateway.core.redis_client import RedisClient
from gateway.core.tasks import cancel_and_wait, stop_requested
from gateway.flow.traffic import TRAFFIC_CLASSES, traffic_class
from policies.engine_compare import (
    MIN_SAMPLES,
    Series,
    Summary,
    Verdict,
    best_of,
    bucket_of,
    class_verdict,
    summarize,
)

log = logging.getLogger("gateway.flow")

#: model, pool, traffic class
SeriesKey = tuple[str, str, str]
#: the TTFT a request was meant to meet, seconds (its priority class's target), or None
TtftTarget = Callable[[RequestContext], float | None]
Minutes = dict[int, dict[SeriesKey, Series]]
Scope = Literal["fleet", "replica"]

MINUTE_S = 60
#: the longest window a read may ask for: an hour of minutes covers an incident and its run-up
MAX_WINDOW_S = 3600
#: the shortest: one minute, the granularity of what is kept
MIN_WINDOW_S = MINUTE_S
#: how long minutes are kept (here and in Redis): the longest window and the minute it starts in
RETENTION_S = MAX_WINDOW_S + 2 * MINUTE_S
#: seconds between two flushes to Redis: a round trip every 5 s a process, and a fleet-wide read
#: misses at most the last 5 s of the other replicas
FLUSH_S = 5.0
KEY_PREFIX = "gw:{engines}:m:"
_SEP = "\x1f"
#: the engine's or the upstream's failures (`RequestContext.error_kind`); `engine_<status>` counts
#: when the status is 5xx
_FAULTS = frozenset(
    {
        "engine_bad_response",
        "idle_timeout",
        "upstream_broken",
        "upstream_exhausted",
        "upstream_timeout",
        "no_backend",
    }
)
_RECORDED = frozenset({"chat", "completions"})


def failed(kind: str | None, status: int) -> bool:
    """A request that reached an engine failed on the engine's or the upstream's side."""
    if kind is None:
        return False
    if kind == "engine_error":  # an error event: before the answer (its status), or cutting it (200)
        return status >= 500 or status == 200
    if kind in _FAULTS:
        return True
    code = kind[7:] if kind.startswith("engine_") else ""
    return code.isdigit() and int(code) >= 500


@dataclass(slots=True)
class Window:
    """The series of a window, added up: `span_s` seconds of whole minutes, the fleet's or this
    replica's (`scope`, with a `note` saying why)."""

    series: dict[SeriesKey, Series]
    window_s: int
    span_s: float
    scope: Scope
    note: str | None = None


class EngineStats:
    """The recorder and its reads (module docstring). `clock` is wall-clock seconds; `ttft_target`
    a request's TTFT target (None: no request has one)."""

    def __init__(self, clock: Callable[[], float] = time.time, ttft_target: TtftTarget | None = None) -> None:
        self._clock = clock
        self._ttft_target = ttft_target
        self._redis: RedisClient | None = None
        #: recorded since the last flush
        self._pending: Minutes = {}
        #: this replica's minutes (the local view), flushed in
        self._minutes: Minutes = {}
        #: flushed in, not in Redis yet (Redis configured)
        self._unsent: Minutes = {}
        self._task: asyncio.Task[None] | None = None
        self._outage = OutageLog(log, "sending the engine comparison's counts to Redis")

    def now(self) -> float:
        """The recorder's clock (wall-clock seconds)."""
        return self._clock()

    # -- recording --------------------------------------------------------------------------------
    def record(self, ctx: RequestContext, now: float) -> None:
        """Count one request whose answer has ended (`now`: `time.perf_counter()`, as `ctx.started`)."""
        pool, model = ctx.pool, ctx.model
        if pool is None or model is None or not ctx.attempts or ctx.endpoint not in _RECORDED:
            return
        features = ctx.extras.get("features")
        if features is None:
            return
        minute = int(self._clock() // MINUTE_S)
        by_key = self._pending.get(minute)
        if by_key is None:
            by_key = self._pending[minute] = {}
        key = (model.name, pool.name, traffic_class(features))
        series = by_key.get(key)
        if series is None:
            series = by_key[key] = Series()
        series.requests += 1
        fault = failed(ctx.error_kind, ctx.status)
        if fault:
            series.errors += 1
        usage = ctx.usage
        tokens = usage.completion_tokens if usage is not None else 0
        series.output_tokens += tokens
        first = ctx.first_token_at
        target = self._ttft_target(ctx) if self._ttft_target is not None and ctx.stream else None
        if target is not None:
            series.targeted += 1
            if first is not None and first - ctx.started <= target and not fault:
                series.met += 1
                series.good_tokens += tokens
        if first is not None:
            index = bucket_of(first - ctx.started)
            series.ttft[index] = series.ttft.get(index, 0) + 1
            if tokens > 1:
                index = bucket_of((now - first) / (tokens - 1))
                series.tpot[index] = series.tpot.get(index, 0) + 1

    # -- flushing ---------------------------------------------------------------------------------
    async def start(self, redis: RedisClient | None) -> None:
        """Flush every `FLUSH_S`, to `redis` when given (else into this replica's minutes only)."""
        self._redis = redis
        self._task = asyncio.create_task(self._run(), name="engine-stats-flush")

    async def stop(self) -> None:
        """Stop flushing; what is recorded goes to Redis once more, within a second."""
        if self._task is not None:
            await cancel_and_wait([self._task], within_s=2.0, what="the engine comparison's flush")
            self._task = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await self.flush()

    async def _run(self) -> None:
        while not stop_requested():
            await asyncio.sleep(FLUSH_S)
            await self.flush()

    async def flush(self) -> None:
        """Add what was recorded to this replica's minutes and send it to Redis (kept for the next
        flush when Redis does not answer); drop minutes older than `RETENTION_S`."""
        pending, self._pending = self._pending, {}
        _add(self._minutes, pending)
        oldest = int((self._clock() - RETENTION_S) // MINUTE_S)
        _prune(self._minutes, oldest)
        redis = self._redis
        if redis is None:
            return
        _add(self._unsent, pending)
        _prune(self._unsent, oldest)
        batch, self._unsent = self._unsent, {}
        if not batch:
            return
        try:
            async with redis.pipeline(transaction=False) as pipe:
                for minute, by_key in batch.items():
                    key = f"{KEY_PREFIX}{minute}"
                    for (model, pool, cls), series in by_key.items():
                        head = f"{model}{_SEP}{pool}{_SEP}{cls}{_SEP}"
                        for measure, n in _fields(series):
                            pipe.hincrby(key, head + measure, n)
                    pipe.expire(key, RETENTION_S)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            self._unsent = batch  # sent with the next flush's counts
            self._outage.failed(exc)
            return
        self._outage.worked()

    # -- reading ----------------------------------------------------------------------------------
    async def window(self, window_s: int, model: str | None = None) -> Window:
        """The series of the last `window_s` seconds (the whole minutes it touches), of `model`
        only when given: the fleet's with Redis, else this replica's (module docstring)."""
        now = self._clock()
        first = int((now - window_s) // MINUTE_S)
        last = int(now // MINUTE_S)
        span = now - first * MINUTE_S
        redis = self._redis
        local = [self._pending] if redis is not None else [self._minutes, self._pending]
        if redis is not None:
            local.append(self._unsent)
            try:
                shared = await self._read(redis, first, last, model)
            except (RedisError, OSError) as exc:
                log.warning("engine comparison: Redis unreachable (%s), answering this replica's view", exc)
                out = _sum([self._minutes, self._pending], first, last, model)
                note = (
                    f"Shared state (Redis) is unreachable ({type(exc).__name__}): these are this "
                    "replica's requests only."
                )
                return Window(out, window_s, span, "replica", note)
            _merge(shared, _sum(local, first, last, model))
            return Window(shared, window_s, span, "fleet")
        note = "No Redis is configured: these are this process's requests only."
        return Window(_sum(local, first, last, model), window_s, span, "replica", note)

    @staticmethod
    async def _read(redis: RedisClient, first: int, last: int, model: str | None) -> dict[SeriesKey, Series]:
        async with redis.pipeline(transaction=False) as pipe:
            for minute in range(first, last + 1):
                pipe.hgetall(f"{KEY_PREFIX}{minute}")
            hashes: list[dict[Any, Any]] = await pipe.execute()
        out: dict[SeriesKey, Series] = {}
        for fields in hashes:
            for raw, value in fields.items():
                name = raw.decode() if isinstance(raw, bytes) else str(raw)
                parts = name.split(_SEP)
                if len(parts) != 4 or (model is not None and parts[0] != model):
                    continue
                key = (parts[0], parts[1], parts[2])
                series = out.get(key)
                if series is None:
                    series = out[key] = Series()
                _count(series, parts[3], int(value))
        return out


#: a series' counters by their Redis hash field (`t<bucket>` / `p<bucket>`: its TTFT / TPOT histograms)
_COUNTERS = {
    "n": "requests",
    "e": "errors",
    "o": "output_tokens",
    "g": "targeted",
    "m": "met",
    "k": "good_tokens",
}


def _fields(series: Series) -> Iterable[tuple[str, int]]:
    """A series as Redis hash fields (measure -> count, counts above 0); `_count` reads them back."""
    for measure, name in _COUNTERS.items():
        if n := getattr(series, name):
            yield measure, n
    for index, n in series.ttft.items():
        yield f"t{index}", n
    for index, n in series.tpot.items():
        yield f"p{index}", n


def _count(series: Series, measure: str, n: int) -> None:
    name = _COUNTERS.get(measure)
    if name is not None:
        setattr(series, name, getattr(series, name) + n)
    elif measure[1:].isdigit():
        into = series.ttft if measure[0] == "t" else series.tpot if measure[0] == "p" else None
        if into is not None:
            index = int(measure[1:])
            into[index] = into.get(index, 0) + n


def _add(into: Minutes, other: Minutes) -> None:
    for minute, by_key in other.items():
        mine = into.get(minute)
        if mine is None:
            mine = into[minute] = {}
        _merge(mine, by_key)


def _merge(into: dict[SeriesKey, Series], other: dict[SeriesKey, Series]) -> None:
    for key, series in other.items():
        have = into.get(key)
        if have is None:
            have = into[key] = Series()
        have.add(series)


def _prune(minutes: Minutes, oldest: int) -> None:
    for minute in [m for m in minutes if m < oldest]:
        del minutes[minute]


def _sum(sources: list[Minutes], first: int, last: int, model: str | None) -> dict[SeriesKey, Series]:
    out: dict[SeriesKey, Series] = {}
    for minutes in sources:
        for minute, by_key in minutes.items():
            if first <= minute <= last:
                _merge(out, {k: s for k, s in by_key.items() if model is None or k[0] == model})
    return out


# -- the answer of GET /admin/engines/compare -----------------------------------------------------
def summaries(series: dict[SeriesKey, Series]) -> dict[str, dict[str, dict[str, Summary]]]:
    """model -> pool -> traffic class -> summary."""
    out: dict[str, dict[str, dict[str, Summary]]] = {}
    for (model, pool, cls), s in series.items():
        out.setdefault(model, {}).setdefault(pool, {})[cls] = summarize(s)
    return out


def report(window: Window, rebalance: dict[str, Any]) -> dict[str, Any]:
    """The comparison's JSON body (docs/operations.md, *Comparing engines*)."""
    figures = summaries(window.series)
    order: dict[str, int] = {c: i for i, c in enumerate(TRAFFIC_CLASSES)}
    rows: list[dict[str, Any]] = []
    better: list[dict[str, Any]] = []
    for model in sorted(figures):
        pools = figures[model]
        for pool in sorted(pools):
            for cls in sorted(pools[pool], key=lambda c: order.get(c, len(order))):
                rows.append(_row(model, pool, cls, pools[pool][cls], window.span_s))
        classes = sorted({c for p in pools.values() for c in p}, key=lambda c: order.get(c, len(order)))
        for cls in classes:
            have = sorted(p for p in pools if cls in pools[p])
            verdicts = [
                v
                for i, a in enumerate(have)
                for b in have[i + 1 :]
                if (v := class_verdict(a, pools[a][cls], b, pools[b][cls], cls)) is not None
            ]
            verdict = best_of(verdicts)
            if verdict is not None:
                better.append({"model": model, "traffic_class": cls, **_verdict(verdict)})
    body: dict[str, Any] = {
        "window_s": window.window_s,
        "span_s": round(window.span_s, 3),
        "scope": window.scope,
        "min_samples": MIN_SAMPLES,
        "rows": rows,
        "better": better,
        "rebalance": rebalance,
    }
    if window.note is not None:
        body["note"] = window.note
    return body


def _row(model: str, pool: str, cls: str, s: Summary, span_s: float) -> dict[str, Any]:
    return {
        "model": model,
        "pool": pool,
        "traffic_class": cls,
        "requests": s.requests,
        "errors": s.errors,
        "error_rate": round(s.error_rate, 4),
        "output_tokens": s.output_tokens,
        "output_tokens_per_s": round(s.output_tokens / span_s, 3) if span_s > 0 else 0.0,
        "ttft_samples": s.ttft_samples,
        "ttft_p50_s": _s(s.ttft_p50),
        "ttft_p90_s": _s(s.ttft_p90),
        "ttft_p99_s": _s(s.ttft_p99),
        "tpot_samples": s.tpot_samples,
        "tpot_p50_s": _s(s.tpot_p50),
        "tpot_p90_s": _s(s.tpot_p90),
        "tpot_p99_s": _s(s.tpot_p99),
        "ttft_target_requests": s.targeted,
        "ttft_target_met": None if s.target_met is None else round(s.target_met, 4),
        "goodput_tokens_per_s": round(s.good_tokens / span_s, 3) if span_s > 0 else 0.0,
    }


def _verdict(v: Verdict) -> dict[str, Any]:
    return {
        "better": v.better,
        "worse": v.worse,
        "by": v.measure,
        "better_value": round(v.better_value, 6),
        "worse_value": round(v.worse_value, 6),
        "ratio": round(v.ratio, 3),
        "why": v.why(),
    }


def _s(seconds: float | None) -> float | None:
    return None if seconds is None or math.isnan(seconds) else round(seconds, 6)
