"""Micro-benchmark: what the fleet's size costs the gateway per request, CPU.

    python -m bench.fleet_cpu [--backends 1 --backends 8 --backends 32] [--seconds 4]
                              [--concurrency 16] [--rounds 3] [--groups 64] [--baseline REF ...]

Every request takes a snapshot of the fleet (a view per backend) and, with the routing processes'
shared state, adds the other processes' in-flight counts to it; prefix affinity then scores each
backend of the chosen pool. So the gateway's CPU per request grows with the number of backends. Here
one `--fast` vLLM-dialect simulator (16 output tokens) is listed N times as N backends of one pool (the
gateway cannot tell: each backend is probed, scraped and routed to as its own), and a gateway runs the
full pipeline in front of it: JWT auth, a per-user limit in Redis, prefix affinity (the default), two
workers sharing their in-flight counts and placements through that Redis (docs/routing.md, *Shared
load*). Load: wrk at `--concurrency` for `--seconds` a point after a one-second warm-up, `--groups`
bodies in turn, each with a ~6,000-character system prompt of its own (a prefix group: placed once,
through the store, then routed to its holder; every process reports working sets on the backends
holding its groups, which the others read back with every request); the figure is the gateway's
process tree's CPU (both workers and the supervisor) per request.

Each `--baseline REF` adds a gateway built from that git ref (a `git archive` snapshot, its policies
compiled there on first use) for each N: differences are what changed since REF. Rounds start fresh gateway processes and rotate the order.
A benchmark, not a test: it asserts nothing about time (it fails only if requests fail).
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
from typing import Any

import orjson

from bench import machine
from bench.load import run_wrk, write_wrk_script
from bench.procs import Service, free_port, tree_cpu
from bench.targets import (
    GENEROUS,
    JWT_SECRET,
    MODEL,
    GatewaySource,
    bench_token,
    gateway_config,
    gateway_service,
    gateway_source,
)
from gateway.demo import sim_flags

PROMPT = "Write a short note about the weather in Lisbon today, please."
WORDS = ("cache", "engine", "router", "token", "prefix", "batch", "queue", "model", "block", "answer")


def bodies(groups: int) -> list[bytes]:
    """`groups` requests, each with a system prompt of its own long enough to make a prefix group
    (~6,000 characters: prefix affinity places each group, the store shares the placements and every
    process reports working sets), sent in turn."""
    out = []
    for g in range(groups):
        rng = random.Random(g)
        system = " ".join(f"{rng.choice(WORDS)}{rng.randrange(1000)}" for _ in range(900))
        messages = [{"role": "system", "content": system}, {"role": "user", "content": PROMPT}]
        out.append(orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 16}))
    return out


def measure(gw: Service, script: Any, seconds: float, concurrency: int) -> float:
    """The gateway tree's CPU µs per request over one wrk run (after a warm-up)."""
    url = gw.base_url + "/v1/chat/completions"
    run_wrk(url, script, concurrency, 1)
    before = tree_cpu(gw.pid)
    r = run_wrk(url, script, concurrency, seconds)
    after = tree_cpu(gw.pid)
    if r.errors or not r.requests:
        raise RuntimeError(f"{r.errors} of {r.requests} requests failed")
    return (after - before) * 1e6 / r.requests


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet_cpu", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--backends", type=int, action="append", help="backends in the pool (repeatable; 1, 8, 32)"
    )
    ap.add_argument("--seconds", type=float, default=4.0, help="wrk's duration per point")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", action="append", help="also a gateway of this git ref (repeatable)")
    ap.add_argument("--groups", type=int, default=64, help="distinct prefix groups sent in turn")
    a = ap.parse_args(argv)
    sizes = a.backends or [1, 8, 32]
    from tests.support import RedisServer

    m = machine.describe([])
    sources: dict[str, GatewaySource | None] = {"this tree": None}
    for ref in a.baseline or []:
        base = sources[ref] = gateway_source(ref)
        if not (base.path / "policies" / "_native").exists():  # its policies compiled, as this tree's
            subprocess.run([sys.executable, "scripts/build_policies.py"], cwd=base.path, check=True)
    sim_port = free_port()
    sim_argv = [
        sys.executable, "-m", "engines.sim", "--engine", "vllm", "--port", str(sim_port), *sim_flags("vllm"),
        "--fast", "--min-output-tokens", "128", "--max-output-tokens", "128", "--request-log-size", "1",
    ]  # fmt: skip
    script = write_wrk_script("fleet-cpu", bodies(a.groups), {"authorization": f"Bearer {bench_token()}"})
    points = [(name, n) for n in sizes for name in sources]
    cpu: dict[tuple[str, int], list[float]] = {p: [] for p in points}
    with Service("fleet-cpu-sim", sim_argv, sim_port), RedisServer() as redis:
        sim_url = f"http://127.0.0.1:{sim_port}"
        for r in range(a.rounds):
            shift = r % len(points)
            for name, n in points[shift:] + points[:shift]:
                sections: dict[str, Any] = {
                    "auth": {"jwt": {"secret": JWT_SECRET}},
                    "limits": {"tiers": {"default": GENEROUS}},
                    "redis": {"url": redis.url},
                }
                cfg = gateway_config("vllm", [sim_url] * n, workers=2, **sections)
                label = f"fleet-cpu-{n}-{name.replace(' ', '-')}"
                with gateway_service(label, cfg, sources[name]) as gw:
                    cpu[(name, n)].append(measure(gw, script, a.seconds, a.concurrency))
    print(machine.run_line(m))
    print(
        f"wrk {a.seconds:g} s per point at concurrency {a.concurrency}, {a.rounds} rounds (median, "
        f"lowest–highest round in brackets); full pipeline, 2 workers sharing their routing state "
        f"through Redis; {a.groups} prefix groups in turn; one simulator listed as N backends; gateway "
        "process tree CPU µs per request\n"
    )
    print("| backends | " + " | ".join(sources) + " |")
    print("|---:|" + "---:|" * len(sources))
    for n in sizes:
        cells = []
        for name in sources:
            xs = cpu[(name, n)]
            cells.append(f"{statistics.median(xs):.0f} ({min(xs):.0f}–{max(xs):.0f})")
        print(f"| {n} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
