"""Processes the harness starts, and what it measures of them: CPU time and RSS of a process tree.

`Service` is one long-running server (a simulator, a gateway, a peer router) started from an argv with
its output in a log file under `bench/.work/logs/`, ready when an HTTP probe answers, and stopped by
PID: SIGTERM to the root, then SIGKILL to the root and to every descendant recorded while it ran (so
uvicorn workers and LiteLLM's children never outlive the harness). Nothing is matched by name.

`tree_pids(pid)` is the process and all its descendants (from /proc/<pid>/task/*/children);
`tree_cpu(pid)` their user+system CPU seconds; `tree_rss(pid)` their resident memory in bytes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from engines.sim.launcher import cpu_seconds, free_port

__all__ = ["WORK", "Service", "ServiceError", "free_port", "tree_cpu", "tree_pids", "tree_rss"]

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / ".work"
_PAGE = os.sysconf("SC_PAGE_SIZE")


class ServiceError(RuntimeError):
    """A service did not start; the message holds the tail of its log."""


def tree_pids(pid: int) -> list[int]:
    """`pid` and every descendant alive now (children of every thread, recursively)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except OSError:
                continue
    return out


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def tree_cpu(pid: int) -> float:
    """User+system CPU seconds used so far by the live processes of the tree."""
    return sum(cpu_seconds(p) for p in tree_pids(pid))


def tree_rss(pid: int) -> int:
    """Resident set size of the tree in bytes (shared pages of forked workers counted per process)."""
    total = 0
    for p in tree_pids(pid):
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * _PAGE
        except OSError:
            continue
    return total


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Service:
    """One server process on 127.0.0.1; a context manager. `probe` is a path answered with < 500."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        port: int,
        *,
        probe: str | None = "/health",
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        start_timeout: float = 60.0,
        source: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.port = port
        self.probe = probe
        self.env = env
        self.cwd = cwd or ROOT
        self.start_timeout = start_timeout
        self.source = source or ROOT  # put first on PYTHONPATH (a snapshot of the gateway's source)
        self.proc: subprocess.Popen[bytes] | None = None
        self._seen: dict[int, int | None] = {}  # pid -> start time (guards against PID reuse)
        (WORK / "logs").mkdir(parents=True, exist_ok=True)
        self.log_path = WORK / "logs" / f"{name}.log"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} not started"
        return self.proc.pid

    def start(self) -> Service:
        env = {**os.environ, **(self.env or {})}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.source), env.get("PYTHONPATH", "")) if p)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=str(self.cwd),
                start_new_session=True,  # Ctrl-C reaches the harness, which stops everything in order
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServiceError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if port_open(self.port) and self._probe_ok():
                self.remember_tree()
                return self
            time.sleep(0.1)
        tail = self.log_tail()
        self.stop()
        raise ServiceError(f"{self.name} not ready within {self.start_timeout}s:\n{tail}")

    def _probe_ok(self) -> bool:
        if self.probe is None:
            return True
        try:
            with urllib.request.urlopen(self.base_url + self.probe, timeout=2) as r:
                return int(r.status) < 500
        except urllib.error.HTTPError as e:
            return e.code < 500
        except (OSError, ValueError):
            return False

    def remember_tree(self) -> None:
        """Record the current descendants so `stop` can reach them even if the root dies first."""
        if self.proc is not None:
            for pid in tree_pids(self.proc.pid):
                self._seen.setdefault(pid, _start_time(pid))

    def cpu(self) -> float:
        return tree_cpu(self.pid)

    def rss(self) -> int:
        return tree_rss(self.pid)

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        proc = self.proc
        if proc is None:
            return
        self.remember_tree()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        for pid, started in self._seen.items():
            if pid != proc.pid and started is not None and _start_time(pid) == started:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        self.proc = None

    def __enter__(self) -> Service:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
