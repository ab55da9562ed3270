"""Fault injection: every mode observable from a client, set by flag or at run time."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.engines.sim.helpers import USER, events, post, sim, stats
from tests.support import HTTP, wait_until

pytestmark = pytest.mark.processes

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def target(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(engine, base_url) of a simulator whose faults each test sets at run time."""
    with sim(request.param) as p:
        yield request.param, p.base_url


@pytest.fixture(autouse=True)
def _reset(target: tuple[str, str]) -> Iterator[None]:
    yield
    HTTP.post(target[1] + "/sim/faults", json={"reset": True})


def faults(base: str, **settings: object) -> None:
    assert HTTP.post(base + "/sim/faults", json=settings).status_code == 200


def error_message(engine: str, r: httpx.Response) -> str:
    body = r.json()
    return str(body["error"]["message"] if engine == "vllm" else body["message"])


@pytest.mark.parametrize(("kind", "status"), [("429", 429), ("500", 500), ("503", 503), ("context", 400)])
def test_error_kinds(target: tuple[str, str], kind: str, status: int) -> None:
    engine, base = target
    faults(base, fault_rate=1.0, fault_kind=kind)
    r = post(base, CHAT, {"messages": USER})
    assert r.status_code == status
    body = r.json()
    if engine == "vllm":
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["code"] == status
    else:
        assert body["object"] == "error" and body["code"] == status
    if kind == "context":
        assert "context length" in error_message(engine, r)


def test_fault_rate_is_deterministic(target: tuple[str, str]) -> None:
    _, base = target
    faults(base, fault_rate=0.5, fault_kind="503")
    codes = [post(base, CHAT, {"messages": USER, "max_tokens": 1}).status_code for _ in range(6)]
    assert codes == [200, 503, 200, 503, 200, 503]
    assert stats(base)["faults"]["fault_rate"] == 0.5


def test_bad_fault_update_is_400(target: tuple[str, str]) -> None:
    assert HTTP.post(target[1] + "/sim/faults", json={"fault_kind": "418"}).status_code == 400
    assert HTTP.post(target[1] + "/sim/faults", json={"nope": 1}).status_code == 400


def test_crash_cut_mid_stream(target: tuple[str, str]) -> None:
    _, base = target
    faults(base, crash_after=3, crash_mode="cut")
    before = stats(base)["errors_total"]
    received = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        HTTP.stream(
            "POST", base + CHAT, json={"messages": USER, "stream": True, "max_tokens": 20}, timeout=5
        ) as r,
    ):
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                received.append(line)
    assert len(received) == 3
    wait_until(lambda: stats(base)["errors_total"] != before, what="the crash counted")
    assert stats(base)["errors_total"] == before + 1


def test_crash_error_event_mid_stream(target: tuple[str, str]) -> None:
    engine, base = target
    faults(base, crash_after=2, crash_mode="error")
    r = post(base, CHAT, {"messages": USER, "stream": True, "max_tokens": 20})
    evs = events(r.text)
    assert len(evs) == 4 and evs[-1] == "[DONE]"
    err = evs[2]["error"]
    assert err["code"] == 500 and err["param"] is None
    assert ("object" in err) is (engine == "sglang")


def test_stall_sends_nothing_and_counts_cancelled(target: tuple[str, str]) -> None:
    _, base = target
    faults(base, stall=True)
    before = stats(base)["cancelled_total"]
    with pytest.raises(httpx.ReadTimeout):
        post(base, CHAT, {"messages": USER}, timeout=0.3)
    wait_until(lambda: stats(base)["cancelled_total"] != before, what="the stalled request cancelled")
    assert stats(base)["cancelled_total"] == before + 1


def test_slow_drip(target: tuple[str, str]) -> None:
    _, base = target
    faults(base, drip_ms=100)
    t0 = time.monotonic()
    r = post(base, CHAT, {"messages": USER, "stream": True, "max_tokens": 4})
    assert r.status_code == 200 and time.monotonic() - t0 >= 0.28  # three 100 ms gaps between 4 tokens


def test_startup_period_503(target: tuple[str, str]) -> None:
    _, base = target
    faults(base, startup_delay=60)
    assert HTTP.get(base + "/health").status_code == 503
    assert post(base, CHAT, {"messages": USER}).status_code == 503
    faults(base, startup_delay=0)  # the start-up period ends now
    assert HTTP.get(base + "/health").status_code == 200
    assert post(base, CHAT, {"messages": USER, "max_tokens": 1}).status_code == 200


def test_refuse_new_connections_for_a_while(target: tuple[str, str]) -> None:
    _, base = target
    with httpx.Client(base_url=base) as kept:  # a keep-alive connection opened before the fault
        assert kept.get("/health").status_code == 200
        assert kept.post("/sim/faults", json={"refuse_s": 60}).status_code == 200
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            HTTP.get(base + "/health", timeout=2)  # a new connection is aborted at once
        assert kept.post("/sim/faults", json={"refuse_s": 0}).status_code == 200
    assert HTTP.get(base + "/health").status_code == 200
