"""A bounded estimate of how much prompt prefix each backend has been sent: its cache working set.

The affinity policy places a prefix group that no backend is known to hold on the lighter of the
group's first rendezvous choices, as in SGLang's cache-aware router sending an unmatched prompt to
the worker with the smallest radix tree. This module keeps the figure it compares: per backend, the
sum over the routing keys recently sent there of the deepest prompt (in blocks) seen for that key
(a warm-up of a hot group's preamble, `BackendChoice.warm`, counts as the preamble sent there).

Beside it, the backend's *tails*: one block for each later request of a key that went no deeper
(its own tail, question and answer, which the engine caches beside the shared prefix, as SGLang's
radix tree grows by it), up to the prompt's size per key. Working sets alone tie between backends
holding one group each whatever their traffic, and a new group went to the first in rendezvous
order, often the home of a hot one (documents at 50 % load, one routing process: 8-11 requests in
flight there against 1 on others). The tails differ more between replicas than the working sets
(each counts its own requests), so the affinity policy adds them only to a placement it proposes to
the processes' shared store, which makes the processes agree (`PrefixAffinity.proposing`). For an
opening group (a document) the other processes' figures are added too (`totals`, carried by the
store with their in-flight counts): each process sends 1/N of the traffic, so its own working sets
and tails are a sample of the fleet's, and there they are the load balancer.

It is local (this replica's own decisions) and approximate, like `policies.prefix_index`: an engine
evicts on its own, and the map forgets the least recently used (key, backend) pairs once
`max_entries` is reached, so a backend's figure describes what it was sent lately. Memory: one
`OrderedDict` slot, a (int, str) tuple key and an int per pair (the deepest prompt in its low 32
bits, the tails above), ~200 bytes; the default 16,384 pairs take ~3 MB.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

#: a pair's int: the deepest prompt (blocks) below this, its tails (requests) in multiples of it
_TAIL = 1 << 32
_DEEP = _TAIL - 1


def first_within(sizes: Sequence[float], slack: float) -> int:
    """The placement rule for a new group: the index of the first of `sizes` (working sets, in the
    group's rendezvous order) within `slack` of the smallest. Slack keeps replicas, whose working sets
    differ a little, on the same choice; 0 takes the lightest."""
    limit = min(sizes) + slack
    return next(i for i, size in enumerate(sizes) if size <= limit)


class WorkingSets:
    """LRU map (routing key, backend) -> deepest prompt in blocks and tails (one int, `_TAIL`), with
    per-backend sums of each. Not thread-safe (the gateway calls it from its event loop only)."""

    __slots__ = ("_pairs", "_sizes", "_tails", "_totals", "max_entries")

    def __init__(self, max_entries: int = 16384) -> None:
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        self.max_entries = max_entries
        self._pairs: OrderedDict[tuple[int, str], int] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._tails: dict[str, int] = {}
        self._totals: dict[str, int] | None = None  # `totals`, until the next change

    def __len__(self) -> int:
        return len(self._pairs)

    def note(self, key: int, backend: str, blocks: int) -> None:
        """Record that a prompt of `blocks` blocks with routing key `key` was sent to `backend`: a
        deeper prompt than the pair's adds the difference to the working set, another one block to
        the tails while the pair's tails are fewer than the prompt's blocks."""
        if self.max_entries == 0:
            return
        self._totals = None
        pairs = self._pairs
        pair = (key, backend)
        old = pairs.get(pair)
        if old is None:
            pairs[pair] = blocks
            self._sizes[backend] = self._sizes.get(backend, 0) + blocks
            if len(pairs) > self.max_entries:
                (_, gone), freed = pairs.popitem(last=False)
                self._forget(gone, freed)
            return
        deepest = old & _DEEP
        if blocks > deepest:
            pairs[pair] = old + blocks - deepest
            self._sizes[backend] += blocks - deepest
        elif old >> 32 < blocks:
            pairs[pair] = old + _TAIL
            self._tails[backend] = self._tails.get(backend, 0) + 1
        pairs.move_to_end(pair)

    def forget(self, key: int, backend: str) -> None:
        """Take routing key `key` off `backend` (what was recorded there for it was not sent after
        all: a warm-up the gateway skipped)."""
        value = self._pairs.pop((key, backend), None)
        if value is not None:
            self._totals = None
            self._forget(backend, value)

    def _forget(self, backend: str, value: int) -> None:
        """Take an evicted pair's `value` (deepest prompt and tails) off `backend`'s sums."""
        _take(self._sizes, backend, value & _DEEP)
        if value >> 32:
            _take(self._tails, backend, value >> 32)

    def size(self, backend: str) -> int:
        """The blocks recently sent to `backend` (summed over routing keys), 0 if none."""
        return self._sizes.get(backend, 0)

    def tails(self, backend: str) -> int:
        """The tails recently sent to `backend` (see the module docstring), 0 if none."""
        return self._tails.get(backend, 0)

    def totals(self) -> dict[str, int]:
        """Every backend's working set and tails, summed (what this process reports to the shared
        store for the other processes' proposals; backends with nothing recorded are left out). The
        same dict until the next `note` or `clear` (reported with every request): do not change it."""
        totals = self._totals
        if totals is None:
            tails = self._tails
            totals = self._totals = {
                name: size + tails.get(name, 0) for name, size in self._sizes.items() if size
            }
        return totals

    def sizes(self, backends: Sequence[str], tails: bool = False) -> list[int]:
        """`size` of each of `backends`, in order (one call for a pool); with `tails`, plus theirs."""
        own = self._sizes
        if not tails or not self._tails:
            return [own.get(name, 0) for name in backends]
        more = self._tails
        return [own.get(name, 0) + more.get(name, 0) for name in backends]

    def clear(self) -> None:
        self._totals = None
        self._pairs.clear()
        self._sizes.clear()
        self._tails.clear()


def _take(sums: dict[str, int], backend: str, amount: int) -> None:
    """`sums[backend] -= amount`, dropping the entry at 0 (the maps hold only backends sent to lately)."""
    left = sums[backend] - amount
    if left:
        sums[backend] = left
    else:
        del sums[backend]
