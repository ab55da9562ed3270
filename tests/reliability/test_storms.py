"""Whole-pool failures: 5xx storms, refused connections, and a backend that dies and comes back.

Each storm puts both backends of a pool into the same failure and sends a burst of requests. The
gateway must answer every one in OpenAI's error shape (never hang, never a stack trace or a backend
address), and the upstream attempts the simulators counted must stay within the retry rules:
at most `max_attempts` per request and, across the burst, at most the retry budget
(its initial bucket + `RATIO` per request + `MIN_PER_S` per second elapsed: gateway/upstream/retry.py).
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
import pytest

from engines.sim.launcher import SimProcess
from gateway.upstream.retry import MIN_PER_S, RATIO
from tests.conftest import fast_sim, single_pool_config
from tests.reliability.support import chat, events, metric, sim_faults, sim_stats
from tests.support import GatewayProcess, wait_until

pytestmark = pytest.mark.processes

#: requests in the burst: each wants a retry, more than the budget allows
BURST = 150
BUCKET = max(10 * MIN_PER_S, 10.0)  # gateway/upstream/retry.py: the bucket starts full


def _assert_openai_error(r: httpx.Response, sims: list[SimProcess]) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    for sim in sims:
        assert str(sim.port) not in r.text and "127.0.0.1" not in r.text
    assert "Traceback" not in r.text
    return dict(body["error"])


@pytest.mark.parametrize("kind", ["503", "429", "500", "refuse"])
def test_storm_on_every_backend(kind: str) -> None:
    flags = ["--refuse"] if kind == "refuse" else ["--fault-rate", "1", "--fault-kind", kind]
    with fast_sim("vllm", *flags) as a, fast_sim("vllm", *flags) as b:
        config = single_pool_config(
            "vllm",
            [a.base_url, b.base_url],
            upstream={
                "health": {"interval_s": 3600, "failure_threshold": 1000},
                "retries": {"max_attempts": 3},
            },
        )
        config["routing"]["policy"] = "round_robin"
        # --refuse closes connections at accept: the gateway starts without a healthy backend.
        with GatewayProcess(config, ready=kind != "refuse") as gw:
            started = time.monotonic()
            with httpx.Client(base_url=gw.base_url, timeout=15) as http:

                def one(i: int) -> httpx.Response:
                    return http.post("/v1/chat/completions", json=chat(i, stream=i % 2 == 0))

                with ThreadPoolExecutor(8) as pool:
                    responses = list(pool.map(one, range(BURST)))
                elapsed = time.monotonic() - started
                metrics = http.get("/metrics").text
            # An engine's 429 is the engine being overloaded, not the client's rate limit: 503 (docs/api.md).
            expected = {"503": 503, "429": 503, "500": 500, "refuse": 503}[kind]
            for r in responses:
                assert r.status_code == expected, r.text
                err = _assert_openai_error(r, [a, b])
                if expected >= 500:
                    assert err["type"] == "server_error"
            if kind == "refuse":
                # The start-up probe already found both unhealthy: requests are refused at routing,
                # and any attempt that is made counts as an upstream error.
                attempts = metric(metrics, "gateway_upstream_errors_total")
            else:
                attempts = sim_stats(a.base_url)["requests_total"] + sim_stats(b.base_url)["requests_total"]
            retries = attempts - (0 if kind == "refuse" else BURST)
            if kind == "500":
                # Not a "try elsewhere" status: passed through once, never retried.
                assert attempts == BURST
            else:
                assert attempts <= BURST * 2, "at most one retry per request with two backends"
                budget = BUCKET + RATIO * BURST + MIN_PER_S * elapsed + 1
                if kind != "refuse":
                    assert 0 < retries <= budget, (retries, budget)
            print(f"\nstorm {kind}: {BURST} requests, {attempts:.0f} upstream attempts in {elapsed:.2f}s")


def test_backend_that_dies_and_comes_back() -> None:
    sim = fast_sim("vllm")
    port = sim.port
    with sim:
        config = single_pool_config(
            "vllm",
            [sim.base_url],
            upstream={"health": {"interval_s": 0.2, "timeout_s": 0.5, "failure_threshold": 2, "open_s": 0.5}},
        )
        with GatewayProcess(config) as gw, httpx.Client(base_url=gw.base_url, timeout=10) as http:
            assert http.post("/v1/chat/completions", json=chat()).status_code == 200
            sim.stop()

            def circuit_open() -> bool:
                return metric(http.get("/metrics").text, "gateway_backend_circuit_open") == 1

            wait_until(circuit_open, timeout=5, what="circuit open")
            for i in range(6):
                r = http.post("/v1/chat/completions", json=chat(i, stream=i % 2 == 0))
                assert r.status_code == 503, r.text
                assert _assert_openai_error(r, [sim])["type"] == "server_error"
            assert http.get("/readyz").status_code == 503

            back = SimProcess("vllm", port, sim.extra)
            with back:

                def serving() -> bool:
                    return http.post("/v1/chat/completions", json=chat()).status_code == 200

                wait_until(serving, timeout=5, what="traffic back on the revived backend")
                assert not circuit_open()
                assert http.get("/readyz").status_code == 200
                r = http.post("/v1/chat/completions", json=chat(stream=True))
                assert r.status_code == 200 and events(r.text)[-1] == "[DONE]"
                assert sim_stats(back.base_url)["completed_total"] >= 2


def test_flapping_backend_midstream_errors_are_events_never_hangs() -> None:
    """Half the streams of a backend crash mid-way: each ends with one error event and [DONE]."""
    with fast_sim("vllm", "--itl-ms", "2") as sim:
        config = single_pool_config(
            "vllm", [sim.base_url], upstream={"health": {"interval_s": 3600, "failure_threshold": 1000}}
        )
        with GatewayProcess(config) as gw, httpx.Client(base_url=gw.base_url, timeout=15) as http:
            outcomes = {"ok": 0, "error_event": 0}
            for i in range(12):
                sim_faults(sim.base_url, crash_after=3 if i % 2 else None, crash_mode="cut")
                r = http.post("/v1/chat/completions", json=chat(i, stream=True, max_tokens=20, min_tokens=20))
                assert r.status_code == 200
                evs = events(r.text)
                assert evs[-1] == "[DONE]"
                errors = [e for e in evs[:-1] if "error" in orjson.loads(e)]
                assert len(errors) == (1 if i % 2 else 0)
                outcomes["error_event" if errors else "ok"] += 1
            assert outcomes == {"ok": 6, "error_event": 6}


def test_5xx_burst_on_one_backend_is_isolated_under_least_load() -> None:
    """A backend failing fast looks least loaded; its circuit must keep the traffic away from it."""
    sims = [fast_sim("vllm", "--itl-ms", "20") for _ in range(3)]
    for s in sims:
        s.start()
    try:
        config = single_pool_config(
            "vllm",
            [s.base_url for s in sims],
            upstream={"health": {"interval_s": 3600, "failure_threshold": 3, "open_s": 1.0}},
        )
        config["routing"]["policy"] = "least_load"
        with GatewayProcess(config) as gw:
            statuses: dict[int, int] = {}
            stop = threading.Event()

            def client() -> None:
                with httpx.Client(base_url=gw.base_url, timeout=20) as http:
                    while not stop.is_set():
                        r = http.post("/v1/chat/completions", json=chat(max_tokens=10, stream=True))
                        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1

            threads = [threading.Thread(target=client) for _ in range(16)]
            for t in threads:
                t.start()
            try:
                wait_until(lambda: sum(statuses.values()) >= 50, what="traffic on the three backends")
                before = sim_stats(sims[0].base_url)["requests_total"]
                sim_faults(sims[0].base_url, fault_rate=1, fault_kind="503")
                turned, answered = time.monotonic(), statuses.get(200, 0)
                wait_until(lambda: statuses.get(200, 0) >= answered + 150, 30, "answers during the burst")
                during = sim_stats(sims[0].base_url)["requests_total"] - before
                half_open = math.ceil(time.monotonic() - turned)  # periods of open_s (1 s) it lasted
                sim_faults(sims[0].base_url, reset=True)
            finally:
                stop.set()
                for t in threads:
                    t.join(20)
            print(f"\n503 burst on 1 of 3 (least_load): {statuses}; failing backend got {during} requests")
            # Before the fix in gateway/core/circuit.py: ~1000 requests in 3 s and most clients got 503.
            # What may still reach it: the 16 clients' requests already on their way when it turned
            # (least load sends there: failing fast, it looks idle), the failures that open the
            # circuit, and a trial each time it half-opens (twice that: more requests are in flight
            # at the moment it turns on a loaded machine).
            assert during <= 16 + 3 + half_open * 2, (during, half_open)
            assert statuses.get(503, 0) <= 3, statuses
            assert statuses.get(200, 0) > 50
    finally:
        for s in sims:
            s.stop()
