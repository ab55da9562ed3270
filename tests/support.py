"""Real processes for the tests: gateways and redis-server on loopback ports, stopped by PID.

Every wait here is bounded; a process that does not come up fails the test with its own output.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.cookiejar
import inspect
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx
import yaml
import zmq
from zmq.utils.monitor import recv_monitor_message

from bench.procs import tree_cpu, tree_pids
from engines.sim.launcher import free_port, port_open, taken_by_another

#: seconds a test gateway has to answer /readyz (`GatewayProcess.start`) ...
START_S = 40.0
#: ... unless its process tree has had less CPU than this by then (a starved start, not a hung one), up to
#: START_MAX_S: a healthy start takes ~1 s of CPU
START_CPU_S = 10.0
START_MAX_S = 120.0

#: how long a test waits for another process to do its part before it fails
WAIT_S = 10.0
#: how often it looks meanwhile
POLL_S = 0.02
#: how long a plain call to a loopback server may take (httpx's own default is 5 s)
HTTP_TIMEOUT_S = 30.0

#: the tests' one client for plain calls to loopback servers. A client per call (`httpx.get`) parses
#: the system's CA bundle each time, ~25 ms of CPU, which a poll every POLL_S turns into most of a
#: core. A new connection per request, as before; no cookie is kept from one test to the next. Its
#: timeout guards against a hang, not a speed: a loaded machine can take seconds over a 2 s request.
HTTP = httpx.Client(
    timeout=HTTP_TIMEOUT_S,
    limits=httpx.Limits(max_keepalive_connections=0),
    cookies=http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[])),
)

T = TypeVar("T")

__all__ = [
    "HTTP",
    "WAIT_S",
    "GatewayProcess",
    "Recorder",
    "RedisServer",
    "free_port",
    "one_turn",
    "until",
    "wait_until",
    "zmq_joined",
]


#: the share of its examples a property test draws in `make check` (`make test` draws them all)
CHECK_EXAMPLES = 1 / 3
_quick: list[bool] = [False]  # set by tests/conftest.py in a `make check` run


def examples(n: int) -> int:
    """How many examples a property test draws: `n` in `make test`, a third of them (at least 20) in
    `make check`, which is run on every change and must stay under a minute."""
    return max(20, round(n * CHECK_EXAMPLES)) if _quick[0] else n


def wait_until(check: Callable[[], T], timeout: float = WAIT_S, what: str = "condition") -> T:
    """The suite's one wait, for what only another process changes (a gateway's metrics, a simulator's
    stats, a socket's state): polls `check` until it returns something truthy and returns that, for
    at most `timeout` seconds, then looks once more (a check that is slow to evaluate on a loaded
    machine, an `ss` or a scrape, still gets a look after the deadline). Whatever this process can
    signal is awaited instead (an `asyncio.Event` or `Condition`); `until` is this wait in a
    coroutine."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(POLL_S)  # the other side is another process: nothing here can signal it
    return value


async def until(
    check: Callable[[], T] | Callable[[], Awaitable[T]], within: float = WAIT_S, what: str = "condition"
) -> T:
    """`wait_until` in a coroutine, for a peer served on another thread or process (a ZMQ socket, a
    server): the loop runs between looks, and `check` may be a coroutine function."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(POLL_S)  # the other side is a socket's peer: nothing here can signal it


def zmq_joined(sock: zmq.Socket[bytes], endpoint: str, within: float = WAIT_S) -> None:
    """Connect `sock` to `endpoint` and return once its handshake with the peer is done, an event
    of the socket's monitor. A SUB socket's subscription goes out as the handshake ends: what the
    publisher sends from then on reaches it (ZMQ drops what a SUB misses while it joins)."""
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        sock.connect(endpoint)
        if not monitor.poll(int(within * 1000)):
            raise AssertionError(f"no handshake with {endpoint} within {within}s")
        recv_monitor_message(monitor)
    finally:
        sock.disable_monitor()
        monitor.close()


async def one_turn() -> None:
    """Let every task that is ready run until its next await (an asyncio task started here has
    then begun, and blocks where it waits); no time passes."""
    await asyncio.sleep(0)  # a turn of the loop, not a wait: what asyncio offers for it


class Recorder(Generic[T]):
    """A callback that records what it is given, and a coroutine that waits on a condition over the
    records: woken by each call, never polling."""

    def __init__(self) -> None:
        self.items: list[T] = []
        self._called = asyncio.Event()

    def __call__(self, item: T) -> None:
        self.items.append(item)
        self._called.set()

    async def wait_for(self, check: Callable[[list[T]], bool], within: float = WAIT_S) -> list[T]:
        async with asyncio.timeout(within):
            while not check(self.items):
                self._called.clear()
                await self._called.wait()
        return self.items


def _stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def received_chat(
    base_url: str, body: dict[str, Any], since: float = 0.0, last: int = 8
) -> dict[str, Any] | None:
    """The chat request with `body`'s last message that the simulator at `base_url` received at or
    after `since` (`time.time()`: the simulators run on this machine) among its last `last`
    generation requests, as it received it; None if none. Which backend served a request is told so,
    not by the simulator's request count: the gateway's warm-ups (a one-token `POST /v1/completions`
    of a hot group's preamble, sent to another backend in the background) are generation requests
    too."""
    r = HTTP.get(base_url + "/sim/requests", params={"limit": last}, timeout=5)
    r.raise_for_status()
    wanted = body["messages"][-1]
    for seen in reversed(r.json()["requests"]):
        got = seen["body"]
        if (
            seen["path"] == "/v1/chat/completions"
            and seen["arrival"] >= since
            and isinstance(got, dict)
            and got["messages"][-1] == wanted
        ):
            return dict(got)
    return None


class _Stuck(Exception):
    """A gateway that uses the CPU and still does not answer (its start is given up)."""


class GatewayProcess:
    """`gateway serve --config <tmp yaml>` in a subprocess; ready when /readyz answers 200."""

    def __init__(
        self, config: dict[str, Any], *, env: dict[str, str] | None = None, ready: bool = True
    ) -> None:
        given = config.setdefault("server", {}).get("port")
        self._chosen = not given  # the port was chosen here: another one may be taken instead
        self.port = given or free_port()
        config["server"]["port"] = self.port
        config["server"].setdefault("host", "127.0.0.1")
        self.config = config
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._env = env or {}
        self._wait_ready = ready
        self._dir = tempfile.mkdtemp(prefix="gw-test-")
        self.log_path = Path(self._dir) / "gateway.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def config_path(self) -> Path:
        """The config file the gateway was started with (a test may rewrite it and reload)."""
        return Path(self._dir) / "gateway.yaml"

    def _launch(self) -> subprocess.Popen[bytes]:
        cfg = self.config_path
        cfg.write_text(yaml.safe_dump(self.config))
        env = {**os.environ, "PYTHONFAULTHANDLER": "1", **self._env}
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        return self.proc

    def _taken(self, proc: subprocess.Popen[bytes]) -> None:
        """Another process listens on this gateway's port (chosen free, taken before the gateway bound
        it: engines/sim/launcher.py says how): start again on a new one, or fail for a given port."""
        taken = self.port
        proc.kill()
        proc.wait(10)
        self._log.close()
        if not self._chosen:
            raise RuntimeError(f"port {taken} is held by another process:\n{self.log()}")
        self.port = self.config["server"]["port"] = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"

    def start(self) -> GatewayProcess:
        self.proc = self._launch()
        # a healthy start takes 1-2 s; 40 s because a gateway started beside the real engines'
        # start-up (both cores busy for ~50 s) once printed nothing in 20 s (13 setup errors)
        t0 = time.monotonic()
        seen = ["nothing listening on the port"]

        def started() -> bool:
            proc = self.proc
            assert proc is not None
            waited = time.monotonic() - t0
            if waited >= START_S and tree_cpu(proc.pid) >= START_CPU_S:
                raise _Stuck  # it works and still does not answer: it will not
            exited = proc.poll() is not None
            listening = port_open("127.0.0.1", self.port)
            if listening and taken_by_another(self.port, tree_pids(proc.pid), exited):
                self._taken(proc)
                self.proc = self._launch()
                return False
            if exited:
                raise RuntimeError(f"gateway exited with {proc.returncode}:\n{self.log()}")
            if not listening:
                return False
            if not self._wait_ready:
                return True
            try:
                status = HTTP.get(self.base_url + "/readyz", timeout=1).status_code
            except httpx.HTTPError as e:
                seen[0] = f"/readyz failed: {e!r}"
                return False
            seen[0] = f"/readyz answered {status}"
            return status == 200

        with contextlib.suppress(AssertionError, _Stuck):
            wait_until(started, START_MAX_S, what="the gateway's start")
            return self
        assert self.proc is not None
        cpu = tree_cpu(self.proc.pid)
        # where it is: PYTHONFAULTHANDLER (set at the start) prints every thread's stack on SIGABRT
        self.proc.send_signal(signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        log = self.log()  # before stop(), which removes the directory the log is in
        self.stop()
        raise RuntimeError(
            f"gateway not ready within {time.monotonic() - t0:.0f}s ({cpu:.1f}s of CPU; {seen[0]}):\n{log}"
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def server_log(self) -> str:
        """The log without the access log's lines (a JSON object each): start-up, backends taken out,
        probes timed out - what a failed test reports."""
        return "\n".join(line for line in self.log().splitlines() if not line.startswith("{"))

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisServer:
    """A real redis-server on a free loopback port, no persistence. Fails (never skips) when missing."""

    def __init__(self, port: int | None = None) -> None:
        self._chosen = port is None  # the port was chosen here: another one may be taken instead
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        """Start it, and wait until it listens. A port another process took before this one bound it
        (engines/sim/launcher.py says how; the other run's redis-server would share its keys) is
        given up for a new one, or fails when the caller gave it."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed: run `make test` (it installs it) or apt-get install redis-server"
            )
        for _ in range(5):
            proc = self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            wait_until(lambda: port_open("127.0.0.1", self.port), what="redis-server")
            if not taken_by_another(self.port, (proc.pid,), proc.poll() is not None):
                return self
            _stop(proc)
            if not self._chosen:
                raise RuntimeError(f"port {self.port} is held by another process")
            self.port = free_port()
            self.url = f"redis://127.0.0.1:{self.port}/0"
        raise RuntimeError("redis-server: every port tried was taken")

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
