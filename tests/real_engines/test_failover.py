"""Failover before the first byte, with real engines behind the gateway.

- **Refused**: a pool of a real server and a backend that was healthy when the gateway started (a
  stub answering the probes) and then stopped listening: connecting to it is refused. Every request
  succeeds via the real server, whole or streamed, and the gateway counts the refused attempts.
- **Killed**: a pool of two real vLLM servers (the session's and a spare); the spare's whole process
  group is SIGKILLed, as a crash would, and every request right after (before any probe has noticed)
  succeeds via the other. The spare is not restarted: no other test uses it, and its memory is freed.

The gateway's probes are slowed down (every 30 s) so that the requests, not the probes, meet the
dead backend.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import orjson
import pytest

from engines.sim.launcher import port_open
from tests.real_engines.rig import chat, metric, real_pool_config
from tests.real_engines.servers import EngineServer, VllmServer, group_members
from tests.support import GatewayProcess, free_port, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.timeout(300),
]  # the first test may wait for a server's startup

REQUESTS = 8
SLOW_PROBES = {"health": {"interval_s": 30, "failure_threshold": 2, "open_s": 30}}


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # /health and /metrics: 200, empty
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _send_all(gateway: GatewayProcess) -> None:
    """REQUESTS requests, half streamed; each must complete, with its usage."""
    with httpx.Client(base_url=gateway.base_url, timeout=60, trust_env=False) as client:
        for i in range(REQUESTS):
            body = chat(f"request {i}: a different prompt each time", max_tokens=6, ignore_eos=True)
            if i % 2:
                body["stream"] = True
                body["stream_options"] = {"include_usage": True}
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            if i % 2:
                events = [e for e in r.text.split("\n\n") if e]
                assert events[-1] == "data: [DONE]"
                chunks = [orjson.loads(e.removeprefix("data: ")) for e in events[:-1]]
                assert not any("error" in c for c in chunks)
                assert chunks[-1]["usage"]["completion_tokens"] == 6
            else:
                assert r.json()["usage"]["completion_tokens"] == 6


def _gateway_metrics(gateway: GatewayProcess) -> str:
    """The gateway's metrics once every request is counted (each is, just after its last byte), all of
    them answered by the live backend (`<pool>-1`)."""
    pool = gateway.config["pools"][0]["name"]

    def text() -> str:
        return httpx.get(gateway.base_url + "/metrics", timeout=10, trust_env=False).text

    wait_until(
        lambda: metric(text(), "gateway_backend_requests_total", f'backend="{pool}-1"') == REQUESTS,
        5,
        f"all {REQUESTS} requests answered by {pool}-1",
    )
    return text()


@pytest.fixture()
def vanishing() -> Iterator[tuple[str, ThreadingHTTPServer]]:
    """A backend that answers its probes until stopped; then nobody listens on its port."""
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Healthy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()


def test_refused_backend_fails_over(
    real_engine: EngineServer, vanishing: tuple[str, ThreadingHTTPServer]
) -> None:
    url, stub = vanishing
    config = real_pool_config(
        real_engine.engine, [url, real_engine.base_url], real_engine.served_model_name, upstream=SLOW_PROBES
    )
    with GatewayProcess(config) as gateway:
        stub.shutdown()
        stub.server_close()  # the port now refuses connections
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2, trust_env=False)
        _send_all(gateway)
        text = _gateway_metrics(gateway)
    pool = real_engine.engine
    assert metric(text, "gateway_upstream_errors_total", f'pool="{pool}"') >= 1, "no attempt met the refusal"
    assert metric(text, "gateway_backend_requests_total", f'backend="{pool}-0"') == 0


def test_killed_engine_fails_over(real_vllm: VllmServer, real_vllm_spare: VllmServer) -> None:
    config = real_pool_config(
        "vllm",
        [real_vllm_spare.base_url, real_vllm.base_url],
        real_vllm.served_model_name,
        upstream=SLOW_PROBES,
    )
    with GatewayProcess(config) as gateway:
        pgid, port = real_vllm_spare.pid, real_vllm_spare.port
        assert len(group_members(pgid)) >= 2  # the API server and its engine-core worker
        real_vllm_spare.kill()  # SIGKILL to its process group: the API server and the engine core
        assert not real_vllm_spare.alive()
        assert group_members(pgid) == []  # no worker outlived the leader
        assert not port_open("127.0.0.1", port)
        _send_all(gateway)
        text = _gateway_metrics(gateway)
    assert metric(text, "gateway_upstream_errors_total", 'pool="vllm"') >= 1, "no attempt met the dead engine"
    assert metric(text, "gateway_backend_requests_total", 'backend="vllm-0"') == 0
