"""Which HTTP client for the upstream hop: aiohttp or httpx? CPU per request, side by side.

Runs one zero-latency vLLM-dialect simulator, then alternates the two clients (several rounds each,
same process, same event loop type) sending the same non-streamed and streamed chat requests at a
fixed concurrency, and reports process CPU time per request (user+sys of this process only: the
simulator is another process). Usage: python -m bench.clients [--requests N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
import orjson
import uvloop

from engines.sim.launcher import SimProcess, free_port

BODY = orjson.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 16}
)
STREAM_BODY = orjson.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 32, "stream": True}
)
HEADERS = {"content-type": "application/json"}


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def run(n: int, conc: int, one: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    sem = asyncio.Semaphore(conc)

    async def task() -> None:
        async with sem:
            await one()

    c0, t0 = cpu(), time.perf_counter()
    await asyncio.gather(*(task() for _ in range(n)))
    return (cpu() - c0) / n * 1e6, n / (time.perf_counter() - t0)


async def main(n: int, conc: int, rounds: int) -> None:
    with SimProcess("vllm", free_port(), ["--model", "m", "--fast"]) as sim:
        url = sim.base_url + "/v1/chat/completions"
        ahttp = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        hx = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=1000))

        async def a_plain() -> None:
            async with ahttp.post(url, data=BODY, headers=HEADERS) as r:
                await r.read()

        async def h_plain() -> None:
            r = await hx.post(url, content=BODY, headers=HEADERS)
            r.read()

        async def a_stream() -> None:
            async with ahttp.post(url, data=STREAM_BODY, headers=HEADERS) as r:
                async for _ in r.content.iter_any():
                    pass

        async def h_stream() -> None:
            async with hx.stream("POST", url, content=STREAM_BODY, headers=HEADERS) as r:
                async for _ in r.aiter_raw():
                    pass

        cases = {
            "aiohttp plain": a_plain,
            "httpx plain": h_plain,
            "aiohttp stream": a_stream,
            "httpx stream": h_stream,
        }
        results: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
        for fn in cases.values():
            await run(200, conc, fn)  # warm-up
        for _ in range(rounds):
            for name, fn in cases.items():
                results[name].append(await run(n, conc, fn))
        await ahttp.close()
        await hx.aclose()
    print(f"| client / case | CPU µs per request (median of {rounds}) | req/s |")
    print("|---|---|---|")
    for name, rows in results.items():
        cpus = sorted(r[0] for r in rows)
        rates = sorted(r[1] for r in rows)
        print(f"| {name} | {cpus[len(cpus) // 2]:.0f} | {rates[len(rates) // 2]:.0f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    uvloop.install()
    asyncio.run(main(a.requests, a.concurrency, a.rounds))
