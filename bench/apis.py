"""Micro-benchmark: gateway CPU per request for `/v1/responses` and `/v1/messages` beside chat.

    python -m bench.apis [--requests 400] [--concurrency 8] [--rounds 3] [--baseline REF]

One real gateway process (1 worker, access log off, no auth) in front of one `--fast` vLLM-dialect
simulator whose answers are 128 tokens, capped at 32 by each API's own max-tokens field: the same
prompt and the same output size for every point (32 content chunks when streamed). For each point
— chat, responses, messages; non-streamed and streamed — `--requests` requests at `--concurrency`,
after a warm-up; the gateway's process CPU (utime + stime from /proc) over the requests is the
figure. Rounds rotate the order so drift of a shared machine spreads over all points; the table
shows the median over rounds and each API's ratio to chat in the same mode. `--baseline REF` also
runs chat through a gateway built from that git ref (a `git archive` snapshot), interleaved, to show
what the working tree changed on the chat path itself.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from typing import Any

import httpx

from bench.procs import Service, free_port
from bench.targets import MODEL, gateway_config, gateway_service, gateway_source
from gateway.demo import sim_flags

PROMPT = "Write a short note about the weather in Lisbon today, please."
MAX_TOKENS = 32
APIS = ("chat", "responses", "messages")


def body(api: str, stream: bool) -> tuple[str, dict[str, Any]]:
    if api == "chat":
        return "/v1/chat/completions", {
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": MAX_TOKENS,
            "stream": stream,
        }
    if api == "responses":
        return "/v1/responses", {
            "model": MODEL,
            "input": PROMPT,
            "max_output_tokens": MAX_TOKENS,
            "stream": stream,
        }
    return "/v1/messages", {
        "model": MODEL,
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": stream,
    }


async def _load(base: str, path: str, payload: dict[str, Any], n: int, concurrency: int) -> int:
    """Send `n` requests, `concurrency` at a time; the number that failed."""
    errors = 0
    todo = iter(range(n))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:

        async def worker() -> None:
            nonlocal errors
            for _ in todo:
                r = await client.post(path, json=payload)
                if r.status_code != 200 or not r.content:
                    errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return errors


def measure(gw: Service, api: str, stream: bool, n: int, concurrency: int) -> float:
    """Gateway CPU microseconds per request for one point."""
    path, payload = body(api, stream)
    asyncio.run(_load(gw.base_url, path, payload, max(20, n // 10), concurrency))  # warm-up
    before = gw.cpu()
    errors = asyncio.run(_load(gw.base_url, path, payload, n, concurrency))
    used = gw.cpu() - before
    if errors:
        raise RuntimeError(f"{api} stream={stream}: {errors} of {n} requests failed")
    return used / n * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.apis", description=__doc__)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", default=None, help="also measure chat on this git ref's gateway")
    a = ap.parse_args(argv)
    sim_port = free_port()
    sim_argv = [
        sys.executable,
        "-m",
        "engines.sim",
        "--engine",
        "vllm",
        "--port",
        str(sim_port),
        *sim_flags("vllm"),
        "--fast",
        "--min-output-tokens",
        "128",
        "--max-output-tokens",
        "128",
    ]
    points = [(api, stream) for stream in (False, True) for api in APIS]
    cpu: dict[tuple[str, bool], list[float]] = {p: [] for p in points}
    base: dict[bool, list[float]] = {False: [], True: []}
    sim = Service("apis-sim", sim_argv, sim_port)
    with sim, gateway_service("apis-gw", gateway_config("vllm", [sim.base_url])) as gw:
        old = None
        if a.baseline:
            src = gateway_source(a.baseline)
            old = gateway_service("apis-gw-base", gateway_config("vllm", [sim.base_url]), src).start()
        try:
            for r in range(a.rounds):
                shift = r % len(points)
                for point in points[shift:] + points[:shift]:
                    cpu[point].append(measure(gw, point[0], point[1], a.requests, a.concurrency))
                    if old is not None and point[0] == "chat":
                        base[point[1]].append(measure(old, "chat", point[1], a.requests, a.concurrency))
        finally:
            if old is not None:
                old.stop()
    print(
        f"{a.requests} requests per point at concurrency {a.concurrency}, {a.rounds} rounds (median); "
        f"prompt {len(PROMPT)} characters, {MAX_TOKENS} output tokens; gateway CPU per request\n"
    )
    print("| API | non-streamed µs | ratio to chat | streamed µs | ratio to chat |")
    print("|---|---:|---:|---:|---:|")
    med = {p: statistics.median(v) for p, v in cpu.items()}
    for api in APIS:
        row = [api]
        for stream in (False, True):
            value = med[(api, stream)]
            row += [f"{value:.0f}", f"{value / med[('chat', stream)]:.2f}×"]
        print("| " + " | ".join(row) + " |")
    if a.baseline:
        row = [f"chat at {a.baseline}"]
        for stream in (False, True):
            value = statistics.median(base[stream])
            row += [f"{value:.0f}", f"{value / med[('chat', stream)]:.2f}×"]
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
