"""The upstream transport against httpx's client: CPU per request, side by side.

Runs one zero-latency vLLM-dialect simulator (`--fast`, another process), then alternates the clients
(same process, uvloop) sending the same non-streamed and streamed chat requests at a fixed
concurrency, and reports this process's CPU time (user+sys, `resource.getrusage`) per request and the
request rate, median over rounds. The gateway's `H1Transport` is driven through the `Transport`
interface the gateway uses (`request` → `read`/`chunks` → `close`); httpx, the general-purpose client
it is measured against, through its own API.

    python -m bench.transports [--requests N] [--concurrency C] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
from collections.abc import Awaitable, Callable

import httpx
import orjson
import uvloop

from engines.sim.launcher import SimProcess, free_port
from gateway.upstream.h1 import H1Transport
from gateway.upstream.transport import Transport

_MESSAGES = [{"role": "user", "content": "hello there"}]
BODY = orjson.dumps({"model": "m", "messages": _MESSAGES, "max_tokens": 16})
STREAM_BODY = orjson.dumps({"model": "m", "messages": _MESSAGES, "max_tokens": 32, "stream": True})
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}

Case = Callable[[], Awaitable[None]]


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def run(n: int, conc: int, one: Case) -> tuple[float, float]:
    """(CPU µs per request, requests per second) for n calls of `one`, `conc` at a time."""

    async def worker(count: int) -> None:
        for _ in range(count):
            await one()

    per, extra = divmod(n, conc)
    c0, t0 = cpu(), time.perf_counter()
    await asyncio.gather(*(worker(per + (i < extra)) for i in range(conc)))
    return (cpu() - c0) / n * 1e6, n / (time.perf_counter() - t0)


def transport_cases(t: Transport, url: str) -> tuple[Case, Case]:
    async def plain() -> None:
        r = await t.request("POST", url, BODY)
        try:
            await r.read()
        finally:
            r.close()

    async def stream() -> None:
        r = await t.request("POST", url, STREAM_BODY)
        try:
            async for _ in r.chunks():
                pass
        finally:
            r.close()

    return plain, stream


def httpx_cases(hx: httpx.AsyncClient, url: str) -> tuple[Case, Case]:
    async def plain() -> None:
        r = await hx.post(url, content=BODY, headers=HEADERS)
        r.read()

    async def stream() -> None:
        async with hx.stream("POST", url, content=STREAM_BODY, headers=HEADERS) as r:
            async for _ in r.aiter_raw():
                pass

    return plain, stream


async def main(n: int, conc: int, rounds: int) -> None:
    with SimProcess("vllm", free_port(), ["--model", "m", "--fast"]) as sim:
        url = sim.base_url + "/v1/chat/completions"
        h1 = H1Transport(connect_timeout_s=2.0)
        hx = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=1000))
        clients = {"h1": transport_cases(h1, url), "httpx": httpx_cases(hx, url)}
        cases = {
            f"{name} {kind}": fns[i]
            for i, kind in enumerate(("plain", "stream"))
            for name, fns in clients.items()
        }
        results: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
        for fn in cases.values():
            await run(min(n, 300), conc, fn)  # warm-up: connections, caches
        for _ in range(rounds):
            for name, fn in cases.items():
                results[name].append(await run(n, conc, fn))
        await h1.aclose()
        await hx.aclose()
    print(f"{n} requests × {rounds} rounds, concurrency {conc}, uvloop; medians\n")
    print("| client / case | CPU µs per request | req/s |")
    print("|---|---|---|")
    for name, rows in results.items():
        cpus = sorted(r[0] for r in rows)
        rates = sorted(r[1] for r in rows)
        print(f"| {name} | {cpus[len(cpus) // 2]:.0f} | {rates[len(rates) // 2]:.0f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    uvloop.install()
    asyncio.run(main(a.requests, a.concurrency, a.rounds))
