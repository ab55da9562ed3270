"""FleetControl through a store outage: local changes, their reconciliation, and a store that comes
back empty — on a MemoryStore that can be taken down, no Redis and no clock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.control.store import AuditEntry, MemoryStore, StateLost
from gateway.control.verbs import FleetControl
from gateway.core.context import Principal
from gateway.core.fleet import Fleet
from gateway.settings import HealthSettings, PoolSettings
from tests.gateway.control.test_store import _pools

WHO = Principal(user="op", roles=frozenset({"admin"}))


class FlakyStore(MemoryStore):
    shared = True

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def change(self, updates: dict[str, Any], deletes: list[str], audit: AuditEntry) -> None:
        if self.down:
            raise RedisConnectionError("down")
        await super().change(updates, deletes, audit)

    def wipe(self) -> None:
        self._fields.clear()
        self._audit.clear()


class Config:
    def base_pools(self) -> Sequence[PoolSettings]:
        return _pools()

    def reread_config(self) -> None:
        raise AssertionError("no reload here")


async def started(**kw: Any) -> tuple[FleetControl, FlakyStore]:
    store = FlakyStore()
    control = FleetControl(Fleet(_pools(), HealthSettings(), stale_s=10), Config(), store, **kw)
    await control.start(store)
    return control, store


async def test_weight_and_drain_apply_here_during_an_outage_and_are_written_after() -> None:
    control, store = await started()
    store.down = True
    assert (
        await control.change_fleet(WHO, "set_weight", "vllm", 0.5, 0.2, updates={"weight:vllm": 0.2}) is False
    )
    assert await control.change_fleet(WHO, "drain", "v1", False, True, updates={"drain:v1": True}) is False
    assert control.fleet.pools["vllm"].weight == 0.2 and control.fleet.backends["v1"].draining
    assert [p.entry.action for p in control.pending] == ["set_weight", "drain"]
    with pytest.raises(RedisConnectionError):  # a change one replica cannot make alone: refused
        await control.change_fleet(
            WHO, "add_backend", "x", None, {}, updates={"add:x": {"pool": "vllm", "url": "u"}}
        )

    store.down = False
    await control.change_fleet(WHO, "undrain", "v0", False, False, deletes=["drain:v0"])  # the store answers
    reconciling = control._reconciling
    assert reconciling is not None
    await reconciling
    assert control.pending == []
    assert [e["action"] for e in await store.audit(10)] == ["drain", "set_weight", "undrain"]
    assert control.fleet.pools["vllm"].weight == 0.2 and control.fleet.backends["v1"].draining


async def test_a_store_that_comes_back_empty_is_reported_and_restored() -> None:
    lost: list[tuple[str, int]] = []
    control, store = await started(
        on_lost=lambda kind, n: lost.append((kind, n)), known_keys=lambda: ["key_a"]
    )
    await control.change_fleet(WHO, "set_weight", "vllm", 0.5, 0.3, updates={"weight:vllm": 0.3})
    fields = dict(control.overrides.fields)
    store.wipe()
    await control._state_lost(StateLost(fields, audit_entries=1, restore=True))
    assert dict(lost) == {"overrides": 1, "audit_entries": 1, "api_keys": 1}
    assert control.fleet.pools["vllm"].weight == 0.3
    assert [e["action"] for e in await store.audit(10)] == ["restore_overrides"]


async def test_a_replica_not_asked_to_restore_only_reports() -> None:
    control, store = await started()
    store.wipe()
    await control._state_lost(StateLost({"weight:vllm": 0.3}, audit_entries=4, restore=False))
    assert await store.audit(10) == []


@pytest.mark.parametrize("rebalance", [True, False])
async def test_the_loops_weights_apply_below_an_admins_and_only_while_the_loop_is_on(rebalance: bool) -> None:
    control, _ = await started(rebalance=rebalance)
    loop = Principal(user="gateway")
    updates = {"rebalance:vllm": 0.7, "rebalance:sglang": 0.3}
    await control.change_fleet(loop, "pool_rebalanced", "m", {}, {}, updates=updates)
    want = (0.7, "rebalance") if rebalance else (0.5, "file")  # off: the file's weights
    assert (control.fleet.pools["vllm"].weight, control.describe_pool("vllm")["weight_source"]) == want
    await control.change_fleet(WHO, "set_weight", "vllm", want[0], 0.9, updates={"weight:vllm": 0.9})
    assert (control.fleet.pools["vllm"].weight, control.describe_pool("vllm")["weight_source"]) == (
        0.9,
        "override",
    )
    await control.change_fleet(WHO, "reset_weight", "vllm", 0.9, want[1], deletes=["weight:vllm"])
    assert (control.fleet.pools["vllm"].weight, control.describe_pool("vllm")["weight_source"]) == want
