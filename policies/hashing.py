"""Stable 64-bit hashing helpers (identical in every process, unlike the built-in `hash`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

MASK64 = (1 << 64) - 1
_TWO64 = float(1 << 64)


def mix64(x: int) -> int:
    """SplitMix64 finaliser: a bijective, well-avalanching scramble of a 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def str_hash64(s: str) -> int:
    """A stable 64-bit hash of a string (BLAKE2b, 8-byte digest)."""
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little")


def unit_float(x: int) -> float:
    """Map a 64-bit hash to a float in the open interval (0, 1)."""
    return ((x & MASK64) + 0.5) / _TWO64


class NameHashes:
    """A memo of `str_hash64` for backend/pool names, bounded by clearing when it grows past `cap`."""

    __slots__ = ("_cap", "_memo")

    def __init__(self, cap: int = 4096) -> None:
        self._memo: dict[str, int] = {}
        self._cap = cap

    def __call__(self, name: str) -> int:
        h = self._memo.get(name)
        if h is None:
            if len(self._memo) >= self._cap:
                self._memo.clear()
            h = self._memo[name] = str_hash64(name)
        return h


class HrwOrders:
    """Rendezvous (HRW) orders of backend names for a key, remembered: the order is a function of
    the key and the set of names alone, and a decision would otherwise hash every backend's name
    with the key and sort them on every request. `order(key, names)` is the permutation of `names`
    (positions) by descending `mix64(key ^ hash(name))`, names breaking ties; `ranker(key, names)`
    the function that puts a sequence in that order (for the names and the backends they name: one
    C call each). Bounded by clearing when it grows past `cap` entries (each the key, the names
    tuple it was computed for and the permutation's getter: ~250 bytes with 8 names besides the
    key's int, by tracemalloc, 190 when the bare permutation was kept; ~2 MiB at the default cap)."""

    __slots__ = ("_cap", "_memo", "_names")

    def __init__(self, names: NameHashes | None = None, cap: int = 8192) -> None:
        self._names = names or NameHashes()
        self._memo: dict[tuple[int, tuple[str, ...]], Callable[[Sequence[Any]], tuple[Any, ...]]] = {}
        self._cap = cap

    def order(self, key: int, names: tuple[str, ...]) -> tuple[int, ...]:
        order: tuple[int, ...] = self.ranker(key, names)(range(len(names)))
        return order

    def ranker(self, key: int, names: tuple[str, ...]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
        """`items` -> `items` in the key's rendezvous order of `names` (`items[i]` goes with
        `names[i]`)."""
        entry = (key, names)
        rank = self._memo.get(entry)
        if rank is None:
            if len(names) < 2:
                rank = tuple
            else:
                h = self._names
                scored = sorted(((mix64(key ^ h(n)), n, i) for i, n in enumerate(names)), reverse=True)
                rank = itemgetter(*[s[2] for s in scored])
            if len(self._memo) >= self._cap:
                self._memo.clear()
            self._memo[entry] = rank
        return rank

    def __len__(self) -> int:
        return len(self._memo)
