from __future__ import annotations

from collections import Counter

from policies.least_load import LeastLoad
from policies.types import BackendView, RequestFeatures
from tests.policies.fleet import pool

F = RequestFeatures("m", 1, (), 0, 0, has_tools=False, tool_choice=None, structured_output=False)


def test_picks_lowest_score() -> None:
    members = (
        BackendView("busy", in_flight=5),
        BackendView("queued", in_flight=1, queue_depth=3.0),
        BackendView("idle", in_flight=1, kv_usage=0.2),
        BackendView("down", healthy=False),
    )
    choice = LeastLoad().select(pool("a", members=members), F, 0.5)
    assert (choice.backend, choice.reason, choice.affinity) == ("idle", "least-load", "none")


def test_ties_broken_by_rand_evenly() -> None:
    p = pool("a", 4)
    counts = Counter(LeastLoad().select(p, F, i / 400).backend for i in range(400))
    assert counts == Counter({"a-0": 100, "a-1": 100, "a-2": 100, "a-3": 100})


def test_never_picks_draining_even_if_idle() -> None:
    members = (BackendView("drain", draining=True), BackendView("busy", in_flight=50))
    assert LeastLoad().select(pool("a", members=members), F, 0.0).backend == "busy"
