"""A real server can be killed like a crashed backend and brought back on the same ports (what the
failover and disconnect tests build on). Runs after test_engines_up.py; the restart costs one startup."""

from __future__ import annotations

import time

import httpx
import pytest

from engines.sim.launcher import port_open
from tests.real_engines.servers import VllmServer, group_members

pytestmark = pytest.mark.timeout(300)


def test_kill_then_restart_on_the_same_ports(real_vllm: VllmServer) -> None:
    pid, port, kv_port = real_vllm.pid, real_vllm.port, real_vllm.kv_events_port
    assert len(group_members(pid)) >= 2  # the API server and its engine-core worker
    real_vllm.kill()
    assert not real_vllm.alive()
    assert group_members(pid) == []  # no worker outlived the leader
    assert not port_open("127.0.0.1", port)

    started = time.monotonic()
    real_vllm.restart()
    assert (real_vllm.port, real_vllm.kv_events_port) == (port, kv_port)
    assert real_vllm.pid != pid
    assert real_vllm.startup_s is not None and real_vllm.startup_s <= time.monotonic() - started
    response = httpx.post(
        real_vllm.base_url + "/v1/chat/completions",
        json={
            "model": real_vllm.served_model_name,
            "messages": [{"role": "user", "content": "Back?"}],
            "max_tokens": 2,
        },
        timeout=60,
    )
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] <= 2
