"""Micro-benchmark: what tracing costs the gateway, CPU per request, off and on.

    python -m bench.tracing [--seconds 3] [--concurrency 8] [--rounds 3] [--inproc 20000]
                            [--baseline REF]

Configurations:

    off          tracing.enabled false (the default)
    ratio 0      tracing on, sample_ratio 0: nothing recorded, `traceparent` still sent to the engine
    ratio 1      tracing on, every request sampled and exported
    REF          end to end only, with `--baseline REF`: a gateway built from that git ref (a `git
                 archive` snapshot) without any `tracing:` section, e.g. the commit before
                 gateway/observability/tracing.py was added: `off` minus it is what the tracing code
                 costs when disabled (anything else changed since REF counts too)

**In process** first (low noise: no other process on the figure): the tracing work of one request —
`Tracing.begin`, the three stage wrappers, an upstream attempt, the relay span when streamed,
`Tracing.end` — on a real `Tracing` exporting to the receiver (encoded at the end and POSTed in
batches from a task on the event loop), `--inproc` requests in a loop that yields to the export task
every 64, minus the same loop without tracing; process CPU (`time.process_time`: every thread), the
queue flushed before the clock stops.

Then **end to end**: one `--fast` vLLM-dialect simulator (128-token answers, capped at 16 by
`max_tokens`) and a gateway process per configuration, one at a time, all with JWT auth and a
per-user limit (so the authenticate and admit stages run and a sampled request makes all its spans:
request, auth, admit, route, upstream, and relay when streamed), exporting every 0.2 s. Load: wrk at
`--concurrency` for `--seconds` a point, after a warm-up; the figure is the gateway's process CPU
(every thread, from the scheduler's nanosecond counters) read once the receiver holds every span of
the point's requests, and of it the event loop's thread alone. Every round starts a fresh gateway
process for each configuration, so that one process's own quirks (its memory layout, its hash seed)
are not counted as its configuration's.
Both parts export to an OTLP/HTTP receiver in a process of its own (`python -m
tests.otlp_receiver`, counting only). Rounds rotate the order; tables show medians over rounds, the
spread (lowest–highest round) and differences to `off` in the same mode. On a shared machine the end
to end figures move by tens of µs between rounds; the in-process ones by a few.

Targets: ≤ 15 µs with tracing off or unsampled, ≤ 60 µs with every request sampled. A
benchmark, not a test: it asserts nothing about time (it fails only if requests fail).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench import machine
from bench.load import run_wrk, write_wrk_script
from bench.procs import ROOT, Service, free_port
from bench.targets import (
    GENEROUS,
    JWT_SECRET,
    MODEL,
    bench_token,
    gateway_config,
    gateway_service,
    gateway_source,
)
from gateway.demo import sim_flags

PROMPT = "Write a short note about the weather in Lisbon today, please."
MAX_TOKENS = 16
CONFIGS: dict[str, dict[str, Any]] = {
    "off": {"enabled": False},
    "ratio 0": {"enabled": True, "sample_ratio": 0.0},
    "ratio 1": {"enabled": True, "sample_ratio": 1.0},
}
TARGET_US = {"ratio 0": 15.0, "ratio 1": 60.0}


def spans_per_request(name: str, stream: bool) -> int:
    return 0 if name != "ratio 1" else (6 if stream else 5)


class _Dialect:
    name = "vllm"


class _Pool:
    """What `Tracing` reads of a pool."""

    name = "vllm"
    dialect = _Dialect()


async def _stage(ctx: Any) -> None:
    return None


async def _one(ctx: Any, stages: list[Any], stream: bool, tracing: Any) -> None:
    """The tracing work of one request (with `tracing` None: the checks the untraced path makes)."""
    if tracing is not None:
        ctx.trace = tracing.begin(ctx.headers)
    for stage in stages:
        await stage(ctx)
    trace = ctx.trace
    if trace is not None:
        trace.attempt_start("vllm", "vllm-0", "vllm")
        trace.attempt_end(None)
        if stream:
            now = time.time_ns()
            trace.relay_span(now, now, None)
        trace.finished(("length",))
    if tracing is not None:
        tracing.end(ctx, "POST", "/v1/chat/completions")


def inproc(name: str, stream: bool, n: int, endpoint: str) -> float:
    """CPU µs per request of `n` requests' tracing work under configuration `name` (`off`: none)."""
    import asyncio

    from engines.base import Usage
    from gateway.core.context import RequestContext
    from gateway.observability.settings import TracingSettings
    from gateway.observability.tracing import Tracing

    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

        async def __call__(self, ctx: Any) -> None:
            return None

    stages: list[Any] = [Named("authenticate"), Named("admit"), Named("route")]
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS}

    async def run() -> float:
        nonlocal stages
        tracing = None
        if name != "off" and name in CONFIGS:
            # a queue for all `n` (the loop outruns the export; a dropped span would cost nothing)
            settings = TracingSettings(**CONFIGS[name], endpoint=endpoint)
            tracing = Tracing(settings, "bench", max_queued=n + 16, interval_s=0.2)
            tracing.start()
            stages = tracing.wrap(stages)
        try:
            start = time.process_time()
            for i in range(n):
                ctx = RequestContext(
                    f"req_{i:032x}", "chat", 0.0, {b"content-type": b"application/json"}, _stage
                )
                ctx.body, ctx.stream, ctx.status = body, stream, 200
                ctx.pool, ctx.route_reason, ctx.affinity = _Pool(), "default+affinity:hit", "hit"  # type: ignore[assignment]
                ctx.usage = Usage(19, MAX_TOKENS, 0)
                await _one(ctx, stages, stream, tracing)
                if i % 64 == 63:
                    await asyncio.sleep(0)  # the export task runs as it would between requests
            if tracing is not None:
                await tracing.flush()
            return time.process_time() - start
        finally:
            if tracing is not None:
                await tracing.aclose()

    used = asyncio.run(run())
    return used / n * 1e6


def cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds of every live thread of `pid` and of its main thread (the event loop's), from the
    scheduler's nanosecond counters (`/proc/<pid>/task/*/schedstat`; utime and stime tick in 10 ms,
    too coarse for µs per request)."""
    total = main = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            ns = int((task / "schedstat").read_text().split()[0])
            total += ns
            if task.name == str(pid):
                main = ns
    return total / 1e9, main / 1e9


def received(receiver: Service) -> int:
    with urllib.request.urlopen(receiver.base_url + "/count", timeout=5) as r:
        return int(json.loads(r.read())["spans"])


def measure(
    gw: Service, receiver: Service, script: Path, name: str, stream: bool, seconds: float, conc: int
) -> tuple[float, float, int]:
    """(gateway CPU µs per request, of it the event loop's thread, spans missing at the receiver)."""
    run_wrk(gw.base_url + "/v1/chat/completions", script, conc, 1)  # warm-up
    time.sleep(1.3)  # the warm-up's spans are exported before the measurement starts
    start_spans = received(receiver)
    before, before_main = cpu_s(gw.pid)
    r = run_wrk(gw.base_url + "/v1/chat/completions", script, conc, seconds)
    if r.errors or not r.requests:
        raise RuntimeError(f"{name} stream={stream}: {r.errors} of {r.requests} requests failed")
    expected = start_spans + r.requests * spans_per_request(name, stream)
    deadline = time.monotonic() + 10
    while received(receiver) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    after, after_main = cpu_s(gw.pid)
    per = 1e6 / r.requests
    return (after - before) * per, (after_main - before_main) * per, max(0, expected - received(receiver))


#: a measured point: (configuration, streamed)
Point = tuple[str, bool]


@dataclass
class Figures:
    """Every round's figures, per point."""

    #: end to end: gateway CPU µs per request, of it the event loop's thread, spans lost
    cpu: dict[Point, list[float]] = field(default_factory=dict)
    loop_cpu: dict[Point, list[float]] = field(default_factory=dict)
    missing: dict[Point, int] = field(default_factory=dict)
    #: in process: CPU µs per request of the tracing work (`off`: the loop without it)
    inproc_us: dict[Point, list[float]] = field(default_factory=dict)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.tracing", description=__doc__)
    ap.add_argument("--seconds", type=float, default=3.0, help="wrk's duration per point")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", default=None, help="also a gateway of this git ref, without tracing")
    ap.add_argument("--inproc", type=int, default=20_000, help="requests per in-process point (0: none)")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    configs = dict(CONFIGS)
    if a.baseline:
        configs = {f"{a.baseline} (no tracing code)": {}, **configs}
    m = machine.describe([])
    sim_port, rx_port = free_port(), free_port()
    sim_argv = [
        sys.executable, "-m", "engines.sim", "--engine", "vllm", "--port", str(sim_port), *sim_flags("vllm"),
        "--fast", "--min-output-tokens", "128", "--max-output-tokens", "128", "--request-log-size", "1",
    ]  # fmt: skip
    rx_argv = [sys.executable, "-m", "tests.otlp_receiver", "--port", str(rx_port)]
    points = [(name, stream) for stream in (False, True) for name in configs]
    figures = Figures(
        cpu={p: [] for p in points},
        loop_cpu={p: [] for p in points},
        missing=dict.fromkeys(points, 0),
        inproc_us={(n, s): [] for n in CONFIGS for s in (False, True)},
    )
    sim = Service("tracing-sim", sim_argv, sim_port)
    receiver = Service("tracing-otlp-receiver", rx_argv, rx_port, probe="/count", cwd=ROOT)
    with sim, receiver:
        if a.inproc:
            keys = list(figures.inproc_us)
            for r in range(a.rounds):
                shift = r % len(keys)
                for key in keys[shift:] + keys[:shift]:
                    figures.inproc_us[key].append(inproc(*key, a.inproc, receiver.base_url + "/v1/traces"))
        _end_to_end(a, configs, sim, receiver, figures)
    print(machine.run_line(m))
    print(
        f"wrk {a.seconds:g} s per point at concurrency {a.concurrency}, {a.rounds} rounds (median, "
        f"lowest–highest round in brackets); JWT auth and a per-user limit on; {MAX_TOKENS} output tokens "
        f"({MAX_TOKENS} chunks when streamed); gateway process CPU per request, every thread; a fresh "
        "gateway process per configuration and round\n"
    )
    if a.inproc:
        _print_inproc(a.inproc, a.rounds, figures)
    _print_end_to_end(configs, figures)
    return 0


def _end_to_end(
    a: argparse.Namespace,
    configs: dict[str, dict[str, Any]],
    sim: Service,
    receiver: Service,
    figures: Figures,
) -> None:
    """Every configuration's gateway under wrk, a fresh process each round, in a rotated order."""
    headers = {"authorization": f"Bearer {bench_token()}"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS}
    scripts = {
        stream: write_wrk_script(f"tracing-{stream}", orjson.dumps({**body, "stream": stream}), headers)
        for stream in (False, True)
    }
    for r in range(a.rounds):
        names = list(configs)
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            sections: dict[str, Any] = {
                "auth": {"jwt": {"secret": JWT_SECRET}},
                "limits": {"tiers": {"default": GENEROUS}},
            }
            if name in CONFIGS:
                endpoint = receiver.base_url + "/v1/traces"
                sections["tracing"] = {**configs[name], "endpoint": endpoint}
            cfg = gateway_config("vllm", [sim.base_url], **sections)
            source = gateway_source(a.baseline) if name not in CONFIGS else None
            label = "baseline" if name not in CONFIGS else name.replace(" ", "-")
            gw = gateway_service(f"tracing-{label}", cfg, source).start()
            try:
                for stream in (False, True) if r % 2 == 0 else (True, False):
                    point = (name, stream)
                    us, main_us, lost = measure(
                        gw, receiver, scripts[stream], name, stream, a.seconds, a.concurrency
                    )
                    figures.cpu[point].append(us)
                    figures.loop_cpu[point].append(main_us)
                    figures.missing[point] += lost
            finally:
                gw.stop()


def _print_inproc(requests: int, rounds: int, figures: Figures) -> None:
    print(
        f"**In process** — the tracing code of one request, {requests} requests a point, {rounds} "
        "rounds (median, lowest–highest); CPU µs per request, minus the same loop without tracing:\n"
    )
    print("| tracing | non-streamed µs | streamed µs | target |")
    print("|---|---:|---:|---:|")
    inproc_us = figures.inproc_us
    base = {s: statistics.median(inproc_us[("off", s)]) for s in (False, True)}
    for name in CONFIGS:
        if name == "off":
            continue
        row = [name]
        for stream in (False, True):
            runs = [v - base[stream] for v in inproc_us[(name, stream)]]
            row.append(f"{statistics.median(runs):.1f} ({min(runs):.1f}–{max(runs):.1f})")
        row.append(f"≤ {TARGET_US[name]:.0f}")
        print("| " + " | ".join(row) + " |")
    off = "/".join(f"{base[s]:.2f}" for s in (False, True))
    print(f"\n(the loop without tracing itself: {off} µs a request, non-streamed/streamed)\n")
    print("**End to end** — whole gateway processes under wrk:\n")


def _print_end_to_end(configs: dict[str, dict[str, Any]], figures: Figures) -> None:
    print(
        "| tracing | non-streamed µs | Δ to off | Δ event loop | streamed µs | Δ to off | Δ event loop "
        "| target Δ | spans lost |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    cpu = figures.cpu
    med = {p: statistics.median(v) for p, v in cpu.items()}
    loop_med = {p: statistics.median(v) for p, v in figures.loop_cpu.items()}
    for name in configs:
        row = [name]
        for stream in (False, True):
            value, runs = med[(name, stream)], cpu[(name, stream)]
            off, off_loop = med[("off", stream)], loop_med[("off", stream)]
            loop = loop_med[(name, stream)]
            if name == "off":
                delta, loop_delta = "—", f"({loop:.0f})"
            elif name in CONFIGS:
                delta, loop_delta = f"{value - off:+.0f}", f"{loop - off_loop:+.0f}"
            else:  # the baseline: what `off` costs more than the code before tracing
                delta, loop_delta = f"off {off - value:+.0f}", f"off {off_loop - loop:+.0f}"
            row += [f"{value:.0f} ({min(runs):.0f}–{max(runs):.0f})", delta, loop_delta]
        target = f"≤ {TARGET_US.get(name, 15.0):.0f}" if name != "off" else "—"
        row += [target, str(figures.missing[(name, False)] + figures.missing[(name, True)])]
        print("| " + " | ".join(row) + " |")
    print(
        "\n(Δ event loop: the same difference for the gateway's main thread alone, which runs the event "
        "loop; for `off` its own CPU in brackets. The rest of a Δ is other threads'.)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
