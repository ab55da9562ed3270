from __future__ import annotations

from collections import Counter

from policies.round_robin import RoundRobin
from policies.types import BackendView, RequestFeatures
from tests.policies.fleet import pool

F = RequestFeatures("m", 1, (), 0, 0, has_tools=False, tool_choice=None, structured_output=False)


def _route(policy: RoundRobin, p: object, n: int) -> list[str]:
    out = []
    for _ in range(n):
        choice = policy.select(p, F, 0.0)  # type: ignore[arg-type]
        policy.on_routed(p, F, choice)  # type: ignore[arg-type]
        out.append(choice.backend)
    return out


def test_cycles_evenly() -> None:
    p = pool("a", 3)
    assert _route(RoundRobin(), p, 6) == ["a-0", "a-1", "a-2", "a-0", "a-1", "a-2"]


def test_skips_unroutable() -> None:
    members = (
        BackendView("x"),
        BackendView("y", draining=True),
        BackendView("z", healthy=False),
        BackendView("w"),
    )
    counts = Counter(_route(RoundRobin(), pool("a", members=members), 100))
    assert set(counts) == {"x", "w"} and counts["x"] == counts["w"] == 50


def test_select_alone_does_not_advance() -> None:
    policy, p = RoundRobin(), pool("a", 3)
    assert {policy.select(p, F, 0.0).backend for _ in range(5)} == {"a-0"}
    assert policy.select(p, F, 0.0).reason == "rr"
