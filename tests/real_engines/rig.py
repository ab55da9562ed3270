"""A gateway in front of real engine servers, and readers for the engines' and the gateway's metrics."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import msgpack  # type: ignore[import-untyped]  # no stubs
import zmq

from tests.conftest import MODEL, single_pool_config
from tests.real_engines.servers import EngineServer
from tests.support import zmq_joined

#: the `--api-key` the session's servers are started with (conftest.py), and the environment variable
#: the tests' gateways read it from (`api_key_env`)
ENGINE_KEY = "real-engine-key-7f3a9c1e5b2d4086"
ENGINE_KEY_ENV = "REAL_ENGINE_API_KEY"
#: what a request sent straight to an engine carries (a simulator started without `--api-key` ignores it)
ENGINE_HEADERS = {"authorization": f"Bearer {ENGINE_KEY}"}
RUNNING = {"vllm": "vllm:num_requests_running", "sglang": "sglang:num_running_reqs"}
# Engine-side evidence that a request was aborted (not finished): a counter that moves only then.
ABORTED = {
    "vllm": ("vllm:request_success_total", 'finished_reason="abort"'),
    "sglang": ("sglang:num_aborted_requests_total", ""),
}


def real_pool_config(dialect: str, urls: list[str], served: str, **overrides: Any) -> dict[str, Any]:
    """`single_pool_config` for real servers: their served name, their 4096-token context, and their
    key (`ENGINE_KEY_ENV`)."""
    config = single_pool_config(dialect, urls, **overrides)
    config["pools"][0]["models"] = {MODEL: served}
    config["pools"][0]["api_key_env"] = ENGINE_KEY_ENV
    config["models"][0]["context_length"] = 4096
    if "upstream" not in overrides:
        # a real engine on 2 cores shared with the suite answers its health path seconds late; a test
        # of routing must not see it marked unhealthy for that (health has tests of its own)
        config["upstream"]["health"].update(timeout_s=15.0, failure_threshold=10)
    return config


def metric(text: str, name: str, having: str = "") -> float:
    """The sum of `name`'s samples whose labels contain `having` (0 when there are none)."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", re.MULTILINE)
    return sum(float(v) for labels, v in pattern.findall(text) if having in labels)


def engine_metric(server: EngineServer, name: str, having: str = "") -> float:
    response = httpx.get(server.base_url + "/metrics", timeout=10, trust_env=False)
    assert response.status_code == 200
    return metric(response.text, name, having)


def running(server: EngineServer) -> float:
    return engine_metric(server, RUNNING[server.engine])


def aborted(server: EngineServer) -> float:
    name, having = ABORTED[server.engine]
    return engine_metric(server, name, having)


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 8, **extra}


def engine_connections(server: EngineServer) -> dict[int, str]:
    """The server's end of every TCP connection to its port, by the peer's (client's) port: the
    kernel's state (`ESTAB`, `CLOSE-WAIT` once the peer has closed while the server has not yet,
    `TIME-WAIT` after a close the server began, ...). Read with `ss` (netlink: one consistent
    snapshot; /proc/net/tcp, read a page at a time, skips sockets while others come and go), so it
    does not wait for the server's event loop. Beside the full suite one `ss` can take more than
    10 s: it gets 60."""
    argv = ["ss", "-Htan", f"sport = :{server.port}"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
    found: dict[int, str] = {}
    for line in out.splitlines():
        fields = line.split()
        if fields and fields[0] != "LISTEN":
            found[int(fields[4].rsplit(":", 1)[1])] = fields[0]
    return found


def kv_event_batches(
    endpoint: str, send: Callable[[], object], seqs: list[int] | None = None, timeout: float = 10
) -> Iterator[list[Any]]:
    """Subscribes to the KV events published at `endpoint` (topic `kv`), calls `send` (a request to
    the engine), then yields each message's events (its frames checked, its sequence appended to
    `seqs`) for `timeout` seconds or until the caller stops."""
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.setsockopt(zmq.LINGER, 0)
        zmq_joined(sub, endpoint)  # a SUB socket misses what is published before it has joined
        send()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not sub.poll(500):
                continue
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"kv" and len(seq) == 8
            if seqs is not None:
                seqs.append(int.from_bytes(seq, "big"))
            timestamp, events, _dp_rank = msgpack.unpackb(payload, strict_map_key=False)
            assert timestamp > 0
            yield events
    finally:
        sub.close()
        context.term()
