"""Block keys of a prompt: chained, namespaced, reused across the turns of a conversation."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from policies.kv_blocks import ROOT, PromptBlocks, block_key, chain_keys, salt_extra, seed_for, token_bytes


def test_a_key_names_the_whole_prefix() -> None:
    a = PromptBlocks(list(range(64)))
    b = PromptBlocks([*range(16), *range(100, 148)])
    assert len(a.keys(16)) == 4
    assert a.keys(16)[0] == b.keys(16)[0]
    # same tokens in block 3, different history: different keys
    c = PromptBlocks([*range(100, 116), *range(16, 64)])
    assert a.keys(16)[3] != c.keys(16)[3]


def test_only_full_blocks_are_keyed_and_the_limit_holds() -> None:
    p = PromptBlocks(list(range(47)), max_tokens=40)
    assert len(p.keys(16)) == 2 and len(p.keys(8)) == 5  # the bound is in tokens, whatever the block
    assert len(PromptBlocks(list(range(47))).keys(16)) == 2
    assert len(PromptBlocks(list(range(15))).keys(16)) == 0


def test_keys_are_the_chain_of_block_key() -> None:
    ids = list(range(1000, 1048))
    data = token_bytes(ids)
    k0 = block_key(ROOT, data[:64])
    k1 = block_key(k0, data[64:128])
    k2 = block_key(k1, data[128:192])
    assert chain_keys(data, 16) == [k0, k1, k2]


def test_namespaces_do_not_match() -> None:
    ids = list(range(32))
    plain = PromptBlocks(ids).keys(16)
    salted = PromptBlocks(ids, first_extra=salt_extra("tenant-a")).keys(16)
    other = PromptBlocks(ids, first_extra=salt_extra("tenant-b")).keys(16)
    lora = PromptBlocks(ids, seed=seed_for("adapter")).keys(16)
    assert len({plain[0], salted[0], other[0], lora[0]}) == 4
    assert salt_extra(None) is None and seed_for(None) == ROOT


@given(
    st.lists(st.integers(0, 2**20), min_size=0, max_size=300),
    st.lists(st.integers(0, 2**20), min_size=0, max_size=300),
    st.integers(0, 300),
    st.sampled_from([1, 4, 16, 32]),
)
def test_reuse_gives_the_same_keys_as_computing_them(
    prev: list[int], tail: list[int], cut: int, block_size: int
) -> None:
    old = PromptBlocks(prev)
    old.keys(block_size)
    new_ids = prev[:cut] + tail
    new = PromptBlocks(new_ids)
    new.reuse(old)
    assert new.keys(block_size) == PromptBlocks(new_ids).keys(block_size)


def test_reuse_respects_the_namespace_and_the_limit() -> None:
    rng = random.Random(1)
    ids = [rng.randrange(50000) for _ in range(400)]
    old = PromptBlocks(ids, first_extra=("s",))
    old.keys(16)
    new = PromptBlocks(ids + [1, 2, 3] * 20)
    new.reuse(old)  # another namespace: nothing adopted
    assert new.keys(16) == PromptBlocks(ids + [1, 2, 3] * 20).keys(16)
    capped = PromptBlocks(ids, max_tokens=80)
    capped.reuse(PromptBlocks(ids))  # previous has no keys computed: nothing to adopt
    full = PromptBlocks(ids)
    full.keys(16)
    capped2 = PromptBlocks(ids, max_tokens=80)
    capped2.reuse(full)
    assert capped2.keys(16) == full.keys(16)[:5]
