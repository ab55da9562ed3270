"""Faults set by command-line flag, each needing its own simulator process."""

from __future__ import annotations

import socket

import httpx
import pytest

from engines.sim.launcher import SimProcess
from tests.engines.sim.helpers import USER, post, sim
from tests.support import HTTP, wait_until

pytestmark = pytest.mark.processes

CHAT = "/v1/chat/completions"


def test_startup_delay_flag_and_listen_delay() -> None:
    late = SimProcess("vllm", extra=["--fast", "--listen-delay", "0.8"], wait=False)
    with late:  # started first, checked last: both boot at the same time
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", late.port)) != 0  # refused: nothing listens yet
        with sim("sglang", "--startup-delay", "30") as p:
            assert HTTP.get(p.base_url + "/health").status_code == 503
            assert HTTP.get(p.base_url + "/health_generate").status_code == 503
            assert post(p.base_url, CHAT, {"messages": USER}).status_code == 503
        late.wait_ready(10)
        assert HTTP.get(late.base_url + "/health").status_code == 200


def test_crash_exit_kills_the_process() -> None:
    with sim("vllm", "--crash-after", "2", "--crash-mode", "exit") as p:
        with pytest.raises(httpx.TransportError):
            post(p.base_url, CHAT, {"messages": USER, "stream": True, "max_tokens": 20})
        wait_until(lambda: not p.alive(), what="the simulator's exit")


def test_refuse_flag() -> None:
    errors = (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)
    # the port is open, but every connection is closed at once
    with SimProcess("vllm", extra=["--fast", "--refuse"]) as p, pytest.raises(errors):
        HTTP.get(p.base_url + "/health", timeout=2)
