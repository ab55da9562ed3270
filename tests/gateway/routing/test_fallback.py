"""Fallback chains: a model whose backends cannot take a request, or all fail before the answer
starts, is served by its first usable fallback model; never once a byte went to the client."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engines.sim.launcher import SimProcess
from gateway.admission.tokens import mint_token
from gateway.demo import SERVED
from tests.conftest import fast_sim
from tests.reliability.support import sim_faults
from tests.support import HTTP, GatewayProcess, wait_until

pytestmark = pytest.mark.processes

SECRET = "fallback-suite-secret-" + "f" * 24
ADMIN = {"authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
USER = {"authorization": "Bearer " + mint_token(SECRET, "alice")}
LIMITED = {"authorization": "Bearer " + mint_token(SECRET, "bob", tier="big-only")}


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "big", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}


@pytest.fixture(scope="module")
def rig() -> Iterator[tuple[GatewayProcess, SimProcess, SimProcess]]:
    with contextlib.ExitStack() as stack:
        big = stack.enter_context(fast_sim("vllm"))
        small = stack.enter_context(fast_sim("sglang"))
        config = {
            "server": {"graceful_shutdown_s": 1},
            "models": [{"name": "big", "fallbacks": ["small"]}, {"name": "small"}],
            "pools": [
                {
                    "name": "a",
                    "dialect": "vllm",
                    "models": {"big": SERVED["vllm"]},
                    "backends": [{"name": "a-0", "url": big.base_url}],
                },
                {
                    "name": "b",
                    "dialect": "sglang",
                    "models": {"small": SERVED["sglang"]},
                    "backends": [{"name": "b-0", "url": small.base_url}],
                },
            ],
            "upstream": {"health": {"interval_s": 3600}, "retries": {"max_attempts": 2}},
            "auth": {"jwt": {"secret": SECRET}},
            "limits": {
                "tiers": {
                    "default": {"budgets": [{"period": "day", "tokens": 1_000_000}]},  # spend is recorded
                    "big-only": {"deny_models": ["small"]},
                }
            },
        }
        yield stack.enter_context(GatewayProcess(config)), big, small


def requests(sim: SimProcess) -> int:
    return len(HTTP.get(sim.base_url + "/sim/requests", params={"limit": 1000}, timeout=5).json()["requests"])


def post(gw: GatewayProcess, body: dict[str, Any], headers: dict[str, str] = USER) -> httpx.Response:
    return HTTP.post(gw.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=15)


def test_a_model_without_a_routable_backend_is_served_by_its_fallback(
    rig: tuple[GatewayProcess, SimProcess, SimProcess],
) -> None:
    gw, _, small = rig
    assert (
        HTTP.put(
            gw.base_url + "/admin/backends/a-0/drain", json={"draining": True}, headers=ADMIN
        ).status_code
        == 200
    )
    try:
        before = requests(small)
        r = post(gw, chat())
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "small" and r.headers["x-gateway-model"] == "small"
        assert r.headers["x-gateway-route"].startswith("fallback+")
        assert requests(small) == before + 1
        # a caller who may not use the fallback gets the model's own 503
        r = post(gw, chat(), LIMITED)
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_backend"
    finally:
        HTTP.put(gw.base_url + "/admin/backends/a-0/drain", json={"draining": False}, headers=ADMIN)


def test_failures_before_the_first_byte_fall_back_and_after_it_never(
    rig: tuple[GatewayProcess, SimProcess, SimProcess],
) -> None:
    gw, big, small = rig
    r = post(gw, chat())
    assert r.status_code == 200 and r.json()["model"] == "big" and "x-gateway-model" not in r.headers
    sim_faults(big.base_url, fault_rate=1.0, fault_kind="503")
    try:
        for stream in (False, True):
            r = post(gw, chat(stream=stream))
            assert r.status_code == 200, r.text
            assert r.headers["x-gateway-model"] == "small"
    finally:
        sim_faults(big.base_url, fault_rate=0.0)
    sim_faults(big.base_url, crash_after=2, crash_mode="cut")
    try:
        before = requests(small)
        r = post(gw, chat(stream=True, max_tokens=50))
        assert r.status_code == 200 and '"error"' in r.text  # the stream had begun: it ends with an error
        assert requests(small) == before
    finally:
        sim_faults(big.base_url, crash_after=None)


def test_the_fallback_model_is_charged(rig: tuple[GatewayProcess, SimProcess, SimProcess]) -> None:
    gw, big, _ = rig
    carol = {"authorization": "Bearer " + mint_token(SECRET, "carol")}
    sim_faults(big.base_url, fault_rate=1.0, fault_kind="503")
    try:
        assert post(gw, chat(), carol).status_code == 200
    finally:
        sim_faults(big.base_url, fault_rate=0.0)

    def models() -> set[str]:
        query = {"user": "carol", "period": "day"}
        report = HTTP.get(gw.base_url + "/admin/spend", params=query, headers=ADMIN).json()
        return set(report["periods"][0]["models"])

    wait_until(lambda: models() != set(), 10, what="carol's spend reconciled")
    assert models() == {"small"}
