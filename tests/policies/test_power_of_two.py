from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from policies.power_of_two import PowerOfTwo
from policies.types import BackendView, RequestFeatures
from tests.policies.fleet import pool

F = RequestFeatures("m", 1, (), 0, 0, has_tools=False, tool_choice=None, structured_output=False)


def test_less_loaded_of_two_wins() -> None:
    members = (BackendView("a", in_flight=10), BackendView("b", in_flight=1))
    p = pool("x", members=members)
    assert {PowerOfTwo().select(p, F, i / 100).backend for i in range(100)} == {"b"}


def test_most_loaded_never_chosen_and_all_others_are() -> None:
    members = tuple(BackendView(f"b{i}", in_flight=i) for i in range(5))
    counts = Counter(
        PowerOfTwo().select(pool("x", members=members), F, i / 1000).backend for i in range(1000)
    )
    assert "b4" not in counts and set(counts) == {"b0", "b1", "b2", "b3"}
    assert counts["b0"] > counts["b1"] > counts["b2"] > counts["b3"]


def test_single_backend() -> None:
    members = (BackendView("only"), BackendView("dead", healthy=False))
    assert PowerOfTwo().select(pool("x", members=members), F, 0.99).backend == "only"


@given(st.integers(1, 9), st.floats(min_value=0.0, max_value=1.0, exclude_max=True))
def test_always_routable(n: int, rand: float) -> None:
    members = (*(BackendView(f"b{i}", in_flight=i % 3) for i in range(n)), BackendView("d", draining=True))
    assert PowerOfTwo().select(pool("x", members=members), F, rand).backend != "d"
