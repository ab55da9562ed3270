"""A streaming load client, run as its own process so its CPU is not charged to (or stolen from) the harness.

    python -m bench.streamclient --url URL --body-file F [--header K:V] (--duration S --concurrency C | --hold N)

Duration mode: C workers each open a stream, read it to the end, and start the next, until S seconds
have passed; prints one JSON line with the time to first chunk (first body bytes) and the total time of
every completed stream (µs, sorted), SSE events per stream, errors, and this process's CPU seconds.

Hold mode: opens N streams at once; when every one has its first chunk (or failed) it prints
`READY {json}` and flushes, so the caller can sample memory with N streams open; then it reads them all
to the end and prints the final JSON line. aiohttp on uvloop, unlimited connections, keep-alive.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time

import aiohttp
import orjson
import uvloop


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Stats:
    def __init__(self) -> None:
        self.ttfc: list[float] = []
        self.total: list[float] = []
        self.events: list[int] = []
        self.errors = 0
        self.error_kinds: dict[str, int] = {}

    def fail(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


async def one_stream(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    stats: Stats,
    on_first: asyncio.Event | None = None,
) -> None:
    t0 = time.perf_counter()
    first = 0.0
    events = 0
    try:
        async with session.post(url, data=body, headers=headers) as r:
            if r.status != 200:
                await r.read()
                stats.fail(f"status {r.status}")
                return
            async for chunk in r.content.iter_any():
                if not first:
                    first = time.perf_counter()
                    if on_first is not None:
                        on_first.set()
                events += chunk.count(b"data:")
        end = time.perf_counter()
    except (TimeoutError, aiohttp.ClientError, OSError) as e:
        stats.fail(type(e).__name__)
        return
    finally:
        if on_first is not None:
            on_first.set()
    if not first:
        stats.fail("empty")
        return
    stats.ttfc.append((first - t0) * 1e6)
    stats.total.append((end - t0) * 1e6)
    stats.events.append(events)


def summary(stats: Stats, wall: float, cpu0: float) -> dict[str, object]:
    return {
        "completed": len(stats.total),
        "errors": stats.errors,
        "error_kinds": stats.error_kinds,
        "ttfc_us": sorted(stats.ttfc),
        "total_us": sorted(stats.total),
        "events_per_stream": (sum(stats.events) / len(stats.events)) if stats.events else 0.0,
        "wall_s": wall,
        "client_cpu_s": _cpu() - cpu0,
    }


async def run_duration(url: str, body: bytes, headers: dict[str, str], conc: int, duration: float) -> None:
    stats = Stats()
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120)
    cpu0, t0 = _cpu(), time.perf_counter()
    deadline = t0 + duration
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:

        async def worker() -> None:
            while time.perf_counter() < deadline:
                await one_stream(session, url, body, headers, stats)

        await asyncio.gather(*(worker() for _ in range(conc)))
    print(orjson.dumps(summary(stats, time.perf_counter() - t0, cpu0)).decode(), flush=True)


async def run_hold(url: str, body: bytes, headers: dict[str, str], n: int) -> None:
    stats = Stats()
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)
    cpu0, t0 = _cpu(), time.perf_counter()
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        firsts = [asyncio.Event() for _ in range(n)]
        tasks = [asyncio.create_task(one_stream(session, url, body, headers, stats, ev)) for ev in firsts]
        await asyncio.gather(*(ev.wait() for ev in firsts))
        ready = {"open_s": time.perf_counter() - t0, "errors_so_far": stats.errors}
        print("READY " + orjson.dumps(ready).decode(), flush=True)
        await asyncio.gather(*tasks)
    print(orjson.dumps(summary(stats, time.perf_counter() - t0, cpu0)).decode(), flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.streamclient")
    ap.add_argument("--url", required=True)
    ap.add_argument("--body-file", required=True)
    ap.add_argument("--header", action="append", default=[], help="Name: value")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--hold", type=int, default=0, help="open this many streams at once instead")
    a = ap.parse_args(argv)
    with open(a.body_file, "rb") as f:
        body = f.read()
    headers = {"content-type": "application/json"}
    for h in a.header:
        k, _, v = h.partition(":")
        headers[k.strip()] = v.strip()
    uvloop.install()
    if a.hold:
        asyncio.run(run_hold(a.url, body, headers, a.hold))
    else:
        asyncio.run(run_duration(a.url, body, headers, a.concurrency, a.duration))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
