"""Start and stop simulator processes (for the demo, the tests and the benchmarks).

    with SimProcess("vllm", extra=["--fast"]) as sim:
        httpx.get(sim.base_url + "/health")

`start()` launches `sys.executable -m engines.sim --engine E --host 127.0.0.1 --port P [extra]`, then
waits until the port accepts TCP connections (default 30 s: a start beside real engines starting
on a busy machine can take over 15 s; pass `wait=False` for simulators started with
`--listen-delay` or `--refuse`). If the process exits or the wait times out, it is killed and
`SimStartError` carries its stderr. `stop()` sends SIGTERM to the PID, then SIGKILL after `stop_timeout`.

A port chosen free (`free_port`) may be taken before the simulator binds it - by another simulator
given the same port (the kernel hands a just-released port out again), or by another process - and
the port then accepts connections of that other server while this simulator dies of "address already
in use", and its caller would talk to the wrong simulator. So the wait also checks that the listening
socket is this process's (`listener_held_by`, from /proc), and a simulator whose port was taken so is
started again on another free port (when the port was not given by the caller; else `SimStartError`).
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from pathlib import Path
from types import TracebackType
from typing import IO

_ROOT = Path(__file__).resolve().parents[2]


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used (Linux's /proc; 0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


class SimStartError(RuntimeError):
    """The simulator did not come up; the message includes its stderr."""


#: the ports `free_port` handed out lately in this process (it does not give one twice in a row of
#: these: servers started together were given the same port, each chosen before any bound it)
_HANDED: collections.deque[int] = collections.deque(maxlen=256)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now, and not one of the last 256 this process was
    given (a server binds its port only once started; until then the kernel may hand it out again)."""
    port = 0
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED:
            break
    _HANDED.append(port)
    return port


def late_bound_port() -> int:
    """A TCP port free right now on every address and below the kernel's ephemeral range, for a server
    that binds it long after it was chosen (a real engine loads its model first, tens of seconds).
    `free_port`'s ports lie in that range, where any outgoing connection on the machine may take one
    meanwhile as its local port, and a server binding it late then fails with "Address already in
    use"."""
    low = 32768
    with contextlib.suppress(OSError, ValueError, IndexError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if low <= 2048:
        return free_port()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, low // 2), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    return free_port()


def listener_held_by(port: int, pids: Collection[int]) -> bool | None:
    """Whether one of `pids` holds the socket listening on TCP `port` (on any address), read from
    /proc; None when that cannot be told (no /proc, or nothing listening on `port` in it)."""
    inodes: set[str] = set()
    try:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(FileNotFoundError):
                for line in Path(table).read_text().splitlines()[1:]:
                    fields = line.split()
                    # local address "ADDR:PORT" (hex), state 0A = LISTEN, the socket's inode
                    if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(fields[9])
    except (OSError, ValueError):
        return None
    if not inodes:
        return None
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        return True
    return False


def taken_by_another(port: int, pids: Collection[int], exited: bool) -> bool:
    """A port that accepts connections is another server's, not the one started on it as `pids`:
    that one has `exited` (of "address already in use") or /proc names another listener. Cannot
    tell (no /proc): not taken."""
    return exited or listener_held_by(port, pids) is False


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """Whether a TCP connection to host:port succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class SimProcess:
    """One simulator subprocess on 127.0.0.1; a context manager, or use start()/stop()."""

    def __init__(
        self,
        engine: str = "vllm",
        port: int | None = None,
        extra: list[str] | None = None,
        *,
        host: str = "127.0.0.1",
        start_timeout: float = 30.0,
        stop_timeout: float = 5.0,
        wait: bool = True,
    ) -> None:
        self.engine = engine
        self.host = host
        self._chosen = port is None  # the port was chosen here: another one may be taken instead
        self.port = port if port is not None else free_port()
        self.extra = list(extra or [])
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.wait = wait
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT` (no trailing slash; add `/v1` for the OpenAI SDK)."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        """PID of the running simulator."""
        if self._proc is None:
            raise RuntimeError("simulator not started")
        return self._proc.pid

    @property
    def argv(self) -> list[str]:
        """The command line used to launch the simulator."""
        return [
            sys.executable,
            "-m",
            "engines.sim",
            "--engine",
            self.engine,
            "--host",
            self.host,
            "--port",
            str(self.port),
            *self.extra,
        ]

    def start(self) -> SimProcess:
        """Launch the process and (unless `wait=False`) wait for its port."""
        self._launch()
        if self.wait:
            self.wait_ready(self.start_timeout)
        return self

    def _launch(self) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
        env["PYTHONFAULTHANDLER"] = "1"  # a start that never listens shows its stacks (SIGABRT)
        self._proc = subprocess.Popen(
            self.argv, stdout=subprocess.DEVNULL, stderr=self._stderr, env=env, cwd=str(_ROOT)
        )

    def wait_ready(self, timeout: float) -> None:
        """Block until the port accepts connections; `SimStartError` on exit or timeout. A port
        another process listens on is given up for a new one (see the module docstring)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self._proc
            exited = proc is None or proc.poll() is not None
            if port_open(self.host, self.port):
                if proc is not None and not taken_by_another(self.port, (proc.pid,), exited):
                    return
                taken = self.port
                text = self.stderr_text()
                self.stop()
                if not self._chosen:
                    raise SimStartError(f"port {taken} is held by another process: {text}")
                self.port = free_port()
                self._launch()
                continue
            if exited:
                text = self.stderr_text()
                self.stop()
                raise SimStartError(f"simulator exited early: {text}")
            time.sleep(0.02)
        raise SimStartError(f"simulator not listening on {self.base_url} after {timeout}s{self._where()}")

    def _where(self) -> str:
        """The CPU a start that never listened has had (starved or stuck?) and, from its stderr, every
        thread's stack (SIGABRT; PYTHONFAULTHANDLER is set), then the process is gone."""
        proc = self._proc
        cpu = cpu_seconds(proc.pid) if proc is not None else 0.0
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        text = self.stderr_text()
        self.stop()
        return f" ({cpu:.1f} s of CPU so far): {text}"

    def stderr_text(self) -> str:
        """Everything the process wrote to stderr so far."""
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL after `stop_timeout`; idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        self._proc = None

    def __enter__(self) -> SimProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_all(procs: list[SimProcess]) -> list[SimProcess]:
    """Launch several simulators at once and wait for all of them (faster than one by one).
    On failure the ones already started are stopped and `SimStartError` propagates."""
    try:
        for proc in procs:
            proc.wait = False
            proc.start()
        for proc in procs:
            proc.wait_ready(proc.start_timeout)
    except BaseException:
        stop_all(procs)
        raise
    return procs


def stop_all(procs: list[SimProcess]) -> None:
    """SIGTERM every simulator first, then wait for (or SIGKILL) each: stops run in parallel."""
    for proc in procs:
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
    for proc in procs:
        proc.stop()
