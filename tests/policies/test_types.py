from __future__ import annotations

import dataclasses

import pytest

from policies.types import BackendView, Decision, FleetSnapshot, RequestFeatures, RoutingError
from tests.policies.fleet import fleet, pool


def test_backend_routable_requires_healthy_not_draining_circuit_closed() -> None:
    assert BackendView("a").routable
    assert not BackendView("a", healthy=False).routable
    assert not BackendView("a", draining=True).routable
    assert not BackendView("a", circuit_open=True).routable


def test_snapshot_lookup_and_serves() -> None:
    snap = fleet(pool("vllm"), pool("sglang", models=frozenset({"other"})))
    assert snap.pool("sglang") is snap.pools[1]
    assert snap.pool("nope") is None
    assert snap.serves("m") and snap.serves("other") and not snap.serves("x")
    assert snap == FleetSnapshot(snap.pools)


def test_values_are_frozen() -> None:
    d = Decision("p", "b", "default+rr", "none")
    with pytest.raises(AttributeError):
        d.pool = "q"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        BackendView("a").in_flight = 1  # type: ignore[misc]


def test_needs_tool_parser() -> None:
    base = RequestFeatures("m", 1, (), 0, 0, has_tools=True, tool_choice=None, structured_output=False)
    assert base.needs_tool_parser
    assert not dataclasses.replace(base, tool_choice="none").needs_tool_parser
    assert not dataclasses.replace(base, has_tools=False).needs_tool_parser


def test_routing_error_status() -> None:
    assert RoutingError("unknown_model", "x").status == 404
    assert RoutingError("unknown_pool", "x").status == 404
    assert RoutingError("unavailable", "x").status == 503
