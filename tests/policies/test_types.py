from __future__ import annotations

import dataclasses

import pytest

from policies.pools import PoolChoice, pool_choice
from policies.types import (
    BackendChoice,
    BackendView,
    Decision,
    FleetSnapshot,
    RequestFeatures,
    RoutingError,
    backend_choice,
    decision,
)
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


def test_builders_make_the_named_tuples_with_every_field() -> None:
    # `tuple.__new__` does not check the arity: a field added to a class and not to its builder
    # would make shorter tuples, unequal to the class's own (its default included)
    built = [
        (backend_choice("b", "rr"), BackendChoice("b", "rr")),
        (backend_choice("b", "x", "hit", "w", 3, 4), BackendChoice("b", "x", "hit", "w", 3, 4)),
        (decision("p", "b", "r", "miss"), Decision("p", "b", "r", "miss")),
        (decision("p", "b", "r", "hit", "w", 5, 6), Decision("p", "b", "r", "hit", "w", 5, 6)),
        (pool_choice(pool("p"), "default"), PoolChoice(pool("p"), "default")),
        (pool_choice(pool("p"), "d", "q"), PoolChoice(pool("p"), "d", "q")),
    ]
    for fast, plain in built:
        assert type(fast) is type(plain)
        assert fast == plain and len(fast) == len(type(plain)._fields)
        assert fast._asdict() == plain._asdict()
    assert decision("p", "b", "r", "hit", prefill=7).prefill == 7


def test_needs_tool_parser() -> None:
    base = RequestFeatures("m", 1, (), 0, 0, has_tools=True, tool_choice=None, structured_output=False)
    assert base.needs_tool_parser
    assert not dataclasses.replace(base, tool_choice="none").needs_tool_parser
    assert not dataclasses.replace(base, has_tools=False).needs_tool_parser


def test_routing_error_status() -> None:
    assert RoutingError("unknown_model", "x").status == 404
    assert RoutingError("unknown_pool", "x").status == 404
    assert RoutingError("unavailable", "x").status == 503
