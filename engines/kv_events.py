"""The engines' KV-cache events on the wire: vLLM 0.32's and SGLang 0.5.23's, decoded to three types.

Both engines publish over ZMQ PUB a multipart message `[topic, sequence (8 bytes, big-endian), payload]`
per scheduler step that produced events; the payload is msgspec's msgpack of an `EventBatch`, a
positional array `[timestamp, [event, ...], rank]` (vLLM `data_parallel_rank`, SGLang `attn_dp_rank`).
Events are tagged structs (`vllm/distributed/kv_events.py`, `sglang/srt/disaggregation/kv_events.py`):
in 0.32 / 0.5.23 maps whose `type` names the struct, fields at their default omitted; earlier vLLM
releases encoded them as arrays `[tag, field, ...]` in declaration order, which is decoded too.

- `BlockStored`: `block_hashes` (int, or the 32 digest bytes with vLLM's
  `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`), `parent_block_hash`, `token_ids`, `block_size`, `lora_id`,
  `medium`, then vLLM's `lora_name`, `extra_keys` (per block), `group_idx`, ..., SGLang's `cache_salt`.
- `BlockRemoved`: `block_hashes`, `medium` (vLLM also `group_idx`).
- `AllBlocksCleared`.

Normalised here: hashes as ints; SGLang's `cache_salt` as the first block's extra key (`[salt]`, as vLLM
publishes it), when the store starts a chain; vLLM's LoRA adapter name (`lora_name`, which also leads
every block's `extra_keys`: `[["tiny-lora"], ...]` from real vLLM 0.32) as `Stored.lora` only; events
for another storage tier (`medium` other than the GPU's: CPU offload, disk) or another KV-cache group
(`group_idx` > 0: a hybrid model's sliding window layers) are dropped, since only the GPU's
full-attention blocks save a prefill. Nothing here does I/O; malformed events are skipped
(`decode_batch` never raises on a decodable msgpack batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

#: the first frame of a replay answer that ends the replay (`ZmqEventPublisher.END_SEQ`)
END_SEQ = -1
_GPU = frozenset((None, "GPU", "cuda", "gpu"))
# field order of the array encoding (vLLM before map-encoded events)
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


@dataclass(frozen=True, slots=True)
class Stored:
    block_hashes: list[int]
    parent: int | None
    token_ids: list[int]
    block_size: int
    extra_keys: list[Any] | None = None
    lora: str | None = None


@dataclass(frozen=True, slots=True)
class Removed:
    block_hashes: list[int]


@dataclass(frozen=True, slots=True)
class Cleared:
    pass


KvEvent = Stored | Removed | Cleared


@dataclass(frozen=True, slots=True)
class Batch:
    ts: float
    events: list[KvEvent]
    rank: int | None
    skipped: int = 0  # events that were malformed or of another tier


class DecodeError(ValueError):
    """The payload is not an event batch."""


def sequence(frame: bytes) -> int:
    """The sequence number of a message (`END_SEQ` ends a replay)."""
    return int.from_bytes(frame, "big", signed=True)


def decode_batch(payload: bytes) -> Batch:
    """One message's payload. Raises `DecodeError` only when it is not a batch at all."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types for bad input
        raise DecodeError(f"not msgpack: {exc}") from None
    if not isinstance(raw, list | tuple) or len(raw) < 2 or not isinstance(raw[1], list):
        raise DecodeError("not an event batch")
    ts = raw[0] if isinstance(raw[0], int | float) else 0.0
    rank = raw[2] if len(raw) > 2 and isinstance(raw[2], int) else None
    events: list[KvEvent] = []
    skipped = 0
    for item in raw[1]:
        event = decode_event(item)
        if event is None:
            skipped += 1
        else:
            events.append(event)
    return Batch(float(ts), events, rank, skipped)


def decode_event(item: Any) -> KvEvent | None:
    """One event, or None when it is malformed or not about the GPU's full-attention blocks."""
    if isinstance(item, dict):
        kind = item.get("type")
        fields = item
    elif isinstance(item, list | tuple) and item and isinstance(item[0], str):
        kind = item[0]
        names = _STORED_FIELDS if kind == "BlockStored" else _REMOVED_FIELDS
        fields = dict(zip(names, item[1:], strict=False))
    else:
        return None
    if kind == "AllBlocksCleared":
        return Cleared()
    medium = fields.get("medium")
    if not (medium is None or isinstance(medium, str)) or medium not in _GPU:
        return None
    if (fields.get("group_idx") or 0) != 0:
        return None
    hashes = _hashes(fields.get("block_hashes"))
    if hashes is None:
        return None
    if kind == "BlockRemoved":
        return Removed(hashes)
    if kind != "BlockStored":
        return None
    tokens = fields.get("token_ids")
    block_size = fields.get("block_size")
    parent = fields.get("parent_block_hash")
    if not isinstance(tokens, list) or not isinstance(block_size, int) or block_size < 1:
        return None
    if not all(isinstance(t, int) for t in tokens):
        return None  # SGLang's bigram pages (EAGLE) carry pairs: not a token prefix
    if parent is not None:
        parent = _hash(parent)
        if parent is None:
            return None
    extra = fields.get("extra_keys")
    if not isinstance(extra, list):
        extra = None
    salt = fields.get("cache_salt")
    if isinstance(salt, str) and salt and parent is None and extra is None:
        extra = [[salt]] + [None] * (len(hashes) - 1)
    lora = fields.get("lora_name")
    if not isinstance(lora, str) or not lora:
        lora = None
    elif extra is not None:
        extra = _without_lora(extra, lora)
    return Stored(hashes, parent, tokens, block_size, extra, lora)


def _without_lora(extra: list[Any], lora: str) -> list[Any] | None:
    """A LoRA adapter's blocks: vLLM leads every block's extra keys with the adapter's name (then a
    salt, multimodal identifiers); the name is `Stored.lora` (the chain's namespace), so it is taken
    out of the extra keys, which then hold what a request of that adapter must also supply."""
    out = [(e[1:] or None) if isinstance(e, list) and e and e[0] == lora else e for e in extra]
    return out if any(e is not None for e in out) else None


def _hash(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, bytes):
        return int.from_bytes(value, "big")
    return None


def _hashes(values: Any) -> list[int] | None:
    if not isinstance(values, list):
        return None
    out: list[int] = []
    for v in values:
        h = _hash(v)
        if h is None:
            return None
        out.append(h)
    return out


def encode_batch(events: Sequence[dict[str, Any]], ts: float = 0.0, rank: int = 0) -> bytes:
    """A batch in the engines' encoding (for tests and tools; the engines publish their own)."""
    packed: bytes = msgpack.packb([ts, list(events), rank], use_bin_type=True)
    return packed
