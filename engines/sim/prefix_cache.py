"""A bounded prefix (KV) cache over chained block hashes, like vLLM's automatic prefix caching, and the
KV block pool it lives in.

The prompt's token ids are cut into full blocks of `block_size` tokens; block *i*'s key is
`hash((key of block i-1, tokens of block i))`, so a block matches only when the whole prefix before it
matches (a request's `cache_salt` seeds the chain, so salted requests share blocks only with the same
salt). Blocks are reference-counted ("pinned") while a request uses them.

Two ways to use it:

- **whole requests** (the serial scheduler, the bench's oracle): `acquire` counts the longest run of
  cached leading blocks (the hit), inserts the missing blocks and pins all of the prompt's blocks while
  the request runs; `release` unpins them. Unpinned blocks are evicted least-recently-*acquired* first
  when the cache holds `capacity` blocks; pinned blocks never are (if every block is pinned, new blocks
  are simply not cached).
- **a block pool** (the batching engine, `step_model.py`): `capacity` is the engine's whole KV cache
  (vLLM `num_gpu_blocks`, SGLang `max_total_num_tokens / page_size`). A running sequence holds *private*
  blocks (`allocate` / `free`: the blocks it is computing, and its partial last block) and pinned cached
  blocks (`pin` the hit, `commit` a block once it is full: vLLM when the step computing it is
  scheduled, SGLang after it ran); cached blocks count against the capacity like private ones.
  `allocate` evicts unpinned cached blocks, least-recently-*released* first (vLLM's free-block
  queue: a freed request's blocks join the tail, its last block first), when no block is free.

`on_evict`, when set, is called with each evicted key (KV-cache events).
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple


def usable_hit(cached_tokens: int, prompt_tokens: int, block_size: int) -> int:
    """The cached tokens a request actually skips: like vLLM, at least the last prompt token is
    always computed, so a fully cached prompt still prefills its last block."""
    return min(cached_tokens, ((prompt_tokens - 1) // block_size) * block_size) if prompt_tokens else 0


class LoraRequest(NamedTuple):
    """A request's LoRA adapter, as vLLM's `LoRARequest` names it (its blocks are cached apart)."""

    name: str
    id: int
    path: str


def chain_seed(cache_salt: str | None, lora: LoraRequest | None = None) -> int:
    """The parent key of a request's first block: 0, or derived from its `cache_salt` and its LoRA
    adapter (each a cache namespace of its own)."""
    seed = zlib.crc32(cache_salt.encode("utf-8")) + 1 if cache_salt else 0
    if lora is not None:
        seed = hash((seed, "lora", lora.name, lora.path))
    return seed


def next_key(parent: int, tokens: Sequence[int]) -> int:
    """The key of a full block whose predecessor's key is `parent`."""
    return hash((parent, *tokens))


@dataclass(slots=True)
class Lease:
    """The blocks one request holds; give it back with `PrefixCache.release`."""

    keys: list[int]
    cached_tokens: int


class PrefixCache:
    """LRU cache of block keys with reference counts, inside a pool of `capacity` blocks. Not
    thread-safe (one event loop)."""

    def __init__(self, block_size: int, capacity_blocks: int, enabled: bool = True) -> None:
        self.block_size = block_size
        self.capacity = capacity_blocks
        self.enabled = enabled and capacity_blocks > 0
        self._refs: OrderedDict[int, int] = OrderedDict()  # key -> pins; order = last acquired (oldest first)
        self._free: OrderedDict[int, None] = OrderedDict()  # unpinned keys, in the order they were released
        self.private = 0  # pool use: blocks held by running sequences without a key
        self.pinned = 0  # keys with at least one pin
        self.queries_tokens = 0
        self.hit_tokens = 0
        self.evictions = 0
        self.on_evict: Callable[[int], None] | None = None

    @staticmethod
    def block_keys(
        token_ids: Sequence[int],
        block_size: int,
        cache_salt: str | None = None,
        lora: LoraRequest | None = None,
    ) -> list[int]:
        """Chained hash keys of the full blocks of `token_ids`."""
        keys: list[int] = []
        parent = chain_seed(cache_salt, lora)
        for start in range(0, len(token_ids) - block_size + 1, block_size):
            parent = hash((parent, *token_ids[start : start + block_size]))
            keys.append(parent)
        return keys

    # ---- whole requests ------------------------------------------------------------------------
    def acquire(
        self, token_ids: list[int], cache_salt: str | None = None, lora: LoraRequest | None = None
    ) -> Lease:
        """Look the prompt up, insert its missing blocks and pin them all; returns the hit."""
        self.queries_tokens += len(token_ids)
        if not self.enabled:
            return Lease([], 0)
        keys = self.block_keys(token_ids, self.block_size, cache_salt, lora)
        refs = self._refs
        hit_blocks = self.hit_blocks(keys)
        held: list[int] = []
        for i, key in enumerate(keys):
            if i < hit_blocks:
                self._pin(key)
                refs.move_to_end(key)
            elif not self._insert(key):
                break
            held.append(key)
        cached = hit_blocks * self.block_size
        self.hit_tokens += cached
        return Lease(held, cached)

    def hit_blocks(self, keys: Sequence[int]) -> int:
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
            self._pin(key)
            refs.move_to_end(key)
            return True
        if len(refs) + self.private >= self.capacity and not self._evict_one():
            return False
        refs[key] = 1
        self.pinned += 1
        return True

    def _evict_one(self) -> bool:
        for key, pins in self._refs.items():
            if pins == 0:
                self._drop(key)
                return True
        return False

    def _drop(self, key: int) -> None:
        del self._refs[key]
        self._free.pop(key, None)
        self.evictions += 1
        if self.on_evict is not None:
            self.on_evict(key)

    def release(self, lease: Lease) -> None:
        """Unpin a request's blocks (they stay cached until evicted)."""
        self.unpin(lease.keys)
        lease.keys = []

    # ---- the block pool ------------------------------------------------------------------------
    def _pin(self, key: int) -> None:
        pins = self._refs[key]
        if pins == 0:
            self.pinned += 1
            self._free.pop(key, None)
        self._refs[key] = pins + 1

    def pin(self, keys: Iterable[int]) -> None:
        """Pin cached blocks a request hit (they must be cached: `hit_blocks` first)."""
        refs = self._refs
        for key in keys:
            self._pin(key)
            refs.move_to_end(key)

    def unpin(self, keys: Sequence[int]) -> None:
        """Unpin blocks; those no longer pinned become evictable, the last of `keys` first."""
        refs = self._refs
        for key in reversed(keys):
            pins = refs.get(key)
            if pins is not None and pins > 0:
                refs[key] = pins - 1
                if pins == 1:
                    self.pinned -= 1
                    self._free[key] = None

    @property
    def free_blocks(self) -> int:
        """Blocks a sequence could get now: empty ones plus evictable cached ones."""
        return self.capacity - self.private - self.pinned

    def allocate(self, n: int, force: bool = False) -> bool:
        """Take `n` private blocks, evicting unpinned cached blocks (least recently released first)
        when no empty block is left. False, and nothing taken, if they do not fit; with `force` they
        are taken anyway (a lone request larger than the whole cache: the pool runs over capacity)."""
        if n <= 0:
            return True
        if n > self.free_blocks and not force:
            return False
        while self._free and len(self._refs) + self.private + n > self.capacity:
            self._drop(next(iter(self._free)))
        self.private += n
        return True

    def free(self, n: int) -> None:
        """Give `n` private blocks back."""
        self.private -= n

    def commit(self, key: int) -> bool:
        """One private block became full (its step scheduled or run): it is cached (pinned) under
        `key`. True if the key is new; if another sequence cached it meanwhile, that copy is pinned
        instead and the private block freed."""
        if not self.enabled:
            return False
        self.private -= 1
        refs = self._refs
        if key in refs:
            self._pin(key)
            refs.move_to_end(key)
            return False
        refs[key] = 1
        self.pinned += 1
        return True

    @property
    def used_blocks(self) -> int:
        """Blocks currently stored (pinned or not)."""
        return len(self._refs)

    @property
    def held_blocks(self) -> int:
        """Blocks held by running sequences (pinned cached plus private): the KV usage numerator."""
        return self.pinned + self.private

    def clear(self) -> list[int]:
        """Drop every unpinned block (like SGLang's /flush_cache); returns the dropped keys."""
        dropped = [k for k, pins in self._refs.items() if pins == 0]
        for key in dropped:
            del self._refs[key]
        self._free.clear()
        return dropped
