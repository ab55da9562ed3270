"""A bounded, approximate index of which backend has seen which prompt prefix.

Keys are the chained block hashes of `policies.features` (each identifies a whole prefix), values the
backends this gateway replica last routed that prefix to (most recent first, at most `max_holders`).
It is *approximate*: it records this replica's own routing decisions, not the engines' caches, and it
forgets the least recently used prefixes first once `max_entries` is reached (engines evict too).
It is also local: replicas do not share it, which is why the affinity policy only lets it refine the
replica-independent rendezvous choice (see `policies.prefix_affinity`).

Memory. One entry is an `OrderedDict` slot (hash table + linked node) and a 64-bit int key (36 bytes);
its tuple of holder names is shared with every entry holding the same backends (`_tuples`; the name
strings themselves are shared with the snapshot): measured with tracemalloc on CPython 3.11, ~107
bytes per entry with one holder, ~123 with four rotating over 8 backends (155 and 191 with a tuple
an entry; tests/policies/test_prefix_index.py asserts < 140). The default 65,536 entries take
~7 MB and, at 32 tokens per block, describe ~2M tokens of distinct prefixes. Size it to the fleet's total KV-cache
capacity in blocks: entries ~ sum(KV tokens per backend) / block_tokens.

A prompt may be recorded sparsely (`insert`'s `stride`: its first block, every `stride`-th and its last):
the affinity policy does so for backends whose engines' KV events are usable, where the index only
stands in for events not yet heard. Lookups scan every depth, so they find both kinds.

Lookups never change the index (dry runs are safe); `insert` refreshes recency.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Sequence

#: distinct holders tuples `PrefixIndex` shares before it starts sharing anew
SHARED_TUPLES = 4096


class PrefixIndex:
    """LRU map from block hash to the backends that were sent that prefix. Not thread-safe (the
    gateway calls it from its event loop only)."""

    __slots__ = ("_entries", "_tuples", "max_entries", "max_holders")

    def __init__(self, max_entries: int = 65536, max_holders: int = 4) -> None:
        if max_entries < 0 or max_holders < 1:
            raise ValueError("max_entries must be >= 0 and max_holders >= 1")
        self.max_entries = max_entries
        self.max_holders = max_holders
        self._entries: OrderedDict[int, tuple[str, ...]] = OrderedDict()
        # One tuple object per distinct holders tuple, shared by the entries that have it: a few
        # combinations of backends cover every entry, so sharing saves a tuple an entry, and an
        # insert reads a tuple already in the CPU's cache rather than one per block. Bounded by
        # clearing (entries keep their tuples; later ones are shared anew).
        self._tuples: dict[tuple[str, ...], tuple[str, ...]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def insert(self, block_hashes: Sequence[int], backend: str, start: int = 0, stride: int = 1) -> None:
        """Record that the prefixes of `block_hashes[start:]` were sent to `backend` (most recent
        holder): all of them with a `stride` of 1; else the first (`start`, e.g. the preamble's
        last block), those whose length is a multiple of `stride` and the whole prompt, so that a
        lookup finds a shared prefix up to `stride - 1` blocks short, for a `stride`-th of the work
        and of the entries (the affinity policy's choice for backends whose engines report what
        they hold: `policies.prefix_affinity`)."""
        n = len(block_hashes)
        if self.max_entries == 0 or start >= n:
            return
        entries = self._entries
        keep = self.max_holders - 1
        solo = self._shared((backend,))
        stride = max(1, stride)
        last = n - 1
        i = start
        while True:
            h = block_hashes[i]
            holders = entries.get(h)
            if holders is None:
                entries[h] = solo
                if len(entries) > self.max_entries:
                    entries.popitem(last=False)
            else:
                if holders[0] != backend:
                    others = tuple(x for x in holders if x != backend)
                    entries[h] = self._shared((backend, *others[:keep]))
                entries.move_to_end(h)
            if i >= last:
                return
            # the next position: the next to end a multiple of `stride` blocks, else the last
            i = ((i + 1) // stride + 1) * stride - 1
            if i > last:
                i = last

    def _shared(self, holders: tuple[str, ...]) -> tuple[str, ...]:
        """The one tuple object equal to `holders` (see `_tuples`)."""
        tuples = self._tuples
        shared = tuples.get(holders)
        if shared is None:
            if len(tuples) >= SHARED_TUPLES:
                tuples.clear()
            shared = tuples[holders] = holders
        return shared

    def longest_match(
        self, block_hashes: Sequence[int], allowed: Container[str], *, above: int = 0
    ) -> tuple[int, tuple[str, ...]]:
        """The deepest prefix (in blocks, deeper than `above`) held by some `allowed` backend, and
        those backends. Returns `(0, ())` when no such prefix is known.
        """
        entries = self._entries
        for depth in range(len(block_hashes), above, -1):
            holders = entries.get(block_hashes[depth - 1])
            if holders is not None:
                found = tuple(x for x in holders if x in allowed)
                if found:
                    return depth, found
        return 0, ()

    def depth_for(
        self, block_hashes: Sequence[int], backend: str, *, below: int | None = None, above: int = 0
    ) -> int:
        """The deepest prefix (in blocks, at most `below`, deeper than `above`) that `backend` is
        recorded to hold, or 0."""
        entries = self._entries
        top = len(block_hashes) if below is None else min(below, len(block_hashes))
        for depth in range(top, above, -1):
            holders = entries.get(block_hashes[depth - 1])
            if holders is not None and backend in holders:
                return depth
        return 0

    def depths(self, block_hashes: Sequence[int], names: Container[str], *, above: int = 0) -> dict[str, int]:
        """Recorded depths (in blocks, deeper than `above`) per backend in `names`: the holders of the
        deepest known prefix, and the holders of the shallowest prefix considered (block `above + 1`,
        e.g. the preamble's last block) at that depth. Backends with neither are absent. One scan
        from the deepest block down, stopping at the first hit."""
        out: dict[str, int] = {}
        entries = self._entries
        for depth in range(len(block_hashes), above, -1):
            holders = entries.get(block_hashes[depth - 1])
            if holders is not None:
                for x in holders:
                    if x in names:
                        out[x] = depth
                if out:
                    if depth > above + 1:
                        floor = entries.get(block_hashes[above])
                        if floor is not None:
                            for x in floor:
                                if x in names and x not in out:
                                    out[x] = above + 1
                    break
        return out

    def clear(self) -> None:
        self._entries.clear()
        self._tuples.clear()
