"""Load generators: `wrk` (C, from Debian) for non-streaming requests, `bench.streamclient` for streams.

Both run as separate processes, so the client's CPU is neither the harness's nor the target's; both
report the client's own CPU seconds (wrk's from the kernel's rusage of the waited child), so a report
can show whether the client was near a core's worth of CPU (then the figures are the client's, not the
target's).

`wrk` gets a Lua script (written under bench/.work/) that POSTs a fixed JSON body and prints, when
done, one JSON line: requests, duration, latency percentiles in µs and errors by kind.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.procs import ROOT, WORK

_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\nBENCHJSON {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
    '"p50":%.1f,"p90":%.1f,"p99":%.1f,"mean":%.1f,"max":%.1f}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max))
end
"""


def _lua_string(s: str) -> str:
    return "[==[" + s + "]==]"


def write_wrk_script(name: str, body: bytes | list[bytes], headers: dict[str, str]) -> Path:
    """A wrk Lua script that POSTs `body` with `headers` (a list of bodies: each in turn)."""
    bodies = body if isinstance(body, list) else [body]
    lines = ['wrk.method = "POST"', f"wrk.body = {_lua_string(bodies[0].decode())}"]
    lines.append('wrk.headers["Content-Type"] = "application/json"')
    for k, v in headers.items():
        lines.append(f"wrk.headers[ {_lua_string(k)} ] = {_lua_string(v)}")
    if len(bodies) > 1:
        lines.append("local bodies = {" + ", ".join(_lua_string(b.decode()) for b in bodies) + "}")
        lines.append("local turn = 0")
        lines.append("request = function()")
        lines.append("  turn = turn % #bodies + 1")
        lines.append("  return wrk.format(nil, nil, nil, bodies[turn])")
        lines.append("end")
    path = WORK / "wrk" / f"{name}.lua"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n" + _DONE)
    return path


@dataclass
class WrkResult:
    requests: int
    seconds: float
    p50_us: float
    p90_us: float
    p99_us: float
    mean_us: float
    errors: int
    client_cpu_s: float
    error_kinds: dict[str, int] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def wrk_binary() -> str:
    path = shutil.which("wrk") or ("/usr/bin/wrk" if os.path.exists("/usr/bin/wrk") else None)
    if path is None:
        raise RuntimeError("wrk is not installed: apt-get install wrk")
    return path


def run_wrk(url: str, script: Path, concurrency: int, seconds: float, threads: int = 1) -> WrkResult:
    """One wrk run; `threads` ≤ concurrency. Raises if wrk fails or prints no result."""
    argv = [
        wrk_binary(),
        f"-t{min(threads, concurrency)}",
        f"-c{concurrency}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        url,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    for line in out.stdout.splitlines():
        if line.startswith("BENCHJSON "):
            d = json.loads(line[len("BENCHJSON ") :])
            kinds = {k: int(d[k]) for k in ("connect", "read", "write", "status", "timeout") if d[k]}
            return WrkResult(
                requests=int(d["requests"]),
                seconds=d["duration_us"] / 1e6,
                p50_us=d["p50"],
                p90_us=d["p90"],
                p99_us=d["p99"],
                mean_us=d["mean"],
                errors=sum(kinds.values()),
                client_cpu_s=cpu,
                error_kinds=kinds,
            )
    raise RuntimeError(
        f"wrk printed no result (rc {out.returncode}): {out.stdout[-500:]} {out.stderr[-500:]}"
    )


@dataclass
class StreamResult:
    completed: int
    errors: int
    ttfc_us: list[float]
    total_us: list[float]
    events_per_stream: float
    wall_s: float
    client_cpu_s: float
    error_kinds: dict[str, int] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.completed / self.wall_s if self.wall_s else 0.0


def _client_argv(url: str, body_file: Path, headers: dict[str, str]) -> list[str]:
    argv = [sys.executable, "-m", "bench.streamclient", "--url", url, "--body-file", str(body_file)]
    for k, v in headers.items():
        argv += ["--header", f"{k}: {v}"]
    return argv


def _parse(line: str) -> StreamResult:
    d = json.loads(line)
    return StreamResult(
        completed=d["completed"],
        errors=d["errors"],
        ttfc_us=d["ttfc_us"],
        total_us=d["total_us"],
        events_per_stream=d["events_per_stream"],
        wall_s=d["wall_s"],
        client_cpu_s=d["client_cpu_s"],
        error_kinds=d["error_kinds"],
    )


def run_streams(
    url: str, body_file: Path, headers: dict[str, str], concurrency: int, seconds: float
) -> StreamResult:
    """C concurrent workers streaming back to back for `seconds`, in a client process of its own."""
    argv = [
        *_client_argv(url, body_file, headers),
        "--concurrency",
        str(concurrency),
        "--duration",
        str(seconds),
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 180, cwd=str(ROOT))
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"stream client failed (rc {out.returncode}): {out.stderr[-800:]}")
    return _parse(lines[-1])


class HeldStreams:
    """`n` streams opened at once by a client process; `wait_ready()` returns once all are open."""

    def __init__(self, url: str, body_file: Path, headers: dict[str, str], n: int) -> None:
        argv = [*_client_argv(url, body_file, headers), "--hold", str(n)]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT)
        )

    def wait_ready(self, timeout: float = 120.0) -> dict[str, float]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("READY "):
                ready: dict[str, float] = json.loads(line[6:])
                return ready
        self.stop()
        raise RuntimeError("held streams never became ready")

    def finish(self, timeout: float = 300.0) -> StreamResult:
        out, err = self.proc.communicate(timeout=timeout)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if not lines:
            raise RuntimeError(f"stream client failed: {err[-800:]}")
        return _parse(lines[-1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
