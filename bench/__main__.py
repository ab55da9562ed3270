"""`make bench` → `python -m bench [options]`: run the suites, write bench/BENCHMARKS.md and its plots.

    python -m bench                 quick mode (default): overhead + routing, short points, one round
    python -m bench --full          several rounds, longer points, both load levels for every workload
    python -m bench --suite overhead --suite micro     only some suites (the others' last results,
                                                        from bench/results/*.json, stay in the report)
    python -m bench --micro tracing  one micro-benchmark (the others keep their last figures)
    python -m bench --no-peers      skip LiteLLM and the Rust routers
    python -m bench --suite routing --processes   the routing suite with 1 and 4 routing processes, KV
                                    events and shared load (bench/routing.py `PROCESSES`; also
                                    `python -m bench.routing`, which takes a smaller matrix)
    python -m bench --gateway-ref HEAD   benchmark a committed gateway (a `git archive` snapshot)

Suites: `overhead` (proxy cost against the peers, bench/overhead.py), `routing` (cache-hit quality,
TTFT and the serving figures — TPOT, ITL, E2E, goodput, cost per million tokens — on a simulated fleet,
bench/routing.py), `micro` (bench/transports.py — the upstream transport
against httpx —, bench/adapters.py, bench/apis.py — gateway CPU of /v1/responses and /v1/messages beside
chat —, bench/tracing.py — gateway CPU per request with tracing off, unsampled and sampled —,
bench/fleet_cpu.py — the full pipeline's CPU per request in front of 1, 8 and 32 backends —, and
bench/share_cost.py — Redis's own CPU per admission and finish call with shared routing state), `kv`
(in-process, no servers: bench/kv_micro.py — tokenization, the routing decision's CPU with the engines'
KV events, the index's memory at 8 backends x 1M events — and bench/replay.py's table of every workload
at 50 / 80 % load with 1, 2, 4 and 8 routing processes, events and shared load on, against round robin
and, on uniform traffic, least load), `overload` (bench/overload.py: flow control off and on side by
side on a saturated batching fleet, three tenants in two classes at 0.5, 1.5 and 2 times its capacity, 3
seeds; interactive TTFT, batch tenants' fair shares, every request's outcome, goodput, added latency;
about eight minutes, three with flow off alone; `python -m bench.overload` runs it shortened). Progress
is printed as it goes; everything started is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import machine, overhead, peers, report
from bench.procs import BENCH, ROOT

RESULTS = BENCH / "results"
SUITES = ("overhead", "routing", "micro", "kv", "overload")


class Progress:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, msg: str) -> None:
        el = time.monotonic() - self.t0
        print(f"[{int(el // 60):02d}:{el % 60:04.1f}] {msg}", flush=True)


def _before_tracing() -> str | None:
    """The commit before gateway/observability/tracing.py was added (bench/tracing.py's baseline)."""
    p = subprocess.run(
        ["git", "log", "-1", "--format=%h", "--diff-filter=A", "--", "gateway/observability/tracing.py"],
        capture_output=True,
        text=True,
        cwd=str(ROOT),
    )
    added = p.stdout.strip()
    return f"{added}~1" if p.returncode == 0 and added else None


MICRO = ("transports", "adapters", "apis", "tracing", "fleet_cpu", "share_cost")


def micro(quick: bool, log: Progress, only: list[str] | None, date: str) -> dict[str, str]:
    """Run the micro-benchmarks (`only` those, by name) as subprocesses and keep their printed tables."""
    out: dict[str, str] = {}
    runs = {
        "bench/transports.py": [
            "-m",
            "bench.transports",
            "--requests",
            "500" if quick else "2000",
            "--rounds",
            "1" if quick else "3",
        ],
        "bench/adapters.py": ["-m", "bench.adapters"],
        "bench/apis.py": ["-m", "bench.apis", "--requests", "300" if quick else "1000", "--rounds", "3"],
        "bench/tracing.py": [
            "-m",
            "bench.tracing",
            "--seconds",
            "3" if quick else "5",
            "--rounds",
            "3" if quick else "5",
            *(["--baseline", before] if (before := _before_tracing()) else []),
        ],
        "bench/fleet_cpu.py": [
            "-m",
            "bench.fleet_cpu",
            "--seconds",
            "3" if quick else "4",
            "--rounds",
            "2" if quick else "3",
        ],
        "bench/share_cost.py": ["-m", "bench.share_cost", "--calls", "1000" if quick else "4000"],
    }
    #: seconds a micro-benchmark may take (tracing: 6 points x rounds x (warm-up + load + export))
    timeouts = {"bench/tracing.py": 900, "bench/fleet_cpu.py": 900}
    for name, args in runs.items():
        if not (ROOT / name).exists() or (only and Path(name).stem not in only):
            continue
        log(f"micro: {name}")
        try:
            p = subprocess.run(
                [sys.executable, *args],
                capture_output=True,
                text=True,
                timeout=timeouts.get(name, 300),
                cwd=str(ROOT),
            )
            text = (
                p.stdout
                if p.returncode == 0
                else f"failed (exit {p.returncode}):\n\n```\n{p.stderr[-1500:]}\n```"
            )
        except subprocess.TimeoutExpired:
            text = f"timed out after {timeouts.get(name, 300)} s"
        cmd = f"`python {' '.join(args)}`"
        out[name] = f"{cmd} — measured {date}\n\n{text}"
    return out


# bench.replay's points for the report: (label, arguments); 2 seeds each (the replay is deterministic,
# one seed is one schedule's sample)
REPLAYS = (
    (
        "prefix-heavy workloads, ours vs round robin and sglang-router cache_aware (modelled)",
        [
            "shared_prefix",
            "long_document_qa",
            "multi_turn_chat",
            "agent_tool_loop",
            *("--baseline", "round_robin", "--baseline", "sglang_cache_aware"),
        ],
    ),
    ("uniform traffic, ours vs least load", ["uniform", "--baseline", "least_load"]),
)
REPLAY_POINTS = ["--load", "0.5", "--load", "0.8", *(a for r in (1, 2, 4, 8) for a in ("--replicas", str(r)))]


def kv(quick: bool, log: Progress) -> dict[str, str]:
    """KV-event routing's own figures: bench.kv_micro and bench.replay's tables, as printed."""
    out: dict[str, str] = {}
    micro = ["-m", "bench.kv_micro", *(["--quick"] if quick else [])]
    # (args, GATEWAY_POLICIES): the decision's table again with the policies' sources rather than
    # their compiled build (policies/__init__.py), in the same run for the ratio
    runs: dict[str, tuple[list[str], str]] = {
        "bench/kv_micro.py": (micro, "native"),
        "bench/kv_micro.py: the decision, policies from their sources": (
            [*micro, "--section", "2"],
            "python",
        ),
    }
    for label, args in REPLAYS:
        seeds = "1" if quick else "2"
        runs[f"bench/replay.py: {label}"] = ([
            "-m", "bench.replay", *args, *REPLAY_POINTS, "--seeds", seeds, "--events", "5", "--shared", "--table",
        ], "native")  # fmt: skip
    for name, (args, policies) in runs.items():
        log(f"kv: {name}")
        t0 = time.monotonic()
        try:
            p = subprocess.run(
                [sys.executable, *args],
                capture_output=True,
                text=True,
                timeout=3600,
                cwd=str(ROOT),
                env={**os.environ, "GATEWAY_POLICIES": policies},
            )
            text = (
                p.stdout
                if p.returncode == 0
                else f"failed (exit {p.returncode}):\n\n```\n{p.stderr[-1500:]}\n```"
            )
        except subprocess.TimeoutExpired:
            text = "timed out after 3600 s"
        cmd = f"`GATEWAY_POLICIES={policies} python {' '.join(args)}` ({time.monotonic() - t0:.0f} s)"
        out[name] = f"{cmd}\n\n{text}"
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the default: short points, one round (< 5 min)")
    mode.add_argument("--full", action="store_true", help="several rounds, longer points")
    ap.add_argument("--suite", action="append", choices=SUITES, help="run only these (repeatable)")
    ap.add_argument(
        "--micro",
        action="append",
        choices=MICRO,
        help="only these micro-benchmarks (repeatable; implies --suite micro)",
    )
    ap.add_argument("--no-peers", action="store_true", help="skip LiteLLM and the Rust routers")
    ap.add_argument(
        "--processes",
        action="store_true",
        help="routing suite: 1 and 4 routing processes with KV events and shared load, against the peers "
        "(results/routing_processes.json; the default routing rows are kept)",
    )
    ap.add_argument("--gateway-ref", default=None, help="benchmark a git ref instead of the working tree")
    ap.add_argument("--out", default=str(BENCH / "BENCHMARKS.md"))
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from bench/results/*.json")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = _parser().parse_args(argv)
    quick = not a.full
    # quick mode leaves the micro-benchmarks out (the report keeps their last figures, dated)
    suites = a.suite or (["micro"] if a.micro else ["overhead", "routing"] if quick else list(SUITES))
    if a.report_only:
        suites = []
    log = Progress()
    RESULTS.mkdir(exist_ok=True)
    run: dict[str, Any] = {"mode": "quick" if quick else "full", "machine": machine.describe(argv)}
    last = RESULTS / "run.json"
    #: the report's header describes the last run of the overhead or routing suite (micro-benchmarks
    #: carry their own date and command)
    main_suites = bool({"overhead", "routing"} & set(suites))
    measured = run
    if not main_suites and last.exists():
        run = json.loads(last.read_text())  # the machine, date and command of the run that measured
    log(
        f"bench: {measured['mode']} mode, suites {', '.join(suites)}; {measured['machine']['nproc']} CPUs, load {measured['machine']['loadavg_at_start']}"
    )

    if "overhead" in suites:
        plan = overhead.QUICK if quick else overhead.FULL
        plan.with_peers = not a.no_peers
        log("overhead suite")
        res = overhead.run(plan, log, a.gateway_ref).to_json()
        res["mode"] = run["mode"]
        (RESULTS / "overhead.json").write_text(json.dumps(res, indent=1))
    if "routing" in suites:
        try:
            from bench import routing
        except ImportError as e:
            log(f"routing suite not available: {e}")
        else:
            if a.processes:
                log("routing suite, several routing processes (KV events, shared load)")
                res = routing.run_processes(
                    routing.PROCESSES, log, with_peers=not a.no_peers, gateway_ref=a.gateway_ref
                )
                res["machine"] = measured["machine"]
                res["command"] = measured["machine"]["command"]
                (RESULTS / "routing_processes.json").write_text(json.dumps(res, indent=1))
            else:
                log("routing suite")
                res = routing.run(quick, log, with_peers=not a.no_peers, gateway_ref=a.gateway_ref)
                res["mode"] = run["mode"]
                res["machine"] = measured["machine"]
                (RESULTS / "routing.json").write_text(json.dumps(res, indent=1))
    if "micro" in suites:
        kept = RESULTS / "micro.json"
        figures = json.loads(kept.read_text()) if kept.exists() else {}
        figures.pop("_date", None)
        figures.update(micro(quick, log, a.micro, measured["machine"]["date"]))
        kept.write_text(json.dumps(figures, indent=1))
    if "overload" in suites:
        from bench import overload

        log("overload suite")
        res = overload.run(log, a.gateway_ref)
        res["machine"] = measured["machine"]
        (RESULTS / "overload.json").write_text(json.dumps(res, indent=1))
    if "kv" in suites:
        figures = kv(quick, log)
        figures["_date"] = measured["machine"]["date"]
        figures["_commit"] = measured["machine"]["commit"]
        (RESULTS / "kv.json").write_text(json.dumps(figures, indent=1))

    for name in ("overhead", "routing", "routing_processes", "micro", "kv", "overload"):
        f = RESULTS / f"{name}.json"
        if f.exists():
            run[name] = json.loads(f.read_text())
    if main_suites:
        run["peer_versions"] = {p.label: peers.installed_version(p) for p in peers.PEERS}
        run["elapsed_s"] = time.monotonic() - log.t0
        keys = ("mode", "machine", "elapsed_s", "peer_versions")
        last.write_text(json.dumps({k: run[k] for k in keys}, indent=1))
    # the plots are drawn from the same results when they are measured; --report-only keeps them
    if run.get("overhead") and "overhead" in suites:
        report.overhead_plots(run["overhead"])
    if run.get("routing") and run["routing"].get("rows") and "routing" in suites:
        report.routing_plots(run["routing"])
    report.write(run, Path(a.out))
    log(f"wrote {a.out} (and plots in bench/plots/)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
