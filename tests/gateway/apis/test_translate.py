"""The request translators (pure): Responses and Messages requests → the neutral chat request, and
the routing features they produce (the same prefix keys as the same conversation sent to chat)."""

from __future__ import annotations

from typing import Any

import pytest

from engines.errors import ApiError
from engines.validate import validate_request
from gateway.apis import messages_request, responses_request
from policies.features import extract_features

TOOL_CHAT = {
    "type": "function",
    "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}},
}


def _responses(
    body: dict[str, Any], context: list[dict[str, Any]] | None = None
) -> responses_request.Translation:
    return responses_request.translate(body, context=context, response_id="resp_x", created_at=1)


def test_a_responses_conversation_has_the_chat_conversations_prefix_keys() -> None:
    chat = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is the capital of France? " * 20},
        ],
        "tools": [TOOL_CHAT],
    }
    t = _responses(
        {
            "model": "m",
            "instructions": "You are terse.",
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_text", "text": "What is the capital of France? " * 20}],
                }
            ],
            "tools": [
                {
                    "type": "function",
                    "name": "f",
                    "description": "d",
                    "parameters": {"type": "object", "properties": {}},
                }
            ],
        }
    )
    validate_request("chat", t.chat)
    a, b = extract_features(t.chat), extract_features(chat)
    assert (
        a.block_hashes == b.block_hashes
        and a.anchor_hash == b.anchor_hash
        and a.prompt_tokens == b.prompt_tokens
    )
    m = messages_request.translate(
        {
            "model": "m",
            "max_tokens": 5,
            "system": [{"type": "text", "text": "You are terse."}],
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "What is the capital of France? " * 20}],
                }
            ],
            "tools": [
                {"name": "f", "description": "d", "input_schema": {"type": "object", "properties": {}}}
            ],
        }
    )
    validate_request("chat", m)
    c = extract_features(m)
    assert c.block_hashes == b.block_hashes and c.anchor_hash == b.anchor_hash


def test_responses_items_become_chat_messages() -> None:
    t = _responses(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "weather?"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Let me look."}],
                },
                {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            ],
            "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
            "max_output_tokens": 64,
            "reasoning": {"effort": "low"},
            "top_k": 5,
        }
    )
    assert t.chat["messages"] == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    assert t.chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "n", "schema": {"type": "object"}},
    }
    assert t.chat["max_tokens"] == 64 and t.chat["reasoning_effort"] == "low" and t.chat["top_k"] == 5
    assert [i["type"] for i in t.input_items] == [
        "message",
        "reasoning",
        "message",
        "function_call",
        "function_call_output",
    ]
    assert all(i["id"] for i in t.input_items)


def test_previous_context_comes_first_and_instructions_are_not_carried_over() -> None:
    context = [
        {
            "id": "msg_a",
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": [{"type": "input_text", "text": "hi"}],
        },
        {
            "id": "fc_a",
            "type": "function_call",
            "status": "completed",
            "arguments": "{}",
            "call_id": "call_9",
            "name": "f",
        },
    ]
    t = _responses(
        {
            "model": "m",
            "instructions": "new rules",
            "input": [{"type": "function_call_output", "call_id": "call_9", "output": "1"}],
        },
        context,
    )
    roles = [m["role"] for m in t.chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool"]
    assert t.chat["messages"][0]["content"] == "new rules"
    assert len(t.context) == 3 and len(t.input_items) == 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        (
            {"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
        (
            {
                "model": "m",
                "input": "x",
                "tool_choice": {"type": "function", "name": "g"},
                "tools": [{"type": "function", "name": "f"}],
            },
            "tool_choice",
        ),
        (
            {"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}},
            "text.format.name",
        ),
        ({"model": "m", "input": "x", "include": ["message.output_text.logprobs"]}, "include"),
        ({"model": "m", "input": "x", "metadata": {str(i): "v" for i in range(17)}}, "metadata"),
        ({"model": "m", "input": "x", "conversation": "conv_1"}, "conversation"),
    ],
)
def test_responses_refusals_name_the_responses_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as err:
        _responses(body)
    assert err.value.status == 400 and err.value.param == param


def test_messages_blocks_and_options() -> None:
    chat = messages_request.translate(
        {
            "model": "m",
            "max_tokens": 9,
            "stop_sequences": ["END"],
            "temperature": 0.5,
            "top_k": 3,
            "metadata": {"user_id": "u1"},
            "thinking": {"type": "disabled"},
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "..", "signature": "s"},
                        {"type": "text", "text": "calling"},
                        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "42"}],
                        },
                        {"type": "text", "text": "thanks"},
                    ],
                },
            ],
        }
    )
    validate_request("chat", chat)
    assert chat["messages"] == [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "calling",
            "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "42"},
        {"role": "user", "content": "thanks"},
    ]
    assert chat["stop"] == ["END"] and chat["max_tokens"] == 9 and chat["top_k"] == 3 and chat["user"] == "u1"
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["chat_template_kwargs"] == {"enable_thinking": False}


def test_count_tokens_needs_no_max_tokens() -> None:
    chat = messages_request.translate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}]}, count_only=True
    )
    assert "max_tokens" not in chat
    with pytest.raises(ApiError, match="max_tokens: Field required"):
        messages_request.translate({"model": "m", "messages": [{"role": "user", "content": "x"}]})
