"""The engines' KV-event batches decoded: encoded here exactly as the engines encode them.

The structs below are vLLM 0.32's (`vllm/distributed/kv_events.py`) and SGLang 0.5.23's
(`sglang/srt/disaggregation/kv_events.py`) event types, field for field with their msgspec options,
so `msgspec.msgpack.encode` produces the bytes those engines publish. Earlier vLLM releases encoded
events as tagged arrays; that encoding is here too.
"""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.kv_events import (
    END_SEQ,
    Cleared,
    DecodeError,
    Removed,
    Stored,
    decode_batch,
    decode_event,
    encode_batch,
    sequence,
)
from gateway.routing.kv_events import apply_events
from policies.kv_blocks import PromptBlocks
from policies.kv_index import KvIndex
from tests.support import examples


# -- vLLM 0.32 -------------------------------------------------------------------------------------
class VllmEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class VllmEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    pass


class VBlockStored(VllmEvent, tag="BlockStored"):  # type: ignore[call-arg]
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class VBlockRemoved(VllmEvent, tag="BlockRemoved"):  # type: ignore[call-arg]
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class VAllBlocksCleared(VllmEvent, tag="AllBlocksCleared"):  # type: ignore[call-arg]
    pass


# vLLM before map-encoded events: tagged arrays in declaration order
class OldEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    pass


class OldBlockStored(OldEvent, tag="BlockStored"):  # type: ignore[call-arg]
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None


class OldBlockRemoved(OldEvent, tag="BlockRemoved"):  # type: ignore[call-arg]
    block_hashes: list[int]
    medium: str | None = None


# -- SGLang 0.5.23 ---------------------------------------------------------------------------------
class SglEventBatch(msgspec.Struct, array_like=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list[Any]
    attn_dp_rank: int | None = None


class SglEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    pass


class SBlockStored(SglEvent, tag="BlockStored"):  # type: ignore[call-arg]
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class SBlockRemoved(SglEvent, tag="BlockRemoved"):  # type: ignore[call-arg]
    block_hashes: list[int]
    medium: str | None = None


class SAllBlocksCleared(SglEvent, tag="AllBlocksCleared"):  # type: ignore[call-arg]
    pass


def encode(batch: msgspec.Struct) -> bytes:
    return msgspec.msgpack.encode(batch)


TOKENS = list(range(1000, 1064))


def test_vllm_batches_decode_to_the_three_events() -> None:
    stored = VBlockStored(
        block_hashes=[11, 12, 13, 14],
        parent_block_hash=None,
        token_ids=TOKENS,
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        extra_keys=[None, None, None, None],
        group_idx=0,
        kv_cache_spec_kind="full_attention",
        session_id="s-1",
    )
    more = VBlockStored([15], 14, list(range(16)), 16, None, "GPU", None)
    payload = encode(VllmEventBatch(1.5, [stored, more, VBlockRemoved([12, 13], "GPU"), VAllBlocksCleared()]))
    batch = decode_batch(payload)
    assert batch.ts == 1.5 and batch.rank is None and batch.skipped == 0
    assert batch.events == [
        Stored([11, 12, 13, 14], None, TOKENS, 16, [None, None, None, None], None),
        Stored([15], 14, list(range(16)), 16, None, None),
        Removed([12, 13]),
        Cleared(),
    ]
    assert decode_batch(encode(VllmEventBatch(0.0, [], 3))).rank == 3
    assert decode_batch(msgpack.packb([0.0, []])).rank is None  # a batch without its rank field


def test_vllm_digest_hashes_are_the_same_ints_everywhere() -> None:
    """`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`: hashes are 32-byte digests; parent and removal must
    name a block as its store did."""
    a, b = bytes(range(32)), bytes(range(1, 33))
    payload = encode(
        VllmEventBatch(
            0.0,
            [
                VBlockStored([a], None, TOKENS[:16], 16, None, "GPU", None),
                VBlockStored([b], a, TOKENS[16:32], 16, None, "GPU", None),
                VBlockRemoved([b], "GPU"),
            ],
        )
    )
    first, second, removed = decode_batch(payload).events
    assert isinstance(first, Stored) and isinstance(second, Stored) and isinstance(removed, Removed)
    assert second.parent == first.block_hashes[0] == int.from_bytes(a, "big")
    assert removed.block_hashes == second.block_hashes


def test_vllm_salt_and_lora_are_kept_other_tiers_and_groups_are_dropped() -> None:
    salted = VBlockStored([1, 2], None, TOKENS[:32], 16, 7, "GPU", "adapter", extra_keys=[("salt",), None])
    events = [
        salted,
        VBlockStored([3], None, TOKENS[:16], 16, None, "CPU", None),  # offloaded copy
        VBlockStored([4], None, TOKENS[:16], 16, None, "GPU", None, group_idx=1),  # sliding window
        VBlockRemoved([3], "CPU"),
        VBlockRemoved([4], "GPU", group_idx=1),
    ]
    batch = decode_batch(encode(VllmEventBatch(0.0, events)))
    assert batch.skipped == 4
    (event,) = batch.events
    assert isinstance(event, Stored)
    assert event.extra_keys == [["salt"], None] and event.lora == "adapter"


def test_vllm_lora_name_leaves_the_extra_keys() -> None:
    """Real vLLM 0.32 leads every block's extra keys with the adapter's name (`[["tiny-lora"], ...]`
    for a LoRA request, measured): it becomes `Stored.lora`, and only what else a block was hashed
    with (a salt) stays an extra key."""
    events = [
        VBlockStored([1, 2], None, TOKENS[:32], 16, 1, "GPU", "tiny-lora", extra_keys=[("tiny-lora",), ("tiny-lora",)]),
        VBlockStored([3, 4], None, TOKENS[:32], 16, 1, "GPU", "tiny-lora", extra_keys=[("tiny-lora", "salt"), ("tiny-lora",)]),
        VBlockStored([5], None, TOKENS[:16], 16, None, "GPU", None, extra_keys=[None]),
    ]  # fmt: skip
    plain, salted, base = decode_batch(encode(VllmEventBatch(0.0, events))).events
    assert isinstance(plain, Stored) and isinstance(salted, Stored) and isinstance(base, Stored)
    assert plain.lora == "tiny-lora" and plain.extra_keys is None
    assert salted.lora == "tiny-lora" and salted.extra_keys == [["salt"], None]
    assert base.lora is None and base.extra_keys == [None]


def test_vllm_array_encoded_events_of_earlier_releases() -> None:
    payload = encode(
        VllmEventBatch(
            2.0, [OldBlockStored([5, 6], None, TOKENS[:32], 16, None, "GPU"), OldBlockRemoved([6])]
        )
    )
    assert msgpack.unpackb(payload)[1][0][0] == "BlockStored"
    assert decode_batch(payload).events == [Stored([5, 6], None, TOKENS[:32], 16, None, None), Removed([6])]


def test_sglang_pages_salt_and_tiers() -> None:
    """SGLang's radix cache publishes one store per page (coalesced when they chain), signed int64
    hashes, its salt as a field of its own, and `CPU_PINNED` for its host tier."""
    pages = SBlockStored(
        block_hashes=[-5, 9, -7], parent_block_hash=None, token_ids=[1, 2, 3], block_size=1, lora_id=None,
        medium="GPU", cache_salt="tenant-a", session_id="x",
    )  # fmt: skip
    after = SBlockStored([4], -7, [4], 1, None, "GPU", cache_salt="tenant-a")
    host = SBlockStored([8], None, [1], 1, None, "CPU_PINNED")
    payload = encode(
        SglEventBatch(3.0, [pages, after, host, SBlockRemoved([9], "GPU"), SAllBlocksCleared()], 0)
    )
    batch = decode_batch(payload)
    assert batch.rank == 0 and batch.skipped == 1
    assert batch.events == [
        # the salt is the first block's extra key, as vLLM publishes it, only where a chain starts
        Stored([-5, 9, -7], None, [1, 2, 3], 1, [["tenant-a"], None, None]),
        Stored([4], -7, [4], 1, None),
        Removed([9]),
        Cleared(),
    ]


def test_sglang_bigram_pages_are_not_a_token_prefix() -> None:
    bigram = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
              "token_ids": [[1, 2]], "block_size": 1, "lora_id": None}  # fmt: skip
    assert decode_event(bigram) is None


def test_both_engines_events_reach_the_same_keys() -> None:
    """The same 64 tokens stored by vLLM (16-token blocks) and by SGLang (1-token pages, grouped
    into 16) match a prompt alike: the index keys the tokens, not the engines' hashes."""
    index = KvIndex()
    for name in ("vllm", "sglang"):
        index.attach(name)
        index.set_live(name, True)
    vllm = decode_batch(
        encode(VllmEventBatch(0.0, [VBlockStored([1, 2, 3, 4], None, TOKENS, 16, None, "GPU", None)]))
    )
    sgl = decode_batch(
        encode(SglEventBatch(0.0, [SBlockStored(list(range(-64, 0)), None, TOKENS, 1, None, "GPU")]))
    )
    for name, batch in (("vllm", vllm), ("sglang", sgl)):
        for event in batch.events:
            assert isinstance(event, Stored)
            index.stored(name, event.block_hashes, event.parent, event.token_ids, event.block_size)
    assert index.match(PromptBlocks([*TOKENS, 5, 6, 7]), ["vllm", "sglang"]) == {"vllm": 64, "sglang": 64}


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        b"not msgpack at all",
        msgpack.packb({"ts": 1}),
        msgpack.packb([1.0]),
        msgpack.packb([1.0, 5]),
    ],
)
def test_what_is_not_a_batch_is_one_clear_error(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_batch(payload)


def test_malformed_events_are_skipped_one_by_one() -> None:
    good = {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"}
    bad: list[Any] = [
        None,
        7,
        "BlockStored",
        [],
        [3, 4],
        {"type": "BlockStored"},
        {"type": "BlockStored", "block_hashes": [1], "token_ids": "abc", "block_size": 16},
        {"type": "BlockStored", "block_hashes": [1], "token_ids": [1], "block_size": 0},
        {
            "type": "BlockStored",
            "block_hashes": [1],
            "token_ids": [1],
            "block_size": 1,
            "parent_block_hash": 1.5,
        },
        {"type": "BlockRemoved", "block_hashes": [None]},
        {"type": "BlockRemoved", "block_hashes": [1], "medium": ["GPU"]},
        {"type": "BlockRemoved", "block_hashes": [1], "medium": {"a": 1}},
        {"type": "Renamed"},
    ]
    batch = decode_batch(msgpack.packb([0.0, [*bad, good], "rank?"]))
    assert batch.events == [Removed([1])] and batch.skipped == len(bad) and batch.rank is None


_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=True), st.text(max_size=8),
    st.binary(max_size=40), st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "GPU", "CPU"]),
)  # fmt: skip
_value = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
_field = st.sampled_from(
    ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "medium", "group_idx",
     "extra_keys", "lora_name", "cache_salt"]
)  # fmt: skip
_event = st.one_of(_value, st.dictionaries(_field, _value, max_size=8))


@settings(max_examples=examples(400), deadline=None)
@given(ts=_value, events=st.lists(_event, max_size=5), rank=_value)
def test_any_msgpack_batch_decodes_or_raises_decode_error(ts: Any, events: list[Any], rank: Any) -> None:
    """Whatever a publisher sends, decoding never raises anything but `DecodeError`, and what it
    returns the index takes without raising."""
    try:
        payload = msgpack.packb([ts, events, rank], use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        return  # not encodable: no publisher can send it
    batch = decode_batch(payload)
    index = KvIndex()
    index.attach("b")
    apply_events(index, "b", batch.events)  # what the gateway's subscriber does with a batch
    assert len(batch.events) + batch.skipped == len(events)


@settings(max_examples=examples(200), deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_decode_or_raise_decode_error(payload: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode_batch(payload)


def test_sequence_frames_and_the_replay_end() -> None:
    assert sequence((5).to_bytes(8, "big")) == 5
    assert sequence((-1).to_bytes(8, "big", signed=True)) == END_SEQ
    assert decode_batch(encode_batch([{"type": "AllBlocksCleared"}], 1.0, 2)).events == [Cleared()]
