"""`GET /admin/spend` as an operator asks it: a user by name alone (the gateway finds their tenant
and tier), a revoked API key, and a stream an engine cut billed at what was relayed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from engines.sim.launcher import SimProcess
from gateway.admission.tokens import mint_token
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.reliability.support import sim_faults
from tests.support import HTTP, GatewayProcess, RedisServer, wait_until

pytestmark = pytest.mark.processes

SECRET = "spend-report-secret-" + "s" * 24
ADMIN = {"authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
BUDGETS = [{"period": "month", "tokens": 10_000_000}]


def chat(max_tokens: int = 2, **extra: object) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "count to fifty"}],
        "max_tokens": max_tokens,
        **extra,
    }


@pytest.fixture(scope="module")
def rig() -> Iterator[tuple[GatewayProcess, SimProcess]]:
    with contextlib.ExitStack() as stack:
        sim = stack.enter_context(fast_sim("vllm"))
        redis = stack.enter_context(RedisServer())
        limits = {
            "tiers": {"default": {}, "pro": {"budgets": BUDGETS}},
            "tenants": {"acme": {"budgets": BUDGETS}},
        }
        config = single_pool_config(
            "vllm", [sim.base_url], redis={"url": redis.url}, auth={"jwt": {"secret": SECRET}}, limits=limits
        )
        yield stack.enter_context(GatewayProcess(config)), sim


def spend(gw: GatewayProcess, **query: str) -> dict[str, object]:
    r = HTTP.get(gw.base_url + "/admin/spend", params={"period": "month", **query}, headers=ADMIN, timeout=10)
    assert r.status_code == 200, r.text
    return dict(r.json())


def tokens(report: dict[str, object]) -> int:
    return int(report["periods"][0]["tokens"])  # type: ignore[index]


def test_a_user_is_found_by_name_with_their_tenant_and_tier(rig: tuple[GatewayProcess, SimProcess]) -> None:
    gw, _ = rig
    alice = {"authorization": "Bearer " + mint_token(SECRET, "alice", tenant="acme", tier="pro")}
    assert (
        HTTP.post(gw.base_url + "/v1/chat/completions", json=chat(), headers=alice, timeout=10).status_code
        == 200
    )
    wait_until(lambda: tokens(spend(gw, user="alice")) > 0, 10, what="alice's spend reconciled")
    report = spend(gw, user="alice")
    assert (report["tenant"], report["tier"]) == ("acme", "pro")
    assert report["periods"][0]["budgets"]  # type: ignore[index]  # the tier's, found without asking


def test_a_revoked_keys_spend_stays_readable(rig: tuple[GatewayProcess, SimProcess]) -> None:
    gw, _ = rig
    made = HTTP.post(
        gw.base_url + "/admin/api-keys", json={"user": "svc", "tier": "pro"}, headers=ADMIN
    ).json()
    key = {"authorization": f"Bearer {made['key']}"}
    assert (
        HTTP.post(gw.base_url + "/v1/chat/completions", json=chat(), headers=key, timeout=10).status_code
        == 200
    )
    wait_until(lambda: tokens(spend(gw, key=made["id"])) > 0, 10, what="the key's spend reconciled")
    before = tokens(spend(gw, key=made["id"]))
    assert HTTP.delete(gw.base_url + f"/admin/api-keys/{made['id']}", headers=ADMIN).status_code == 200
    report = spend(gw, key=made["id"])
    assert report["revoked"] is True and tokens(report) == before


def test_a_stream_the_engine_cuts_is_billed_at_what_was_relayed(
    rig: tuple[GatewayProcess, SimProcess],
) -> None:
    gw, sim = rig
    bob = {"authorization": "Bearer " + mint_token(SECRET, "bob", tier="pro")}
    sim_faults(sim.base_url, crash_after=4, crash_mode="cut")
    try:
        body = chat(max_tokens=500, stream=True)
        r = HTTP.post(gw.base_url + "/v1/chat/completions", json=body, headers=bob, timeout=10)
    finally:
        sim_faults(sim.base_url, crash_after=None)
    assert r.status_code == 200 and '"error"' in r.text  # the stream ended with an error event
    wait_until(lambda: tokens(spend(gw, user="bob")) > 0, 10, what="bob's spend reconciled")
    billed = tokens(spend(gw, user="bob"))
    assert billed < 100, billed  # the prompt's estimate and a few relayed tokens, not the 500 reserved
