"""Upstream faults end to end: real simulators with fault flags behind a real gateway process."""

from __future__ import annotations

import signal
import threading
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.support import HTTP, GatewayProcess, wait_until

pytestmark = pytest.mark.processes


def _chat(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"question number {i}"}],
        "max_tokens": 8,
        **extra,
    }


def _events(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


def _stats(base_url: str) -> dict[str, Any]:
    return dict(HTTP.get(base_url + "/sim/stats", timeout=5).json())


def _quiet_health(**extra: Any) -> dict[str, Any]:
    """Upstream settings whose active probes do not run during the test (passive detection only)."""
    return {"health": {"interval_s": 3600, "failure_threshold": 50}, **extra}


def test_failover_when_backend_answers_503() -> None:
    with fast_sim("vllm", "--fault-rate", "1", "--fault-kind", "503") as bad, fast_sim("vllm") as good:
        config = single_pool_config("vllm", [bad.base_url, good.base_url], upstream=_quiet_health())
        config["routing"]["policy"] = "round_robin"
        with GatewayProcess(config) as gw, httpx.Client(base_url=gw.base_url, timeout=10) as http:
            statuses = [http.post("/v1/chat/completions", json=_chat(i)).status_code for i in range(12)]
            assert statuses == [200] * 12
            assert _stats(bad.base_url)["requests_total"] > 0, "the failing backend was tried"
            metrics = http.get("/metrics").text
            assert 'gateway_upstream_errors_total{kind="status_503",pool="vllm"}' in metrics


def test_failover_when_backend_is_down() -> None:
    with fast_sim("vllm") as doomed, fast_sim("vllm") as good:
        config = single_pool_config("vllm", [doomed.base_url, good.base_url], upstream=_quiet_health())
        config["routing"]["policy"] = "round_robin"
        with GatewayProcess(config) as gw, httpx.Client(base_url=gw.base_url, timeout=10) as http:
            doomed.stop()
            for i in range(10):
                r = http.post("/v1/chat/completions", json=_chat(i, stream=i % 2 == 0))
                assert r.status_code == 200, r.text
                if i % 2 == 0:
                    assert _events(r.text)[-1] == "[DONE]"


def test_failover_when_backend_stalls_before_first_byte() -> None:
    with fast_sim("vllm", "--stall") as stalled, fast_sim("vllm") as good:
        config = single_pool_config(
            "vllm", [stalled.base_url, good.base_url], upstream=_quiet_health(timeouts={"first_byte_s": 0.5})
        )
        config["routing"]["policy"] = "round_robin"
        with GatewayProcess(config) as gw, httpx.Client(base_url=gw.base_url, timeout=10) as http:
            for i in range(4):
                r = http.post("/v1/chat/completions", json=_chat(i, stream=True))
                assert r.status_code == 200
                assert _events(r.text)[-1] == "[DONE]"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_crash_mid_stream_ends_with_one_error_event(engine: str) -> None:
    with fast_sim(engine, "--crash-after", "3", "--crash-mode", "cut") as sim:
        config = single_pool_config(engine, [sim.base_url], upstream=_quiet_health())
        with GatewayProcess(config) as gw, httpx.Client(base_url=gw.base_url, timeout=10) as http:
            r = http.post("/v1/chat/completions", json=_chat(1, stream=True, max_tokens=50))
            assert r.status_code == 200
            events = _events(r.text)
            assert events[-1] == "[DONE]"
            errors = [orjson.loads(e) for e in events[:-1] if "error" in orjson.loads(e)]
            assert len(errors) == 1
            assert errors[0]["error"]["type"] == "server_error"
            assert set(errors[0]["error"]) == {"message", "type", "param", "code"}
            assert all("error" not in orjson.loads(e) for e in events[:-2])


def test_idle_timeout_mid_stream() -> None:
    with fast_sim("vllm", "--drip-ms", "3000") as sim:
        config = single_pool_config(
            "vllm", [sim.base_url], upstream=_quiet_health(timeouts={"idle_s": 0.4, "first_byte_s": 10})
        )
        with GatewayProcess(config) as gw, httpx.Client(base_url=gw.base_url, timeout=20) as http:
            # a token every 3 s would take a minute: the 0.4 s idle timeout ends it, within the
            # client's own timeout
            r = http.post("/v1/chat/completions", json=_chat(1, stream=True, max_tokens=20))
            events = _events(r.text)
            assert events[-1] == "[DONE]"
            assert "went silent" in orjson.loads(events[-2])["error"]["message"]


def test_client_disconnect_cancels_the_engine_request() -> None:
    with fast_sim("vllm", "--itl-ms", "20") as sim:
        config = single_pool_config("vllm", [sim.base_url], upstream=_quiet_health())
        with GatewayProcess(config) as gw:
            with (
                httpx.Client(base_url=gw.base_url, timeout=10) as http,
                http.stream("POST", "/v1/chat/completions", json=_chat(1, stream=True, max_tokens=400)) as r,
            ):
                for _ in r.iter_raw():
                    break
            # leaving the block closed the connection mid-stream
            wait_until(lambda: _stats(sim.base_url)["cancelled_total"] >= 1, what="cancel")
            stats = _stats(sim.base_url)
            # promptly: long before the 400 tokens (8 s) were generated
            assert stats["running"] == 0 and stats["completed_total"] == 0
            assert stats["generation_tokens_total"] < 400, stats


def test_graceful_shutdown_drains_open_streams() -> None:
    with fast_sim("vllm", "--itl-ms", "15") as sim:
        config = single_pool_config("vllm", [sim.base_url], upstream=_quiet_health())
        # a drain long enough for a busy machine: the stream, not the deadline, ends the wait
        config["server"]["graceful_shutdown_s"] = 60
        gw = GatewayProcess(config).start()
        try:
            result: dict[str, Any] = {}

            def stream() -> None:
                with httpx.Client(base_url=gw.base_url, timeout=60) as http:
                    r = http.post(
                        "/v1/chat/completions", json=_chat(1, stream=True, max_tokens=80, min_tokens=80)
                    )
                    result["events"] = _events(r.text)

            t = threading.Thread(target=stream)
            t.start()
            wait_until(lambda: _stats(sim.base_url)["running"] >= 1, timeout=5, what="stream started")
            assert gw.proc is not None
            gw.proc.send_signal(signal.SIGTERM)
            t.join(60)
            events = result["events"]
            assert events[-1] == "[DONE]"
            assert not any("error" in orjson.loads(e) for e in events[:-1])
            gw.proc.wait(10)
            with pytest.raises(httpx.ConnectError):
                HTTP.get(gw.base_url + "/healthz", timeout=1)
        finally:
            gw.stop()


def test_backend_that_breaks_streams_midway_opens_its_circuit() -> None:
    with fast_sim("vllm", "--crash-after", "2", "--crash-mode", "cut") as breaking, fast_sim("vllm") as good:
        config = single_pool_config(
            "vllm",
            [breaking.base_url, good.base_url],
            upstream={"health": {"interval_s": 3600, "failure_threshold": 3, "open_s": 60}},
        )
        config["routing"]["policy"] = "round_robin"
        with GatewayProcess(config) as gw, httpx.Client(base_url=gw.base_url, timeout=10) as http:
            for i in range(16):
                r = http.post("/v1/chat/completions", json=_chat(i, stream=True, max_tokens=20))
                assert _events(r.text)[-1] == "[DONE]"
            # Three broken streams open the circuit; after that the backend gets nothing new.
            assert _stats(breaking.base_url)["requests_total"] == 3
            assert _stats(good.base_url)["requests_total"] == 13
