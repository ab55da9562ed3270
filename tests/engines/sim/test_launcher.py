"""The launcher: start, readiness, failure with stderr, stop by PID."""

from __future__ import annotations

import socket

import httpx
import pytest

from engines.sim.launcher import SimProcess, SimStartError, free_port, port_open


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert not port_open("127.0.0.1", port)


def test_bad_flag_raises_with_stderr() -> None:
    with pytest.raises(SimStartError, match="unrecognized arguments: --no-such-flag"):
        SimProcess("vllm", extra=["--no-such-flag"]).start()


def test_start_stop_by_pid() -> None:
    proc = SimProcess("sglang", extra=["--fast"])
    assert proc.argv[1:5] == ["-m", "engines.sim", "--engine", "sglang"]
    proc.start()
    try:
        assert proc.alive() and proc.pid > 0
        assert proc.base_url == f"http://127.0.0.1:{proc.port}"
        assert httpx.get(proc.base_url + "/health").status_code == 200
    finally:
        proc.stop()
    assert not proc.alive() and not port_open("127.0.0.1", proc.port)
    proc.stop()  # idempotent
