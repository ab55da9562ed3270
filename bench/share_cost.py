"""Micro-benchmark: Redis's own CPU per admission and finish call carrying the routing processes' shared
state.

    python -m bench.share_cost [--calls 2000] [--processes 1 --processes 8 ...] [--backends 8 ...]

With shared load (docs/routing.md, *Shared load*) every request's admission and finish is one
`EVALSHA` that rewrites the calling process's figures (in-flight counts, working sets, queued prefill:
three a backend, a JSON object); the admission also reads the other live processes' (returned as
stored, summed by the gateway: gateway/admission/limits_redis.py, `SHARE_LUA`, `_others`), the finish
does not. Here P routing processes report B backends' figures to a real redis-server, then one of
them makes `--calls` admissions, then as many finishes, each call with one backend's in-flight count
and working set changed (`moved`); the figures are Redis's own CPU per call (`INFO commandstats`:
`usec_per_call` of `evalsha`), which the gateway's CPU figures do not include. Redis runs scripts
one at a time, so their sum bounds the fleet's requests per second through one Redis. Beside them,
the gateway's side of an admission's reply: `_others` summing the other processes' figures as the
script returns them (timeit, best of five rounds). A benchmark, not a test: it asserts nothing about
time.
"""

from __future__ import annotations

import argparse
import asyncio
import timeit
from collections.abc import Mapping

import orjson

from bench import machine
from gateway.admission.limits import Ticket
from gateway.admission.limits_redis import RedisLimiter, _others
from gateway.core.context import RequestContext
from gateway.core.redis_client import open_redis
from gateway.core.redis_wire import RespClient
from gateway.core.shared_load import ShareAsk
from policies.shared_load import PREFILL, SETS


class _Process:
    """One routing process's side (`gateway.core.shared_load.LoadShare`) with fixed figures."""

    def __init__(self, name: str, figures: dict[str, int]) -> None:
        self.process = name
        self.lease_s = 30.0
        self.placement_ttl_s = 60.0
        self.figures = figures

    async def ask(self, ctx: RequestContext) -> ShareAsk:
        return ShareAsk(dict(self.figures))

    def told(self, ctx: RequestContext, ask: ShareAsk) -> None:
        pass

    def counts(self) -> Mapping[str, int]:
        return self.figures

    def heard(self, others: Mapping[str, int]) -> None:
        pass


def figures(process: int, backends: int) -> dict[str, int]:
    """What a busy process reports: every backend with requests in flight, a working set and queued
    prefill."""
    out: dict[str, int] = {}
    for b in range(backends):
        out[f"backend-{b}"] = 1 + (b + process) % 3
        out[SETS + f"backend-{b}"] = 2_000 + 37 * b
        out[PREFILL + f"backend-{b}"] = 500 + b
    return out


def moved(base: dict[str, int], i: int, backends: int) -> dict[str, int]:
    """`base` with one backend's in-flight count and working set changed, as between two of a busy
    process's calls (a request routed there, or one that ended)."""
    out = dict(base)
    b = i % backends
    out[f"backend-{b}"] = 1 + i % 4
    out[SETS + f"backend-{b}"] += 64 * (i % 5)
    return out


def gateway_sum_us(processes: int, backends: int, number: int = 2000) -> float:
    """The gateway's CPU (µs) for one admission's reply: `_others` on the other processes' figures,
    each a JSON object as stored (the best of five timeit rounds)."""
    blobs = [orjson.dumps(figures(p, backends)) for p in range(1, processes)]
    return min(timeit.repeat(lambda: _others(blobs), number=number, repeat=5)) / number * 1e6


async def measure(redis_url: str, processes: int, backends: int, calls: int) -> tuple[float, float]:
    """Redis's CPU (µs) per admission and per finish of one of `processes` processes reporting
    `backends` backends."""
    redis = open_redis(redis_url)
    await redis.flushdb()
    limiters: list[tuple[RedisLimiter, _Process]] = []
    try:
        for p in range(processes):
            limiter = RedisLimiter(redis, window_s=60.0, lease_s=30.0, wire=RespClient(redis_url))
            share = _Process(f"process-{p}", figures(p, backends))
            limiter.bind_share(share)
            limiters.append((limiter, share))
        for limiter, share in limiters:  # every process's figures in the store
            await limiter.acquire("warm", (), 10, None, ShareAsk(dict(share.figures)))
        await redis.config_resetstat()
        limiter, share = limiters[0]
        base = share.figures
        for i in range(calls):
            share.figures = moved(base, i, backends)
            await limiter.acquire(f"r{i}", (), 10, None, ShareAsk(dict(share.figures)))
        admission = float((await redis.info("commandstats"))["cmdstat_evalsha"]["usec_per_call"])
        await redis.config_resetstat()
        for i in range(calls):
            share.figures = moved(base, calls + i, backends)
            await limiter.finish(Ticket(f"r{i}", (), 10), 10, None, share=True)
        finish = float((await redis.info("commandstats"))["cmdstat_evalsha"]["usec_per_call"])
        return admission, finish
    finally:
        for limiter, _ in limiters:
            await limiter.aclose()
        await redis.aclose()


def main(argv: list[str] | None = None) -> None:
    from tests.support import RedisServer

    ap = argparse.ArgumentParser(prog="python -m bench.share_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--processes", type=int, action="append", help="routing processes (repeatable)")
    ap.add_argument("--backends", type=int, action="append", help="backends reported (repeatable)")
    args = ap.parse_args(argv)
    counts = args.processes or [1, 2, 4, 8]
    sizes = args.backends or [8, 32]
    m = machine.describe([])
    with RedisServer() as server:
        rows = [
            (p, [(*asyncio.run(measure(server.url, p, b, args.calls)), gateway_sum_us(p, b)) for b in sizes])
            for p in counts
        ]
    print(machine.run_line(m))
    print(
        f"Redis CPU per `EVALSHA` (µs, `INFO commandstats`), {args.calls} admissions then as many finishes"
        " of one process, every process reporting three figures a backend; no limits configured (the"
        " share alone); and the gateway's CPU summing one admission's reply (µs, `_others`)\n"
    )
    print(
        "| processes | "
        + " | ".join(f"{b} backends: Redis admission / finish, gateway sum" for b in sizes)
        + " |"
    )
    print("|---:|" + "---:|" * len(sizes))
    for p, row in rows:
        print(f"| {p} | " + " | ".join(f"{a:.1f} / {f:.1f}, {g:.1f}" for a, f, g in row) + " |")


if __name__ == "__main__":
    main()
