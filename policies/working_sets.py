"""A bounded estimate of how much prompt prefix each backend has been sent: its cache working set.

The affinity policy places a prefix group that no backend is known to hold on the lighter of the
group's first rendezvous choices, as in SGLang's cache-aware router sending an unmatched prompt to
the worker with the smallest radix tree. This module keeps the figure it compares: per backend, the
sum over the routing keys recently sent there of the deepest prompt (in blocks) seen for that key.

It is local (this replica's own decisions) and approximate, like `policies.prefix_index`: an engine
evicts on its own, and the map forgets the least recently used (key, backend) pairs once
`max_entries` is reached, so a backend's figure describes what it was sent lately. Memory: one
`OrderedDict` slot, a (int, str) tuple key and an int per pair, ~200 bytes; the default 16,384 pairs
take ~3 MB.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import repeat


def first_within(sizes: Sequence[float], slack: float) -> int:
    """The placement rule for a new group: the index of the first of `sizes` (working sets, in the
    group's rendezvous order) within `slack` of the smallest. Slack keeps replicas, whose working sets
    differ a little, on the same choice; 0 takes the lightest."""
    limit = min(sizes) + slack
    return next(i for i, size in enumerate(sizes) if size <= limit)


class WorkingSets:
    """LRU map (routing key, backend) -> deepest prompt in blocks, with per-backend sums. Not
    thread-safe (the gateway calls it from its event loop only)."""

    __slots__ = ("_pairs", "_sizes", "max_entries")

    def __init__(self, max_entries: int = 16384) -> None:
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        self.max_entries = max_entries
        self._pairs: OrderedDict[tuple[int, str], int] = OrderedDict()
        self._sizes: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._pairs)

    def note(self, key: int, backend: str, blocks: int) -> None:
        """Record that a prompt of `blocks` blocks with routing key `key` was sent to `backend`."""
        if self.max_entries == 0:
            return
        pairs = self._pairs
        pair = (key, backend)
        old = pairs.get(pair)
        if old is None:
            pairs[pair] = blocks
            self._sizes[backend] = self._sizes.get(backend, 0) + blocks
            if len(pairs) > self.max_entries:
                (_, gone), freed = pairs.popitem(last=False)
                left = self._sizes[gone] - freed
                if left:
                    self._sizes[gone] = left
                else:
                    del self._sizes[gone]
            return
        if blocks > old:
            pairs[pair] = blocks
            self._sizes[backend] += blocks - old
        pairs.move_to_end(pair)

    def size(self, backend: str) -> int:
        """The blocks recently sent to `backend` (summed over routing keys), 0 if none."""
        return self._sizes.get(backend, 0)

    def sizes(self, backends: Iterable[str]) -> list[int]:
        """`size` of each of `backends`, in order (one call for a pool)."""
        return list(map(self._sizes.get, backends, repeat(0)))

    def clear(self) -> None:
        self._pairs.clear()
        self._sizes.clear()
