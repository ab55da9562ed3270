from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.prefix_index import PrefixIndex

ALL = frozenset({"a", "b", "c", "d", "e"})


def test_longest_match_and_depth() -> None:
    index = PrefixIndex(100)
    index.insert([1, 2, 3, 4], "a")
    index.insert([1, 2, 9], "b")
    assert index.longest_match([1, 2, 3, 4, 5], ALL) == (4, ("a",))
    assert index.longest_match([1, 2, 9, 10], ALL) == (3, ("b",))
    assert index.longest_match([1, 2, 7], ALL) == (2, ("b", "a"))
    assert index.longest_match([1, 2, 3], {"b"}) == (2, ("b",))
    assert index.longest_match([7, 8], ALL) == (0, ())
    assert index.depth_for([1, 2, 3, 4], "b") == 2
    assert index.depth_for([1, 2, 3, 4], "a", below=2) == 2
    assert index.depth_for([1, 2, 3, 4], "c") == 0


def test_depths_deepest_holders_and_the_floor_block() -> None:
    index = PrefixIndex(100)
    index.insert([1, 2, 3, 4], "a")
    index.insert([1, 2, 9], "b")
    # the deepest known prefix's holders, plus the holders of the first block considered
    assert index.depths([1, 2, 3, 4, 5], ALL) == {"a": 4, "b": 1}
    assert index.depths([1, 2, 9, 10], {"a", "b"}) == {"b": 3, "a": 1}
    assert index.depths([1, 2, 3, 4], {"b"}) == {"b": 2}
    # the floor is block `above + 1` (e.g. the preamble's last block); shallower blocks do not count
    assert index.depths([1, 2, 3, 4], ALL, above=1) == {"a": 4, "b": 2}
    assert index.depths([1, 2, 3, 4], ALL, above=2) == {"a": 4}
    assert index.depths([7, 8], ALL) == {}
    assert len(index) == 5  # lookups add nothing


def test_holders_most_recent_first_and_capped() -> None:
    index = PrefixIndex(100, max_holders=2)
    for name in ("a", "b", "c", "b"):
        index.insert([1], name)
    assert index.longest_match([1], ALL) == (1, ("b", "c"))


def test_lru_eviction_keeps_recently_used() -> None:
    index = PrefixIndex(4)
    index.insert([1, 2], "a")
    index.insert([3, 4], "b")
    index.insert([1], "a")  # refresh 1
    index.insert([5], "c")  # evicts 2 (least recently used)
    assert len(index) == 4
    assert index.longest_match([1, 2], ALL) == (1, ("a",))
    assert index.longest_match([5], ALL) == (1, ("c",))


def test_lookups_do_not_change_recency() -> None:
    index = PrefixIndex(2)
    index.insert([1], "a")
    index.insert([2], "a")
    index.longest_match([1], ALL)
    index.depth_for([1], "a")
    index.insert([3], "a")
    assert index.longest_match([1], ALL) == (0, ())


def test_disabled_index() -> None:
    index = PrefixIndex(0)
    index.insert([1, 2, 3], "a")
    assert len(index) == 0
    with pytest.raises(ValueError):
        PrefixIndex(-1)


@given(
    st.integers(1, 50),
    st.lists(
        st.tuples(st.lists(st.integers(0, 200), max_size=30), st.sampled_from(sorted(ALL))), max_size=40
    ),
)
def test_entries_never_exceed_the_cap(cap: int, inserts: list[tuple[list[int], str]]) -> None:
    index = PrefixIndex(cap, max_holders=3)
    for hashes, name in inserts:
        index.insert(hashes, name)
        assert len(index) <= cap
        for h in hashes[-3:]:
            _depth, holders = index.longest_match([h], ALL)
            assert len(holders) <= 3


def test_bytes_per_entry_is_as_documented() -> None:
    n = 20000
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    index = PrefixIndex(n)
    names = [f"backend-{i}" for i in range(8)]
    for i in range(n):
        index.insert([(i + 1) << 32 | (i * 2654435761 & 0xFFFFFFFF)], names[i % 8])
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    size = sum(s.size_diff for s in after.compare_to(before, "filename"))
    per_entry = size / n
    assert len(index) == n
    assert per_entry < 140, per_entry  # docs: ~107 bytes per entry (holder tuples shared)


def test_entries_share_their_holders_tuple() -> None:
    index = PrefixIndex(10_000, max_holders=2)
    index.insert([1, 2, 3], "a")
    index.insert([2, 3, 4], "b")
    index.insert([5], "b")
    held = index._entries
    assert held[1] == ("a",) and held[2] == ("b", "a") and held[4] == ("b",)
    assert held[2] is held[3]  # one tuple for ("b", "a")
    assert held[4] is held[5]  # one tuple for ("b",)
    for i in range(5000):  # past the sharing table's bound: values stay right
        index.insert([100 + i], f"n{i}")
    index.insert([2], "a")
    assert index.longest_match([2], ALL) == (1, ("a", "b"))


@given(
    st.integers(1, 30),
    st.lists(
        st.tuples(st.lists(st.integers(0, 60), max_size=20), st.sampled_from(sorted(ALL)), st.integers(0, 5)),
        max_size=30,
    ),
)
def test_insert_from_start_is_insert_of_the_slice(
    cap: int, inserts: list[tuple[list[int], str, int]]
) -> None:
    a, b = PrefixIndex(cap, max_holders=2), PrefixIndex(cap, max_holders=2)
    for hashes, name, start in inserts:
        a.insert(tuple(hashes), name, start)
        b.insert(tuple(hashes[start:]), name)
        assert list(a._entries.items()) == list(b._entries.items())


def test_a_strided_insert_records_the_first_every_stride_th_and_the_whole_prefix() -> None:
    index = PrefixIndex(100)
    hashes = list(range(1, 12))  # 11 blocks
    index.insert(hashes, "a", start=2, stride=4)
    # depths 3 (the start), 4 and 8 (multiples of the stride) and 11 (the whole prompt)
    assert sorted(index._entries) == [3, 4, 8, 11]
    # a longer prompt sharing the first 10 blocks is found 2 blocks short (at 8), never deeper
    assert index.depths([*hashes[:10], 99, 98], ALL, above=2) == {"a": 8}
    assert index.depths([*hashes[:3], 99], ALL, above=2) == {"a": 3}
    index.insert(hashes, "b", start=10, stride=4)  # only the last block: start and whole
    assert index.depths(hashes, ALL, above=2) == {"b": 11, "a": 11}  # (both sent the whole)
    index.insert(hashes, "c", start=11, stride=4)  # nothing past the prompt
    assert len(index) == 4


@given(st.integers(0, 40), st.integers(1, 6), st.integers(0, 40))
def test_a_strided_insert_finds_a_shared_prefix_less_than_a_stride_short(
    n: int, stride: int, shared: int
) -> None:
    index = PrefixIndex(1000)
    hashes = list(range(1, n + 1))
    index.insert(hashes, "a", 0, stride)
    shared = min(shared, n)
    probe = [*hashes[:shared], -1, -2]
    found = index.depths(probe, ALL).get("a", 0)
    assert found <= shared and (shared == 0 or found > shared - stride)
    assert len(index) <= (n + stride - 1) // stride + 2 if n else len(index) == 0
