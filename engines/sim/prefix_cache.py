"""A bounded prefix (KV) cache over chained block hashes, like vLLM's automatic prefix caching.

The prompt's token ids are cut into full blocks of `block_size` tokens; block *i*'s key is
`hash((key of block i-1, tokens of block i))`, so a block matches only when the whole prefix before it
matches. `acquire` counts the longest run of cached leading blocks (the hit), inserts the missing
blocks, and pins all of the prompt's blocks while the request runs; `release` unpins them. Unpinned
blocks are evicted least-recently-used first when the cache is at capacity; pinned blocks never are
(if every block is pinned, new blocks are simply not cached).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


def usable_hit(cached_tokens: int, prompt_tokens: int, block_size: int) -> int:
    """The cached tokens a request actually skips: like vLLM, at least the last prompt token is
    always computed, so a fully cached prompt still prefills its last block."""
    return min(cached_tokens, ((prompt_tokens - 1) // block_size) * block_size) if prompt_tokens else 0


@dataclass(slots=True)
class Lease:
    """The blocks one request holds; give it back with `PrefixCache.release`."""

    keys: list[int]
    cached_tokens: int


class PrefixCache:
    """LRU cache of block keys with reference counts. Not thread-safe (one event loop)."""

    def __init__(self, block_size: int, capacity_blocks: int, enabled: bool = True) -> None:
        self.block_size = block_size
        self.capacity = capacity_blocks
        self.enabled = enabled and capacity_blocks > 0
        self._refs: OrderedDict[int, int] = OrderedDict()  # key -> pins; order = LRU (oldest first)
        self.queries_tokens = 0
        self.hit_tokens = 0
        self.evictions = 0

    @staticmethod
    def block_keys(token_ids: list[int], block_size: int) -> list[int]:
        """Chained hash keys of the full blocks of `token_ids`."""
        keys: list[int] = []
        parent = 0
        for start in range(0, len(token_ids) - block_size + 1, block_size):
            parent = hash((parent, *token_ids[start : start + block_size]))
            keys.append(parent)
        return keys

    def acquire(self, token_ids: list[int]) -> Lease:
        """Look the prompt up, insert its missing blocks and pin them all; returns the hit."""
        self.queries_tokens += len(token_ids)
        if not self.enabled:
            return Lease([], 0)
        keys = self.block_keys(token_ids, self.block_size)
        refs = self._refs
        hit_blocks = self.hit_blocks(keys)
        held: list[int] = []
        for i, key in enumerate(keys):
            if i < hit_blocks:
                refs[key] += 1
                refs.move_to_end(key)
            elif not self._insert(key):
                break
            held.append(key)
        cached = hit_blocks * self.block_size
        self.hit_tokens += cached
        return Lease(held, cached)

    def hit_blocks(self, keys: list[int]) -> int:
        """How many of the leading `keys` (`block_keys` of a prompt) are cached now; changes nothing
        (no recency, no counters): what `acquire` would find if nothing is evicted before it."""
        if not self.enabled:
            return 0
        refs = self._refs
        hit = 0
        for key in keys:
            if key not in refs:
                break
            hit += 1
        return hit

    def _insert(self, key: int) -> bool:
        refs = self._refs
        if key in refs:
            refs[key] += 1
            refs.move_to_end(key)
            return True
        if len(refs) >= self.capacity and not self._evict_one():
            return False
        refs[key] = 1
        return True

    def _evict_one(self) -> bool:
        for key, pins in self._refs.items():
            if pins == 0:
                del self._refs[key]
                self.evictions += 1
                return True
        return False

    def release(self, lease: Lease) -> None:
        """Unpin a request's blocks (they stay cached until evicted)."""
        refs = self._refs
        for key in lease.keys:
            pins = refs.get(key)
            if pins is not None and pins > 0:
                refs[key] = pins - 1
        lease.keys = []

    @property
    def used_blocks(self) -> int:
        """Blocks currently stored (pinned or not)."""
        return len(self._refs)

    def clear(self) -> None:
        """Drop every unpinned block (like SGLang's /flush_cache)."""
        for key in [k for k, pins in self._refs.items() if pins == 0]:
            del self._refs[key]
