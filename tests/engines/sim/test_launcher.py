"""The launcher: start, readiness, failure with stderr, stop by PID."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from engines.sim.launcher import SimProcess, SimStartError, free_port, listener_held_by, port_open
from tests.support import HTTP

pytestmark = pytest.mark.processes


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert not port_open("127.0.0.1", port)


def test_bad_flag_raises_with_stderr() -> None:
    with pytest.raises(SimStartError, match="unrecognized arguments: --no-such-flag"):
        SimProcess("vllm", extra=["--no-such-flag"]).start()


class _Silent(SimProcess):
    """A process that starts and never listens (as a simulator stuck in its start would)."""

    @property
    def argv(self) -> list[str]:
        return [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]


def test_a_start_that_never_listens_says_where_it_is() -> None:
    sim = _Silent("vllm", start_timeout=1.0)
    with pytest.raises(SimStartError) as failed:
        sim.start()
    message = str(failed.value)
    assert "not listening" in message and "s of CPU so far" in message
    assert "time.sleep" in message or "<string>" in message  # the stuck thread's stack
    assert not sim.alive()


def test_start_stop_by_pid() -> None:
    proc = SimProcess("sglang", extra=["--fast"])
    assert proc.argv[1:5] == ["-m", "engines.sim", "--engine", "sglang"]
    proc.start()
    try:
        assert proc.alive() and proc.pid > 0
        assert proc.base_url == f"http://127.0.0.1:{proc.port}"
        assert HTTP.get(proc.base_url + "/health").status_code == 200
    finally:
        proc.stop()
    assert not proc.alive() and not port_open("127.0.0.1", proc.port)
    proc.stop()  # idempotent


def _listener(port: int = 0) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(8)
    return s


def test_who_listens_on_a_port_is_read_from_proc() -> None:
    with _listener() as s:
        port = s.getsockname()[1]
        assert listener_held_by(port, (os.getpid(),)) is True
        assert listener_held_by(port, (os.getppid(),)) is False
    assert listener_held_by(port, (os.getpid(),)) is None  # nothing listens there now


def test_a_port_taken_before_the_simulator_binds_it_is_never_taken_for_it() -> None:
    """Another process listening on the simulator's port (chosen free, taken before the simulator
    bound it) answers connections there: the launcher must not call that simulator ready. A port
    it chose is replaced by a new one; a port the caller gave is an error."""
    proc = SimProcess("vllm", extra=["--fast"])
    taken = proc.port
    with _listener(taken):
        proc.start()
        try:
            assert proc.port != taken and proc.alive()
            assert HTTP.get(proc.base_url + "/health", timeout=10).status_code == 200
        finally:
            proc.stop()
    with _listener() as s:
        given = s.getsockname()[1]
        with pytest.raises(SimStartError, match=f"port {given} is held by another process"):
            SimProcess("vllm", port=given, extra=["--fast"]).start()
