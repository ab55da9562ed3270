"""A prompt's token blocks and their chained keys, as the KV-event index matches them.

An engine caches a prompt in blocks of `block_size` tokens and names each block by a hash chained over
everything before it, so a block names a whole prefix. The gateway does not reproduce the engines'
hashes (vLLM's depend on `--prefix-caching-hash-algo`, `PYTHONHASHSEED`, LoRA and multimodal keys;
SGLang's on its page size): it keys blocks with a chain of its own over the same token ids, computed
from the token ids the engines' `BlockStored` events carry and from the request's own tokens
(`policies.kv_index` maps each engine's hashes to these keys for `BlockRemoved`).

Key. `key_i = hash((key_{i-1}, tokens_i as 32-bit little-endian bytes[, extra_i]))`, `key_{-1}` the
chain's `seed` (`ROOT`, or `seed_for(lora)` for a LoRA adapter's namespace). Python's `hash` of bytes is SipHash-1-3 with
a per-process secret: 64 bits, fast (~0.15 µs a block against ~0.55 µs for BLAKE2b-8) and
collision-resistant enough for routing; its values differ between processes, which is fine because
every routing process builds its own index from the same events (keys never leave the process).

`extra_i` is what else the engine mixed into a block's hash (vLLM's `extra_keys`: the cache salt of a
salted request's first block, LoRA names, multimodal identifiers): blocks with extra keys only match a
request that supplies the same (a salted request does; images never do - an under-report, never a
false hit).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

ROOT = 0


def block_key(prev: int, block: bytes | memoryview, extra: Any = None) -> int:
    """The key of one block under the key of its parent (`ROOT` for a first block)."""
    if extra is None:
        return hash((prev, block))
    return hash((prev, block, _frozen(extra)))


def seed_for(lora: str | None = None) -> int:
    """The chain's seed for a cache namespace (a LoRA adapter's name); `ROOT` for the base model."""
    if not lora:
        return ROOT
    return hash(("lora", lora))


def salt_extra(cache_salt: str | None) -> tuple[str, ...] | None:
    """The extra key a salted request's first block carries (vLLM publishes `[salt]`)."""
    return (cache_salt,) if cache_salt else None


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """Token ids as 32-bit little-endian bytes (ids outside 0..2^32-1 wrap: they never occur)."""
    try:
        return array("I", token_ids).tobytes()
    except OverflowError:
        return array("I", (t & 0xFFFFFFFF for t in token_ids)).tobytes()


def chain_keys(
    data: bytes, block_size: int, seed: int = ROOT, first_extra: Any = None, *, limit: int | None = None
) -> list[int]:
    """Keys of the full blocks of `data` (token bytes), chained from `seed`; at most `limit` blocks."""
    step = block_size * 4
    count = len(data) // step
    if limit is not None:
        count = min(count, limit)
    out: list[int] = []
    if not count:
        return out
    view = memoryview(data)
    key = block_key(seed, view[:step], first_extra)
    out.append(key)
    start = step
    for _ in range(count - 1):
        end = start + step
        key = hash((key, view[start:end]))
        out.append(key)
        start = end
    return out


class PromptBlocks:
    """A prompt's token ids and its block keys per block size, each computed once.

    `seed` and `first_extra` put the prompt in the engines' cache namespace (`seed_for`,
    `salt_extra`). `max_tokens` bounds the tokens keyed, whatever the block size (the cost of a very
    long prompt, and of matching it: beyond it, prompts are told apart by their first `max_tokens`). `length` is the whole prompt's length in tokens when only its start was tokenized
    (an estimate; `tokens` otherwise). `reuse(previous)` takes over the keys of the longest common
    prefix of an earlier prompt of the same conversation, so a growing conversation hashes only its
    new blocks.
    """

    __slots__ = ("_keys", "_length", "data", "first_extra", "max_tokens", "seed")

    def __init__(
        self,
        token_ids: Sequence[int] | bytes,
        *,
        seed: int = ROOT,
        first_extra: Any = None,
        max_tokens: int = 8192,
        length: int | None = None,
    ) -> None:
        self.data = token_ids if isinstance(token_ids, bytes) else token_bytes(token_ids)
        self._length = length
        self.seed = seed
        self.first_extra = first_extra
        self.max_tokens = max_tokens
        self._keys: dict[int, tuple[int, ...]] = {}

    @property
    def tokens(self) -> int:
        """Token ids known (the prompt's, or its tokenized start's)."""
        return len(self.data) // 4

    @property
    def length(self) -> int:
        """The whole prompt's length in tokens (an estimate when only its start was tokenized)."""
        return self._length if self._length is not None else len(self.data) // 4

    def token_ids(self, limit: int | None = None) -> list[int]:
        """The token ids known, or the first `limit` of them."""
        data = self.data if limit is None else self.data[: max(0, limit) * 4]
        return array("I", data).tolist()

    def keys(self, block_size: int) -> tuple[int, ...]:
        """The chained keys of the prompt's full blocks of `block_size` tokens."""
        keys = self._keys.get(block_size)
        if keys is None:
            keys = self._keys[block_size] = tuple(
                chain_keys(
                    self.data,
                    block_size,
                    self.seed,
                    self.first_extra,
                    limit=max(1, self.max_tokens // block_size),
                )
            )
        return keys

    def reuse(self, previous: PromptBlocks) -> None:
        """Adopt `previous`'s keys for the blocks both prompts share (same namespace), then compute
        only the rest when asked."""
        if previous.seed != self.seed or previous.first_extra != self.first_extra:
            return
        common = _common_prefix(self.data, previous.data)
        for block_size, keys in previous._keys.items():
            if block_size in self._keys:
                continue
            shared = min(len(keys), common // (block_size * 4))
            if not shared:
                continue
            head = keys[:shared]
            step = block_size * 4
            count = min(len(self.data) // step, max(1, self.max_tokens // block_size))
            if count <= shared:
                self._keys[block_size] = head[:count]
                continue
            view = memoryview(self.data)
            key = head[-1]
            tail: list[int] = []
            start = shared * step
            for _ in range(count - shared):
                end = start + step
                key = hash((key, view[start:end]))
                tail.append(key)
                start = end
            self._keys[block_size] = head + tuple(tail)


def _common_prefix(a: bytes, b: bytes) -> int:
    """Length in bytes of the common prefix of `a` and `b`, a multiple of 4 (whole tokens)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n - n % 4
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo - lo % 4


def _frozen(value: Any) -> Any:
    """A hashable form of an event's extra keys (msgpack gives lists)."""
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    return value


__all__ = [
    "ROOT",
    "PromptBlocks",
    "block_key",
    "chain_keys",
    "salt_extra",
    "seed_for",
    "token_bytes",
]
