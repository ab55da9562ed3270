"""Metrics with two uvicorn workers: every scrape, whichever worker answers it, shows the whole process
group — counters summed, gauges merged by their rule — and a killed worker's gauges leave the sums."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.support import HTTP, GatewayProcess, wait_until

pytestmark = pytest.mark.processes

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(base_url: str) -> Samples:
    # A new connection each time, so scrapes land on either worker.
    text = HTTP.get(base_url + "/metrics", headers={"authorization": "Bearer t0ken"}, timeout=5).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _v(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), float("nan"))


def _workers(parent: int) -> list[int]:
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    out = []
    for pid in map(int, children):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"spawn_main" in cmd:
            out.append(pid)
    return sorted(out)


def _chat(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"count to {i}"}],
        "max_tokens": 6,
        **extra,
    }


def test_two_workers_aggregate_and_forget_dead_workers(tmp_path: Path) -> None:
    mp = tmp_path / "mp"
    mp.mkdir()
    (mp / "counter_999999.db").write_bytes(b"\x00" * 16)  # an earlier run's leftovers: must be cleaned
    with fast_sim("vllm", "--drip-ms", "40") as sim:
        config = single_pool_config("vllm", [sim.base_url])
        config["server"]["workers"] = 2
        config["pools"][0]["weight"] = 0.75
        config["metrics"] = {"bearer_token": "t0ken"}
        with GatewayProcess(config, env={"PROMETHEUS_MULTIPROC_DIR": str(mp)}) as gw:
            wait_until(lambda: len(_workers(gw.pid)) == 2, 15, what="two workers")
            assert HTTP.get(gw.base_url + "/metrics", timeout=5).status_code == 401

            prompt = completion = 0
            for i in range(30):
                r = HTTP.post(gw.base_url + "/v1/chat/completions", json=_chat(i), timeout=10)
                assert r.status_code == 200, r.text
                prompt += r.json()["usage"]["prompt_tokens"]
                completion += r.json()["usage"]["completion_tokens"]
            writers = {p.name.rsplit("_", 1)[1] for p in mp.glob("counter_*.db")}
            assert len(writers) == 2, f"both workers served requests: {writers}"

            # Gauges are sampled every second in each worker: let the other worker's last
            # sample (taken while a request was still in flight) be replaced before asserting.
            wait_until(
                lambda: _v(_scrape(gw.base_url), "gateway_in_flight_requests", pool="vllm") == 0,
                5,
                "in-flight 0 after the requests",
            )
            for _ in range(8):
                s = _scrape(gw.base_url)
                assert (
                    _v(s, "gateway_requests_total", pool="vllm", model=MODEL, endpoint="chat", status="200")
                    == 30
                )
                assert _v(s, "gateway_prompt_tokens_total", pool="vllm", model=MODEL) == prompt
                assert _v(s, "gateway_completion_tokens_total", pool="vllm", model=MODEL) == completion
                assert _v(s, "gateway_request_duration_seconds_count", pool="vllm", model=MODEL) == 30
                assert _v(s, "gateway_backend_healthy", pool="vllm", backend="vllm-0") == 1  # min, not a sum
                assert _v(s, "gateway_pool_weight", pool="vllm") == 0.75
                assert _v(s, "gateway_in_flight_requests", pool="vllm") == 0

            # A long stream in flight: whichever worker holds it, every scrape sees exactly one.
            done = threading.Event()

            def stream() -> None:
                body = _chat(99, stream=True, max_tokens=40)
                with HTTP.stream("POST", gw.base_url + "/v1/chat/completions", json=body, timeout=20) as r:
                    for _ in r.iter_bytes():
                        pass
                done.set()

            t = threading.Thread(target=stream)
            t.start()
            wait_until(
                lambda: _v(_scrape(gw.base_url), "gateway_in_flight_requests", pool="vllm") == 1,
                5,
                "in-flight 1",
            )
            assert all(
                _v(_scrape(gw.base_url), "gateway_in_flight_requests", pool="vllm") == 1 for _ in range(4)
            )
            t.join(20)
            assert done.is_set()
            wait_until(
                lambda: _v(_scrape(gw.base_url), "gateway_in_flight_requests", pool="vllm") == 0,
                5,
                "in-flight 0",
            )

            # Kill a worker: uvicorn starts another; the dead one's gauges go, its counts stay.
            before = _workers(gw.pid)
            victim = before[0]
            os.kill(victim, signal.SIGKILL)
            wait_until(
                lambda: len(_workers(gw.pid)) == 2 and victim not in _workers(gw.pid),
                20,
                "a replacement worker",
            )
            wait_until(lambda: HTTP.get(gw.base_url + "/readyz", timeout=2).status_code == 200, 10, "ready")
            for _ in range(6):
                s = _scrape(gw.base_url)
                assert (
                    _v(s, "gateway_requests_total", pool="vllm", model=MODEL, endpoint="chat", status="200")
                    == 31
                )
                assert _v(s, "gateway_backend_healthy", pool="vllm", backend="vllm-0") == 1
                assert _v(s, "gateway_pool_weight", pool="vllm") == 0.75
            assert not list(mp.glob(f"gauge_live*_{victim}.db")), "the dead worker's gauges were reaped"
            assert list(mp.glob(f"counter_{victim}.db")), "its counters stay in the totals"
    assert not (mp / "counter_999999.db").exists()
