from __future__ import annotations

import pytest

from policies.working_sets import WorkingSets


def test_sums_the_deepest_prompt_per_key_and_backend() -> None:
    sets = WorkingSets()
    sets.note(1, "a", 10)
    sets.note(1, "a", 4)  # a shorter prompt of the same key adds nothing
    sets.note(1, "a", 12)  # a deeper one adds the difference
    sets.note(2, "a", 5)
    sets.note(1, "b", 3)  # a copy of key 1 elsewhere counts there
    assert (sets.size("a"), sets.size("b"), sets.size("c")) == (17, 3, 0)
    assert sets.sizes(["c", "b", "a"]) == [0, 3, 17]
    assert len(sets) == 3


def test_forgets_the_least_recently_used_pairs_when_full() -> None:
    sets = WorkingSets(max_entries=2)
    sets.note(1, "a", 10)
    sets.note(2, "b", 5)
    sets.note(1, "a", 10)  # refreshes (1, a)
    sets.note(3, "a", 7)  # evicts (2, b)
    assert (sets.size("a"), sets.size("b"), len(sets)) == (17, 0, 2)


def test_disabled_and_validation() -> None:
    sets = WorkingSets(max_entries=0)
    sets.note(1, "a", 10)
    assert sets.size("a") == 0
    with pytest.raises(ValueError):
        WorkingSets(max_entries=-1)


def test_a_request_no_deeper_adds_its_tail_up_to_its_prompt_and_leaves_with_the_pair() -> None:
    sets = WorkingSets(max_entries=2)
    sets.note(1, "a", 3)
    for _ in range(5):  # tails: one a request, at most the prompt's 3 blocks
        sets.note(1, "a", 3)
    sets.note(1, "a", 4)  # deeper: the working set grows, the tails stay
    assert (sets.size("a"), sets.tails("a")) == (4, 3)
    sets.note(2, "b", 6)
    sets.note(2, "b", 6)
    assert sets.sizes(["a", "b", "c"]) == [4, 6, 0]
    assert sets.sizes(["a", "b", "c"], True) == [7, 7, 0]
    sets.note(3, "b", 2)  # evicts (1, a) with its tails
    assert (sets.size("a"), sets.tails("a"), sets.tails("b")) == (0, 0, 1)
    sets.clear()
    assert (len(sets), sets.tails("b")) == (0, 0)


def test_a_key_forgotten_on_a_backend_leaves_its_sums_and_totals() -> None:
    sets = WorkingSets()
    sets.note(1, "a", 10)
    sets.note(1, "a", 10)  # a tail
    sets.note(2, "a", 4)
    assert sets.totals() == {"a": 15}
    sets.forget(1, "a")
    assert (sets.size("a"), sets.tails("a"), len(sets), sets.totals()) == (4, 0, 1, {"a": 4})
    sets.forget(1, "a")  # not there: nothing
    sets.forget(2, "b")
    assert (sets.size("a"), len(sets)) == (4, 1)
