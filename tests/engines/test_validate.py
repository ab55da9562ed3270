"""OpenAI's request semantics at the gateway: status, type, code, param and wording."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.errors import ApiError
from engines.validate import validate_request
from tests.support import examples

MSG = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MSG, **fields}


def err(endpoint: Any, body: Any) -> ApiError:
    with pytest.raises(ApiError) as ei:
        validate_request(endpoint, body)
    assert ei.value.status == 400 and ei.value.type == "invalid_request_error"
    return ei.value


@pytest.mark.parametrize(
    "body",
    [
        chat(),
        chat(stream=True, stream_options={"include_usage": True}),
        chat(tools=TOOLS, tool_choice="auto"),
        chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}),
        chat(tool_choice="none"),
        chat(n=128, temperature=0, top_p=1, seed=3, max_tokens=1, max_completion_tokens=5, stop=["a"]),
        chat(
            logprobs=True,
            top_logprobs=20,
            response_format={"type": "json_schema", "json_schema": {"name": "x"}},
        ),
        chat(n=None, temperature=None, stream_options=None, tools=None, top_k=5, regex="a"),
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "s"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a"},
                        {"type": "image_url", "image_url": {"url": "u"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c", "content": "r"},
            ],
        },
    ],
)
def test_valid_chat(body: dict[str, Any]) -> None:
    validate_request("chat", body)


@pytest.mark.parametrize("prompt", ["x", ["a", "b"], [1, 2], [[1], [2, 3]]])
def test_valid_completions(prompt: Any) -> None:
    validate_request("completions", {"model": "m", "prompt": prompt, "logprobs": 5, "echo": True})


@pytest.mark.parametrize(
    ("endpoint", "body", "param", "code", "message"),
    [
        (
            "chat",
            chat(tool_choice="auto"),
            "tool_choice",
            None,
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
        ),
        (
            "chat",
            chat(tool_choice={"type": "function", "function": {"name": "x"}}),
            "tool_choice",
            None,
            None,
        ),
        (
            "chat",
            chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "foo"}}),
            "tool_choice",
            None,
            "Invalid value for 'tool_choice': no function named foo was specified in the 'tools' parameter.",
        ),
        ("chat", chat(tools=[]), "tools", "empty_array", None),
        ("chat", chat(tools=TOOLS, tool_choice="sometimes"), "tool_choice", "invalid_value", None),
        (
            "chat",
            chat(stream_options={"include_usage": True}),
            "stream_options",
            None,
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
        ),
        ("chat", chat(stream=False, stream_options={}), "stream_options", None, None),
        (
            "chat",
            chat(n=130),
            "n",
            "integer_above_max_value",
            "Invalid 'n': integer above maximum value. Expected a value <= 128, but got 130 instead.",
        ),
        ("chat", chat(n=0), "n", "integer_below_min_value", None),
        (
            "chat",
            chat(temperature="hot"),
            "temperature",
            "invalid_type",
            "Invalid type for 'temperature': expected a decimal, but got a string instead.",
        ),
        ("chat", chat(temperature=True), "temperature", "invalid_type", None),
        ("chat", chat(temperature=2.5), "temperature", "decimal_above_max_value", None),
        ("chat", chat(n=1.5), "n", "invalid_type", None),
        ("chat", chat(top_logprobs=3), "top_logprobs", None, None),
        ("chat", chat(logprobs=True, top_logprobs=21), "top_logprobs", "integer_above_max_value", None),
        ("chat", chat(logprobs=1), "logprobs", "invalid_type", None),
        ("chat", chat(max_tokens=0), "max_tokens", "integer_below_min_value", None),
        ("chat", chat(max_completion_tokens="5"), "max_completion_tokens", "invalid_type", None),
        ("chat", chat(stream="yes"), "stream", "invalid_type", None),
        (
            "chat",
            chat(stream=True, stream_options={"include_usage": "yes"}),
            "stream_options.include_usage",
            "invalid_type",
            None,
        ),
        ("chat", chat(stop=[1]), "stop", "invalid_type", None),
        ("chat", {"model": "m"}, "messages", "missing_required_parameter", None),
        ("chat", {"model": "m", "messages": []}, "messages", "empty_array", None),
        ("chat", {"model": "m", "messages": "hi"}, "messages", "invalid_type", None),
        (
            "chat",
            {"model": "m", "messages": [{"role": "wizard", "content": "x"}]},
            "messages[0].role",
            "invalid_value",
            None,
        ),
        (
            "chat",
            {"model": "m", "messages": [{"content": "x"}]},
            "messages[0].role",
            "missing_required_parameter",
            None,
        ),
        (
            "chat",
            {"model": "m", "messages": [{"role": "user"}]},
            "messages[0].content",
            "missing_required_parameter",
            None,
        ),
        (
            "chat",
            {"model": "m", "messages": [{"role": "user", "content": 5}]},
            "messages[0].content",
            "invalid_type",
            None,
        ),
        (
            "chat",
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
            "messages[0].content[0].text",
            "invalid_type",
            None,
        ),
        (
            "chat",
            {"model": "m", "messages": [{"role": "user", "content": [{"text": "a"}]}]},
            "messages[0].content[0].type",
            "missing_required_parameter",
            None,
        ),
        (
            "chat",
            {"model": "m", "messages": [{"role": "tool", "content": "r"}]},
            "messages[0].tool_call_id",
            "missing_required_parameter",
            None,
        ),
        (
            "chat",
            {
                "model": "m",
                "messages": [
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}
                ],
            },
            "messages[0].tool_calls[0].function.arguments",
            "invalid_type",
            None,
        ),
        (
            "chat",
            chat(tools=[{"type": "function", "function": {}}]),
            "tools[0].function.name",
            "invalid_type",
            None,
        ),
        ("chat", chat(tools=[{"type": "retrieval"}]), "tools[0].type", "invalid_value", None),
        ("chat", chat(response_format={"type": "yaml"}), "response_format.type", "invalid_value", None),
        (
            "chat",
            chat(response_format={"type": "json_schema"}),
            "response_format.json_schema",
            "missing_required_parameter",
            None,
        ),
        ("chat", {"messages": MSG}, None, None, "You must provide a model parameter."),
        ("chat", {"model": 3, "messages": MSG}, "model", "invalid_type", None),
        ("completions", {"model": "m"}, "prompt", "missing_required_parameter", None),
        ("completions", {"model": "m", "prompt": [1, "a"]}, "prompt", "invalid_type", None),
        (
            "completions",
            {"model": "m", "prompt": "x", "logprobs": 6},
            "logprobs",
            "integer_above_max_value",
            None,
        ),
        ("completions", {"model": "m", "prompt": "x", "logprobs": True}, "logprobs", "invalid_type", None),
    ],
)
def test_invalid(endpoint: Any, body: Any, param: str | None, code: str | None, message: str | None) -> None:
    e = err(endpoint, body)
    assert (e.param, e.code) == (param, code)
    if message is not None:
        assert e.message == message


def test_not_an_object() -> None:
    assert err("chat", [1, 2]).message == "The request body must be a JSON object."


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=4),
    max_leaves=15,
)
_fields = st.sampled_from(
    [
        "model",
        "messages",
        "prompt",
        "n",
        "tools",
        "tool_choice",
        "stream",
        "stream_options",
        "logprobs",
        "top_logprobs",
        "response_format",
        "temperature",
        "stop",
        "max_tokens",
    ]
)


@settings(max_examples=examples(300), deadline=None)
@given(body=st.dictionaries(_fields, _json, max_size=8), endpoint=st.sampled_from(["chat", "completions"]))
def test_only_api_errors(body: dict[str, Any], endpoint: Any) -> None:
    try:
        validate_request(endpoint, body)
    except ApiError as e:
        assert e.status == 400


@pytest.mark.parametrize(
    ("prompt", "param", "code"),
    [
        ([], "prompt", "empty_array"),
        (["a", ""], "prompt[1]", "invalid_value"),
        ([[1], []], "prompt[1]", "invalid_value"),
        ([[1, -2]], "prompt[0][1]", "integer_below_min_value"),
        ([-1], "prompt[0]", "integer_below_min_value"),
        ([[3, 1 << 31]], "prompt[0][1]", "integer_above_max_value"),
        ([[3, 1.5]], "prompt[0][1]", "invalid_type"),
        ([[3, True]], "prompt[0][1]", "invalid_type"),
        (["a"] * 1025, "prompt", "array_above_max_length"),
    ],
)
def test_prompt_batches_the_engines_would_refuse_or_die_on(prompt: Any, param: str, code: str) -> None:
    with pytest.raises(ApiError) as info:
        validate_request("completions", {"model": "m", "prompt": prompt})
    assert info.value.param == param
    assert info.value.code == code
    validate_request("completions", {"model": "m", "prompt": ["a"] * 1024})
