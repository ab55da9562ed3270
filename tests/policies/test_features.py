from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.features import FeatureConfig, block_hashes, extract_features, render_chat
from tests.policies.fleet import conversation, features, grow, text
from tests.support import examples

TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _long(rng: random.Random) -> list[dict[str, Any]]:
    return conversation(rng, system=text(rng, 200), turns=3, words=80)


def test_block_hashes_are_deterministic_and_chained() -> None:
    data = bytes(range(256)) * 4
    hashes = block_hashes(data, 64, 100)
    assert len(hashes) == len(data) // 64
    assert hashes == block_hashes(data, 64, 100)
    # high bits: the prefix length in blocks; low bits: CRC-32 of the whole prefix
    import zlib

    for i, h in enumerate(hashes):
        assert h >> 32 == i + 1
        assert h & 0xFFFFFFFF == zlib.crc32(data[: (i + 1) * 64])


def test_block_hashes_are_capped() -> None:
    assert len(block_hashes(b"x" * 10_000, 64, 7)) == 7


def test_system_prompt_changes_every_block_hash() -> None:
    rng = random.Random(1)
    messages = _long(rng)
    other = [{"role": "system", "content": messages[0]["content"] + "!"}, *messages[1:]]
    a, b = features(messages), features(other)
    assert a.block_hashes[-1] != b.block_hashes[-1]
    assert a.anchor_hash != b.anchor_hash


def test_tool_schemas_change_the_hashes_from_the_first_block() -> None:
    rng = random.Random(2)
    messages = _long(rng)
    plain = features(messages)
    with_tools = features(messages, tools=[TOOL])
    other_tool = features(messages, tools=[{**TOOL, "function": {**TOOL["function"], "name": "get_time"}}])
    assert plain.block_hashes[0] != with_tools.block_hashes[0]
    assert with_tools.block_hashes[0] != other_tool.block_hashes[0]
    assert len({plain.anchor_hash, with_tools.anchor_hash, other_tool.anchor_hash}) == 3
    assert with_tools.has_tools and not plain.has_tools


def test_key_order_and_text_parts_do_not_matter() -> None:
    rng = random.Random(3)
    messages = _long(rng)
    reordered = [dict(reversed(list(m.items()))) for m in messages]
    parts = [
        {**m, "content": [{"type": "text", "text": m["content"]}]} if m["role"] == "user" else m
        for m in messages
    ]
    a = features(messages)
    assert features(reordered).block_hashes == a.block_hashes
    assert features(parts).block_hashes == a.block_hashes
    tools_reordered = features(messages, tools=[dict(reversed(list(TOOL.items())))])
    assert tools_reordered.block_hashes == features(messages, tools=[TOOL]).block_hashes


def test_growing_conversation_keeps_its_prefix_blocks_and_anchor() -> None:
    rng = random.Random(4)
    turn = conversation(rng, system=text(rng, 100), turns=1)
    first = features(turn)
    for _ in range(5):
        turn = grow(rng, turn)
        later = features(turn)
        assert later.anchor_hash == first.anchor_hash
        assert later.preamble_blocks == first.preamble_blocks
        assert later.block_hashes[: len(first.block_hashes)] == first.block_hashes
        first = later


def test_response_format_goes_last_and_does_not_move_the_prefix() -> None:
    rng = random.Random(5)
    messages = _long(rng)
    plain = features(messages)
    json_mode = features(messages, response_format={"type": "json_object"})
    assert json_mode.structured_output and not plain.structured_output
    assert json_mode.anchor_hash == plain.anchor_hash
    common = len(plain.block_hashes)
    assert json_mode.block_hashes[: common - 1] == plain.block_hashes[: common - 1]


def test_conversations_sharing_a_system_prompt_have_distinct_anchors() -> None:
    rng = random.Random(6)
    system = text(rng, 300)
    anchors = {features(conversation(rng, system=system)).anchor_hash for _ in range(200)}
    assert len(anchors) == 200
    one = features(conversation(rng, system=system))
    assert one.preamble_blocks > 0
    other = features(conversation(rng, system=system))
    assert one.block_hashes[: one.preamble_blocks] == other.block_hashes[: other.preamble_blocks]


def test_preamble_and_anchor_offsets() -> None:
    body = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
    rendered, preamble_end, anchor_end = render_chat(body)
    assert 0 < preamble_end < anchor_end == len(rendered)
    only_system = {"messages": [{"role": "system", "content": "s"}]}
    rendered, preamble_end, anchor_end = render_chat(only_system)
    assert preamble_end == anchor_end == len(rendered)


def test_history_blocks_end_where_the_last_message_starts() -> None:
    rng = random.Random(7)
    first = features(conversation(rng, system=text(rng, 300), words=200))
    assert first.history_blocks == first.preamble_blocks > 0  # a first turn has no history yet
    messages = conversation(rng, system=text(rng, 300), turns=3, words=200)
    later = features(messages)
    before_last = features(messages[:-1])
    # everything before the last (user) message: what the previous turn sent, plus its answer
    assert later.preamble_blocks < later.history_blocks <= len(before_last.block_hashes)
    assert later.history_blocks >= len(before_last.block_hashes) - 1
    assert extract_features({"model": "m", "prompt": "x" * 4000}).history_blocks == 0


def test_long_anchor_hash_includes_the_tail() -> None:
    config = FeatureConfig(anchor_max_bytes=256, anchor_tail_bytes=64)
    head = "x" * 2000
    a = extract_features({"model": "m", "messages": [{"role": "user", "content": head + "a"}]}, config)
    b = extract_features({"model": "m", "messages": [{"role": "user", "content": head + "b"}]}, config)
    assert a.anchor_hash != b.anchor_hash


def test_scalar_features() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_completion_tokens": 7,
        "user": "alice",
    }
    f = extract_features(body)
    assert (f.model, f.tool_choice, f.max_tokens, f.session_key) == ("m", "named", 7, "alice")
    # the session, most specific first: prompt_cache_key, x-session-id, metadata.session_id, user
    with_metadata = {**body, "metadata": {"session_id": "meta"}}
    assert extract_features(with_metadata).session_key == "meta"
    assert extract_features(with_metadata, session_key="header").session_key == "header"
    assert (
        extract_features({**with_metadata, "prompt_cache_key": "k"}, session_key="header").session_key == "k"
    )
    assert extract_features({"model": "m", "messages": []}).session_key is None
    assert extract_features({**body, "tool_choice": "required"}).tool_choice == "required"
    assert extract_features({**body, "tool_choice": None}).tool_choice is None
    assert extract_features({"model": "m", "messages": [], "max_tokens": 3}).max_tokens == 3
    assert extract_features({"model": "m", "messages": [], "guided_json": {}}).structured_output


def test_prompt_token_estimate_is_bytes_over_four() -> None:
    f = extract_features({"model": "m", "messages": [{"role": "user", "content": "a" * 4000}]})
    assert 1000 <= f.prompt_tokens <= 1010


def test_completions_prompts() -> None:
    s = extract_features({"model": "m", "prompt": "hello " * 200})
    assert s.prompt_tokens == 300 and len(s.block_hashes) == 9
    ids = extract_features({"model": "m", "prompt": list(range(500))})
    assert ids.prompt_tokens == 500
    batch = extract_features({"model": "m", "prompt": ["hello " * 200, "other"]})
    assert batch.block_hashes == s.block_hashes
    nested = extract_features({"model": "m", "prompt": [list(range(500))]})
    assert nested.block_hashes == ids.block_hashes
    assert extract_features({"model": "m", "prompt": []}).prompt_tokens == 0


def test_values_orjson_cannot_encode_do_not_break_extraction() -> None:
    huge = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"n": 1 << 70}]}
    assert extract_features(huge).has_tools
    assert extract_features({"model": "m", "prompt": [1, -5, 1 << 40]}).prompt_tokens == 3


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        FeatureConfig(block_tokens=0)
    with pytest.raises(ValueError):
        FeatureConfig(anchor_max_bytes=0)


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.text(max_size=300), min_size=1, max_size=8), st.integers(1, 8))
def test_extract_never_fails_and_prefix_property_holds(contents: list[str], cut: int) -> None:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(contents)]
    full = features(messages)
    part = features(messages[:cut])
    n = min(len(part.block_hashes), len(full.block_hashes))
    # The prefix's full blocks are the same, except possibly where the prefix's own last
    # message ended mid-block (then the block content differs).
    shorter = render_chat({"messages": messages[:cut]})[0]
    whole = render_chat({"messages": messages})[0]
    assert whole.startswith(shorter)
    assert part.block_hashes[:n] == full.block_hashes[:n]


def test_batch_tokens_of_completions_prompts() -> None:
    from policies.admission import completion_budget
    from policies.features import batch_tokens

    assert batch_tokens("a string", 4) == ()
    assert batch_tokens([1, 2, 3], 4) == ()  # one prompt of token ids
    assert batch_tokens(["abcd" * 3, "ab"], 4) == (3, 1)
    assert batch_tokens([[1, 2], [3]], 4) == (2, 1)
    single = extract_features({"model": "m", "prompt": "abcd" * 3})
    assert single.total_prompt_tokens == single.longest_prompt_tokens == single.prompt_tokens == 3
    batch = extract_features({"model": "m", "prompt": ["abcd" * 3, "abcd" * 8]})
    assert (batch.prompt_tokens, batch.total_prompt_tokens, batch.longest_prompt_tokens) == (3, 11, 8)
    assert batch.block_hashes == single.block_hashes  # a batch is routed by its first prompt
    # output budget: max_tokens x n x prompts
    assert completion_budget({"prompt": ["a", "b", "c"], "max_tokens": 5, "n": 2}, 16) == 30
    assert completion_budget({"prompt": [1, 2, 3], "max_tokens": 5}, 16) == 5
