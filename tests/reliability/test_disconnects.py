"""Clients that go away at every phase of a request: nothing may leak and the engine must stop.

One gateway (auth on, one concurrent request per user, so a leaked concurrency slot shows as a 429)
in front of two simulators: `fast` (20 ms per token) and `slowfirst` (3 s before the first token).
After every phase: the engines run nothing, no engine request ran to its end, the gateway's
in-flight gauges are 0, and the same user is admitted again at once (its slot was released).
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from engines.sim.launcher import SimProcess
from gateway.demo import SERVED
from tests.conftest import MODEL, fast_sim
from tests.reliability.support import (
    SECRET,
    RawClient,
    bearer,
    chat,
    http_request,
    metric,
    open_fds,
    sim_faults,
    sim_stats,
    token,
)
from tests.support import HTTP, GatewayProcess, wait_until

pytestmark = pytest.mark.processes

SLOW_MODEL = "slow-first-model"


class Rig:
    def __init__(self, gw: GatewayProcess, fast: SimProcess, slow: SimProcess) -> None:
        self.gw, self.fast, self.slow = gw, fast, slow
        self.auth = bearer(token("alice"))

    def stats(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return sim_stats(self.fast.base_url), sim_stats(self.slow.base_url)

    def completed(self) -> int:
        a, b = self.stats()
        return int(a["completed_total"]) + int(b["completed_total"])

    def cancelled(self) -> int:
        a, b = self.stats()
        return int(a["cancelled_total"]) + int(b["cancelled_total"])

    def engine_requests(self) -> int:
        a, b = self.stats()
        return int(a["requests_total"]) + int(b["requests_total"])

    def running(self) -> int:
        a, b = self.stats()
        return int(a["running"]) + int(b["running"])

    def start(self, c: RawClient, body: dict[str, Any], *, arrived: bool = False) -> None:
        """Send `body` on `c` and wait until the engine runs it (`arrived`: until it reached the engine).

        The gateway releases a request's concurrency slot just after its last byte went out, so a
        request sent the moment the previous test's probe was answered can meet the slot still held
        (429; seen once in CI). Such an early answer is read and the request sent again, twice at most.
        """
        for _ in range(3):
            engine_before = self.engine_requests()
            c.send(http_request("/v1/chat/completions", body, headers=self.auth))
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                if (self.engine_requests() > engine_before) if arrived else (self.running() == 1):
                    return
                if select.select([c.sock], [], [], 0.02)[0]:
                    if c.sock.recv(12, socket.MSG_PEEK).startswith(b"HTTP/1.1 200"):
                        return  # a stream's head: the engine has started
                    status, _, answer = c.read_response()
                    assert status == 429, (status, answer[:300])
                    wait_until(self.idle, what="the previous request's slot released")  # then again
                    break
            else:
                raise AssertionError("timed out after 3s waiting for the engine to start the request")
        raise AssertionError("the user's slot stayed held for three tries")

    def idle(self) -> bool:
        """The gateway holds no request (its slot is released with it)."""
        return (
            metric(HTTP.get(self.gw.base_url + "/metrics", timeout=5).text, "gateway_in_flight_requests") == 0
        )

    def assert_settled(self, completed_before: int) -> None:
        """Nothing runs, nothing leaked, nothing was generated to its end, the user is admitted."""
        wait_until(lambda: self.running() == 0, timeout=3, what="engines idle")
        assert self.completed() == completed_before, "an abandoned engine request ran to its end"
        text = HTTP.get(self.gw.base_url + "/metrics", timeout=5).text
        assert metric(text, "gateway_in_flight_requests") == 0
        assert metric(text, "gateway_backend_in_flight") == 0

        def admitted() -> bool:
            r = HTTP.post(
                self.gw.base_url + "/v1/chat/completions",
                json=chat(max_tokens=1),
                headers=self.auth,
                timeout=10,
            )
            assert r.status_code in (200, 429), r.text
            return r.status_code == 200

        wait_until(admitted, timeout=3, what="the user's concurrency slot to be released")


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    fast = fast_sim("vllm", "--itl-ms", "20")
    slow = fast_sim("vllm", "--ttft-ms", "3000")
    with fast, slow:
        config: dict[str, Any] = {
            "server": {"graceful_shutdown_s": 2},
            "models": [{"name": MODEL, "context_length": 8192}, {"name": SLOW_MODEL, "context_length": 8192}],
            "pools": [
                {
                    "name": "fast",
                    "dialect": "vllm",
                    "models": {MODEL: SERVED["vllm"]},
                    "backends": [{"name": "fast-0", "url": fast.base_url}],
                },
                {
                    "name": "slowfirst",
                    "dialect": "vllm",
                    "models": {SLOW_MODEL: SERVED["vllm"]},
                    "backends": [{"name": "slow-0", "url": slow.base_url}],
                },
            ],
            "upstream": {
                "timeouts": {"first_byte_s": 30, "idle_s": 30},
                "health": {"interval_s": 3600, "failure_threshold": 50},
            },
            "routing": {"scrape_interval_s": 0},
            "auth": {"jwt": {"secret": SECRET}},
            "limits": {"tiers": {"default": {"concurrent_requests": 1}}},
        }
        with GatewayProcess(config) as gw:
            yield Rig(gw, fast, slow)


def _long(stream: bool, model: str = MODEL) -> dict[str, Any]:
    return {**chat(1, max_tokens=400, min_tokens=400, stream=stream), "model": model}


def test_gone_in_the_middle_of_the_header_block(rig: Rig) -> None:
    before, engine_before = rig.completed(), rig.engine_requests()
    with RawClient(rig.gw.port) as c:
        c.send(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthoriz")  # then the close
    assert rig.engine_requests() == engine_before
    rig.assert_settled(before)


def test_gone_after_the_headers_before_the_body(rig: Rig) -> None:
    before, engine_before = rig.completed(), rig.engine_requests()
    body = orjson.dumps(_long(True))
    with RawClient(rig.gw.port) as c:
        c.send(http_request("/v1/chat/completions", body, headers=rig.auth)[: -len(body)])  # then the close
    assert rig.engine_requests() == engine_before
    rig.assert_settled(before)


def test_gone_halfway_through_the_body(rig: Rig) -> None:
    before, engine_before = rig.completed(), rig.engine_requests()
    raw = http_request("/v1/chat/completions", _long(True), headers=rig.auth)
    with RawClient(rig.gw.port) as c:
        c.send(raw[: len(raw) - 20])  # then the close
    assert rig.engine_requests() == engine_before
    rig.assert_settled(before)


def test_gone_while_waiting_for_the_first_token(rig: Rig) -> None:
    before, cancelled = rig.completed(), rig.cancelled()
    with RawClient(rig.gw.port) as c:
        # The simulator's 3 s before the first token come before its scheduler sees the request
        # (`running` stays 0 meanwhile): wait for the request to reach it.
        rig.start(c, _long(True, SLOW_MODEL), arrived=True)
    wait_until(lambda: rig.cancelled() > cancelled, what="engine request cancelled")
    # The engine's first token is due 3 s after the start: nothing completed, so the cancel came
    # before it
    rig.assert_settled(before)


def test_gone_while_the_engine_stalls(rig: Rig) -> None:
    before, cancelled = rig.completed(), rig.cancelled()
    sim_faults(rig.fast.base_url, stall=True)
    try:
        engine_before = rig.engine_requests()
        with RawClient(rig.gw.port) as c:
            c.send(http_request("/v1/chat/completions", _long(True), headers=rig.auth))
            wait_until(lambda: rig.engine_requests() > engine_before, timeout=3, what="engine request")
        wait_until(lambda: rig.cancelled() > cancelled, timeout=2, what="stalled request dropped")
    finally:
        sim_faults(rig.fast.base_url, stall=False)
    rig.assert_settled(before)


def test_gone_mid_stream(rig: Rig) -> None:
    before, cancelled = rig.completed(), rig.cancelled()
    with RawClient(rig.gw.port) as c:
        c.send(http_request("/v1/chat/completions", _long(True), headers=rig.auth))
        head = c.read_until(b"data: ")
        assert head.startswith(b"HTTP/1.1 200"), head[:200]
    wait_until(lambda: rig.cancelled() > cancelled, timeout=2, what="engine request cancelled")
    rig.assert_settled(before)


def test_gone_during_a_non_streamed_generation(rig: Rig) -> None:
    # 400 tokens at 20 ms: the engine would take 8 s. Before the fix in gateway/upstream/proxy.py
    # (`_DisconnectWatch`) it ran to its end although nobody was waiting for the answer.
    before, cancelled = rig.completed(), rig.cancelled()
    with RawClient(rig.gw.port) as c:
        rig.start(c, _long(False))  # the engine is generating: then the close
    wait_until(lambda: rig.cancelled() > cancelled, timeout=2, what="engine request cancelled")
    rig.assert_settled(before)


def test_many_abandoned_requests_leave_no_sockets_behind(rig: Rig) -> None:
    with httpx.Client(base_url=rig.gw.base_url, timeout=10) as http:  # warm the upstream pool
        assert http.post("/v1/chat/completions", json=chat(), headers=rig.auth).status_code == 200
    baseline = open_fds(rig.gw.pid)
    before = rig.completed()
    for i in range(16):
        with RawClient(rig.gw.port) as c:
            if i % 3 == 0:
                rig.start(c, _long(i % 2 == 0))
            else:
                c.send(http_request("/v1/chat/completions", _long(i % 2 == 0), headers=rig.auth))
        wait_until(lambda: rig.running() == 0, timeout=3, what="engine idle")
    rig.assert_settled(before)
    # The upstream pool may keep a couple of idle keep-alive connections; no more.
    wait_until(lambda: open_fds(rig.gw.pid) <= baseline + 2, timeout=5, what="descriptors back to baseline")
