"""What the figures were measured on: machine, load, versions, date and command line."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
from typing import Any

from bench.procs import ROOT


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def _version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown"


def _pkg(name: str) -> str:
    import importlib.metadata as md

    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "-"


def describe(argv: list[str]) -> dict[str, Any]:
    load1, load5, _ = os.getloadavg()
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "make bench" + (f" BENCH_ARGS='{' '.join(argv)}'" if argv else ""),
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "ram_gib": round(_ram_gib(), 1),
        "kernel": platform.release(),
        "loadavg_at_start": f"{load1:.2f} / {load5:.2f} (1 / 5 min)",
        "python": sys.version.split()[0],
        "wrk": _version(["wrk", "--version"]),
        "commit": _version(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
        "packages": {
            p: _pkg(p) for p in ("uvicorn", "uvloop", "httptools", "aiohttp", "httpx", "orjson", "redis")
        },
    }


def run_line(m: dict[str, Any]) -> str:
    """A micro-benchmark's first line: when, which commit, the machine, and its load at the start
    (`describe`) and now."""
    load1, load5, _ = os.getloadavg()
    return (
        f"{m['date']}, commit {m['commit']}, {m['nproc']} CPUs ({m['cpu']}), Python {m['python']}; "
        f"load average {m['loadavg_at_start']} at start, {load1:.2f} / {load5:.2f} at the end\n"
    )
