"""The block hashes vLLM 0.32 and SGLang 0.5.23 publish in their KV-cache events, computed the same way.

A consumer (the gateway) can match a published block by its hash, computing it from token ids as the
engine does, or by the token ids the event carries. Both chains start over at every request's first
block and include everything before a block, so a hash names a whole prefix.

**vLLM** (`vllm/v1/core/kv_cache_utils.py`: `hash_block_tokens`, `init_none_hash`; `vllm/utils/hashing.py`):
a block's digest is `H((parent_digest, tuple(token_ids), extra_keys))` with `H` the
`--prefix-caching-hash-algo`: `sha256` (default; SHA-256 of `pickle.dumps(obj, protocol=5)`) or
`sha256_cbor` (SHA-256 of canonical CBOR). The first block's parent is `NONE_HASH = H(seed)`, the seed
being `PYTHONHASHSEED` when set, else `"vllm-none-hash"`. `extra_keys` is `None`, or for the first
block of a request with a `cache_salt` `(("cache_salt", salt),)`. Events carry
`int.from_bytes(digest, "big") & (2**64 - 1)` (the digest's last 8 bytes as an unsigned 64-bit int)
unless `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`, then the 32 digest bytes.

**SGLang** (`sglang/srt/mem_cache/cpp_utils/hash_binding.cpp` via `mem_cache/utils.py`): a page's
digest is `SHA-256(parent_digest || token_ids as little-endian uint32)`, the first page without a
parent, or for a request with a `cache_salt` the parent `SHA-256(b"sglang-cache-salt-v1\\0" + salt)`
(`compute_node_event_hash_values`). Events carry the digest's first 8 bytes as a signed 64-bit int
(`hash_str_to_int64`).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import struct
from collections.abc import Callable, Sequence
from typing import Literal

HashAlgo = Literal["sha256", "sha256_cbor"]
HASH_ALGOS: tuple[HashAlgo, ...] = ("sha256", "sha256_cbor")
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
_U64 = (1 << 64) - 1

Obj = object


def _cbor_head(major: int, n: int) -> bytes:
    """A CBOR item head (RFC 8949 §3), shortest form as canonical CBOR requires."""
    if n < 24:
        return bytes([major << 5 | n])
    if n < 1 << 8:
        return bytes([major << 5 | 24, n])
    if n < 1 << 16:
        return bytes([major << 5 | 25]) + n.to_bytes(2, "big")
    if n < 1 << 32:
        return bytes([major << 5 | 26]) + n.to_bytes(4, "big")
    return bytes([major << 5 | 27]) + n.to_bytes(8, "big")


def cbor(obj: Obj) -> bytes:
    """Canonical CBOR of the values a block-hash input holds: None, ints, str, bytes, tuples/lists
    (what `cbor2.dumps(obj, canonical=True)` writes for them)."""
    if obj is None:
        return b"\xf6"
    if isinstance(obj, bool):
        return b"\xf5" if obj else b"\xf4"
    if isinstance(obj, int):
        return _cbor_head(0, obj) if obj >= 0 else _cbor_head(1, -1 - obj)
    if isinstance(obj, bytes):
        return _cbor_head(2, len(obj)) + obj
    if isinstance(obj, str):
        raw = obj.encode("utf-8")
        return _cbor_head(3, len(raw)) + raw
    if isinstance(obj, tuple | list):
        return _cbor_head(4, len(obj)) + b"".join(cbor(x) for x in obj)
    raise TypeError(f"no CBOR encoding for {type(obj).__name__}")


def _sha256_pickle(obj: Obj) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=5)).digest()


def _sha256_cbor(obj: Obj) -> bytes:
    return hashlib.sha256(cbor(obj)).digest()


_HASH_FNS: dict[HashAlgo, Callable[[Obj], bytes]] = {"sha256": _sha256_pickle, "sha256_cbor": _sha256_cbor}


class VllmBlockHasher:
    """vLLM's chained block digests for one `--prefix-caching-hash-algo`."""

    __slots__ = ("_fn", "int_hashes", "none_hash")

    def __init__(
        self, algo: HashAlgo = "sha256", *, seed: str | None = None, int_hashes: bool = True
    ) -> None:
        self._fn = _HASH_FNS[algo]
        seed = seed if seed is not None else os.environ.get("PYTHONHASHSEED", DEFAULT_NONE_HASH_SEED)
        self.none_hash = self._fn(seed)
        self.int_hashes = int_hashes

    def digest(
        self,
        parent: bytes | None,
        token_ids: Sequence[int],
        cache_salt: str | None = None,
        lora: tuple[str, str] | None = None,
    ) -> bytes:
        """The digest of one full block; `parent` is the previous block's digest (None: first block,
        which is also the only one a `cache_salt` enters). `lora` (the adapter's name and path) enters
        every block, before the salt (vLLM's `generate_block_hash_extra_keys`)."""
        keys: tuple[tuple[str, ...], ...] = (("lora", *lora),) if lora is not None else ()
        if parent is None and cache_salt:
            keys += (("cache_salt", cache_salt),)
        return self._fn((parent or self.none_hash, tuple(token_ids), keys or None))

    def external(self, digest: bytes) -> int | bytes:
        """The hash as events carry it."""
        return int.from_bytes(digest, "big") & _U64 if self.int_hashes else digest


class SglangBlockHasher:
    """SGLang's chained page digests (`--page-size` tokens a page)."""

    __slots__ = ()

    def digest(
        self,
        parent: bytes | None,
        token_ids: Sequence[int],
        cache_salt: str | None = None,
        lora: tuple[str, str] | None = None,
    ) -> bytes:
        """The digest of one page; `parent` is the previous page's digest (None: first page). (`lora`
        is not used: the SGLang simulator serves no adapters.)"""
        if parent is None and cache_salt is not None:
            parent = hashlib.sha256(b"sglang-cache-salt-v1\0" + cache_salt.encode("utf-8")).digest()
        h = hashlib.sha256(parent) if parent is not None else hashlib.sha256()
        h.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
        return h.digest()

    @staticmethod
    def external(digest: bytes) -> int:
        """The hash as events carry it: the first 8 digest bytes as a signed int64."""
        return int.from_bytes(digest[:8], "big", signed=True)


BlockHasher = VllmBlockHasher | SglangBlockHasher
