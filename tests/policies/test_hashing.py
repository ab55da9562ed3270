from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policies.hashing import MASK64, HrwOrders, NameHashes, mix64, str_hash64, unit_float


def test_str_hash_is_stable_across_processes() -> None:
    # A fixed value: BLAKE2b does not depend on PYTHONHASHSEED, so every replica agrees.
    assert str_hash64("backend-1") == str_hash64("backend-1")
    assert str_hash64("backend-1") == int.from_bytes(
        __import__("hashlib").blake2b(b"backend-1", digest_size=8).digest(), "little"
    )


@given(st.integers(min_value=0, max_value=MASK64))
def test_mix64_stays_in_64_bits_and_unit_float_in_open_interval(x: int) -> None:
    y = mix64(x)
    assert 0 <= y <= MASK64
    assert 0.0 < unit_float(y) < 1.0


def test_mix64_is_injective_on_a_sample() -> None:
    assert len({mix64(i) for i in range(10000)}) == 10000


def test_name_hashes_memo_is_bounded() -> None:
    memo = NameHashes(cap=8)
    for i in range(100):
        assert memo(f"n{i}") == str_hash64(f"n{i}")
    assert len(memo._memo) <= 8


@given(
    st.integers(min_value=0, max_value=MASK64),
    st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=10, unique=True),
)
def test_hrw_orders_are_the_rendezvous_sort_whatever_is_remembered(key: int, names: list[str]) -> None:
    orders = HrwOrders(cap=3)
    expected = sorted(names, key=lambda n: (mix64(key ^ str_hash64(n)), n), reverse=True)
    for _ in range(2):  # computed, then remembered
        assert [names[i] for i in orders.order(key, tuple(names))] == expected
    # another set of names under the same key is another order, not the remembered one
    fewer = tuple(names[1:])
    assert [fewer[i] for i in orders.order(key, fewer)] == [n for n in expected if n != names[0]]
    # the ranker puts the names, and anything aligned with them, in that order (one name: as is)
    rank = orders.ranker(key, tuple(names))
    assert list(rank(names)) == expected
    assert list(rank([(n,) for n in names])) == [(n,) for n in expected]


def test_hrw_orders_memo_is_bounded() -> None:
    orders = HrwOrders(cap=8)
    for key in range(100):
        orders.order(key, ("a", "b", "c"))
        assert len(orders) <= 8
