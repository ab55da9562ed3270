"""The new endpoints keep the chat path's reliability: failover before the first byte, a client that
goes away cancels the engine's request, a stream the engine breaks ends with one error in the API's
own shape. Real simulators (vLLM dialect) with faults toggled at run time, one real gateway."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from engines.sim.launcher import SimProcess
from gateway.demo import SERVED
from tests.conftest import MODEL, fast_sim
from tests.gateway.apis.conftest import EMBED_SERVED, embed_sim
from tests.reliability.support import RawClient, http_request, metric, sim_faults, sim_stats
from tests.support import HTTP, GatewayProcess, wait_until

pytestmark = pytest.mark.processes

SLOW = "slow-model"
SLOW_EMBED = "slow-embed"
CRASHY = "crashy-model"
EMBED = "embed-model"


@dataclass
class Rig:
    gw: GatewayProcess
    good: SimProcess
    flaky: SimProcess
    egood: SimProcess
    eflaky: SimProcess
    slow: SimProcess
    eslow: SimProcess
    crashy: SimProcess


def _pool(name: str, models: dict[str, str], *sims: SimProcess) -> dict[str, Any]:
    return {
        "name": name,
        "dialect": "vllm",
        "models": models,
        "backends": [{"name": f"{name}-{i}", "url": s.base_url} for i, s in enumerate(sims)],
    }


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    with contextlib.ExitStack() as st:
        good, flaky = st.enter_context(fast_sim("vllm")), st.enter_context(fast_sim("vllm"))
        egood, eflaky = st.enter_context(embed_sim("vllm")), st.enter_context(embed_sim("vllm"))
        slow = st.enter_context(fast_sim("vllm", "--ttft-ms", "3000"))
        eslow = st.enter_context(embed_sim("vllm", "--ttft-ms", "3000"))
        crashy = st.enter_context(fast_sim("vllm"))
        served = SERVED["vllm"]
        config: dict[str, Any] = {
            "server": {"graceful_shutdown_s": 2},
            "models": [
                {"name": MODEL},
                {"name": SLOW},
                {"name": CRASHY},
                {"name": EMBED, "task": "embed", "context_length": 512},
                {"name": SLOW_EMBED, "task": "embed", "context_length": 512},
            ],
            "pools": [
                _pool("chat", {MODEL: served}, good, flaky),
                _pool("embed", {EMBED: EMBED_SERVED}, egood, eflaky),
                _pool("slow", {SLOW: served}, slow),
                _pool("slowembed", {SLOW_EMBED: EMBED_SERVED}, eslow),
                _pool("crashy", {CRASHY: served}, crashy),
            ],
            "upstream": {
                "timeouts": {"first_byte_s": 30, "idle_s": 30},
                "health": {"interval_s": 3600, "failure_threshold": 50},
            },
            "routing": {"policy": "round_robin", "scrape_interval_s": 0},
        }
        gw = st.enter_context(GatewayProcess(config))
        yield Rig(gw, good, flaky, egood, eflaky, slow, eslow, crashy)


def _body(api: str, model: str, stream: bool, **extra: Any) -> dict[str, Any]:
    if api == "responses":
        return {"model": model, "input": "hello there", "stream": stream, **extra}
    if api == "messages":
        return {
            "model": model,
            "max_tokens": 40,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": stream,
            **extra,
        }
    return {"model": model, "input": ["hello there", "general kenobi"]}


_CASES = [
    ("responses", False),
    ("responses", True),
    ("messages", False),
    ("messages", True),
    ("embeddings", False),
]


@pytest.mark.parametrize(("api", "stream"), _CASES)
def test_failover_before_the_first_byte(rig: Rig, api: str, stream: bool) -> None:
    bad = rig.eflaky if api == "embeddings" else rig.flaky
    model = EMBED if api == "embeddings" else MODEL
    before = sim_stats(bad.base_url)["requests_total"]
    sim_faults(bad.base_url, fault_rate=1.0, fault_kind="503")
    try:
        with httpx.Client(base_url=rig.gw.base_url, timeout=20) as http:
            for _ in range(6):
                r = http.post(f"/v1/{api}", json=_body(api, model, stream))
                assert r.status_code == 200, r.text
                if stream:
                    last = r.text.strip().split("\n\n")[-1].split("\n")[0]
                    assert last == (
                        "event: response.completed" if api == "responses" else "event: message_stop"
                    )
    finally:
        sim_faults(bad.base_url, fault_rate=0.0)
    assert sim_stats(bad.base_url)["requests_total"] > before, "the failing backend was tried"


def _settled(rig: Rig, sim: SimProcess, cancelled_before: int, completed_before: int) -> None:
    """Waits until the engine cancelled the request and went idle; nothing ran to its end (the
    cancel came before the engine's answer)."""
    wait_until(lambda: sim_stats(sim.base_url)["cancelled_total"] > cancelled_before, what="cancel")
    wait_until(lambda: sim_stats(sim.base_url)["running"] == 0, timeout=3, what="engine idle")
    assert sim_stats(sim.base_url)["completed_total"] == completed_before, (
        "an abandoned request ran to its end"
    )
    text = HTTP.get(rig.gw.base_url + "/metrics", timeout=5).text
    assert metric(text, "gateway_in_flight_requests") == 0
    assert metric(text, "gateway_backend_in_flight") == 0


@pytest.mark.parametrize(("api", "stream"), _CASES)
def test_a_client_that_leaves_cancels_the_engines_request(rig: Rig, api: str, stream: bool) -> None:
    sim = rig.eslow if api == "embeddings" else rig.slow
    model = SLOW_EMBED if api == "embeddings" else SLOW
    stats = sim_stats(sim.base_url)
    cancelled, completed = stats["cancelled_total"], stats["completed_total"]
    arrived = stats["requests_total"]
    with RawClient(rig.gw.port) as c:
        c.send(http_request(f"/v1/{api}", _body(api, model, stream)))
        # arrived at the engine (the batching engine counts it as running only once its 3 s
        # time-to-first-token delay has passed and it reaches the scheduler)
        wait_until(
            lambda: sim_stats(sim.base_url)["requests_total"] > arrived,
            timeout=3,
            what="engine request started",
        )
    # the cancel must come before the engine's answer (due 3 s after the start): nothing completes
    _settled(rig, sim, cancelled, completed)


def test_a_broken_stream_ends_with_the_apis_own_error(rig: Rig) -> None:
    sim_faults(rig.crashy.base_url, crash_after=4, crash_mode="cut")
    try:
        with httpx.Client(base_url=rig.gw.base_url, timeout=20) as http:
            r = http.post("/v1/responses", json=_body("responses", CRASHY, True))
            events = [
                (b.split("\n")[0][7:], orjson.loads(b.split("\ndata: ")[1]))
                for b in r.text.strip().split("\n\n")
            ]
            assert r.status_code == 200
            assert [k for k, _ in events[-2:]] == ["error", "response.failed"]
            err, failed = events[-2][1], events[-1][1]
            assert err["code"] == "server_error" and err["message"]
            assert (
                failed["response"]["status"] == "failed"
                and failed["response"]["error"]["code"] == "server_error"
            )
            assert [e["sequence_number"] for _, e in events] == list(range(len(events)))

            r = http.post("/v1/messages", json=_body("messages", CRASHY, True))
            blocks = r.text.strip().split("\n\n")
            assert r.status_code == 200 and blocks[0].startswith("event: message_start")
            assert blocks[-1].startswith("event: error\n")
            assert orjson.loads(blocks[-1].split("\ndata: ")[1]) == {
                "type": "error",
                "error": {
                    "type": "api_error",
                    "message": "The model stopped answering mid-stream. You can retry your request.",
                },
            }
            assert sum(b.startswith("event: error") for b in blocks) == 1
    finally:
        sim_faults(rig.crashy.base_url, crash_after=None)


def test_no_backend_is_anthropics_overloaded_error(rig: Rig) -> None:
    """Every backend failing: the gateway's 503 is Anthropic's 529 overloaded_error on /v1/messages."""
    for sim in (rig.good, rig.flaky):
        sim_faults(sim.base_url, fault_rate=1.0, fault_kind="503")
    try:
        r = HTTP.post(rig.gw.base_url + "/v1/messages", json=_body("messages", MODEL, False), timeout=20)
        assert r.status_code == 529, r.text
        assert r.json()["error"]["type"] == "overloaded_error"
        r = HTTP.post(rig.gw.base_url + "/v1/responses", json=_body("responses", MODEL, False), timeout=20)
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
    finally:
        for sim in (rig.good, rig.flaky):
            sim_faults(sim.base_url, fault_rate=0.0)
