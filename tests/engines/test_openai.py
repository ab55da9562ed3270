"""The encoder: OpenAI's exact shapes, streamed and not, and what the SDK makes of them."""

from __future__ import annotations

import re
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming._deltas import accumulate_delta
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from engines.base import Choice, Completion, Delta, ToolCall, ToolCallDelta, Usage
from engines.errors import ApiError, context_length_exceeded
from engines.openai import StreamEncoder, encode_completion, new_completion_id, new_tool_call_id
from engines.registry import get_dialect
from tests.engines.payloads import BODIES, STREAMS, run_stream, sse_events
from tests.support import examples

FULL_USAGE = {
    "prompt_tokens": 9,
    "completion_tokens": 20,
    "total_tokens": 29,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    "completion_tokens_details": {
        "reasoning_tokens": 0,
        "audio_tokens": 0,
        "accepted_prediction_tokens": 0,
        "rejected_prediction_tokens": 0,
    },
}


def encoder(**kw: Any) -> StreamEncoder:
    args: dict[str, Any] = {
        "endpoint": "chat",
        "id": "chatcmpl-abc",
        "created": 7,
        "model": "m",
        "include_usage": False,
        "tool_choice_named": False,
    }
    args.update(kw)
    return StreamEncoder(**args)


def test_ids() -> None:
    assert re.fullmatch(r"chatcmpl-[A-Za-z0-9]{29}", new_completion_id("chat"))
    assert re.fullmatch(r"cmpl-[A-Za-z0-9]{29}", new_completion_id("completions"))
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", new_tool_call_id())
    assert len({new_tool_call_id() for _ in range(1000)}) == 1000


def test_chat_body_exact() -> None:
    c = Completion([Choice(0, "Hello", "stop")], Usage(9, 20))
    body = orjson.loads(
        encode_completion(c, endpoint="chat", id="chatcmpl-x", created=5, model="m", tool_choice_named=False)
    )
    assert body == {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "created": 5,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello", "refusal": None, "annotations": []},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": FULL_USAGE,
        "service_tier": None,
        "system_fingerprint": None,
    }
    ChatCompletion.model_validate(body)


def test_tool_call_body_and_finish_reasons() -> None:
    calls = [ToolCall("chatcmpl-tool-1", "f", '{"a": 1}')]
    for engine_reason, named, expected in [
        ("tool_calls", False, "tool_calls"),
        ("stop", False, "tool_calls"),
        ("tool_calls", True, "stop"),
        ("stop", True, "stop"),
        ("length", False, "length"),
    ]:
        c = Completion([Choice(0, None, engine_reason, tool_calls=calls)])
        body = orjson.loads(
            encode_completion(c, endpoint="chat", id="i", created=1, model="m", tool_choice_named=named)
        )
        msg = body["choices"][0]["message"]
        assert msg["content"] is None
        assert msg["refusal"] is None and msg["annotations"] == []
        (tc,) = msg["tool_calls"]
        assert re.fullmatch(r"call_[A-Za-z0-9]{24}", tc["id"])
        assert tc["type"] == "function" and tc["function"] == {"name": "f", "arguments": '{"a": 1}'}
        assert body["choices"][0]["finish_reason"] == expected


def test_reasoning_field_only_when_present() -> None:
    c = Completion(
        [Choice(0, "x", "stop", reasoning="why")], Usage(1, 2, cached_tokens=1, reasoning_tokens=1)
    )
    body = orjson.loads(
        encode_completion(c, endpoint="chat", id="i", created=1, model="m", tool_choice_named=False)
    )
    assert body["choices"][0]["message"]["reasoning_content"] == "why"
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 1
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 1
    c2 = Completion([Choice(0, "x", "stop")])
    body2 = orjson.loads(
        encode_completion(c2, endpoint="chat", id="i", created=1, model="m", tool_choice_named=False)
    )
    assert "reasoning_content" not in body2["choices"][0]["message"]


def test_completions_body() -> None:
    c = Completion([Choice(1, "b", "length"), Choice(0, "a", "stop")], Usage(3, 4))
    body = orjson.loads(
        encode_completion(
            c, endpoint="completions", id="cmpl-x", created=5, model="m", tool_choice_named=False
        )
    )
    assert body["object"] == "text_completion"
    assert body["choices"] == [
        {"text": "a", "index": 0, "logprobs": None, "finish_reason": "stop"},
        {"text": "b", "index": 1, "logprobs": None, "finish_reason": "length"},
    ]
    assert body["usage"]["total_tokens"] == 7


def test_stream_layout_text() -> None:
    enc = encoder(include_usage=True)
    out = enc.encode([Delta(0, content="Hel")]) + enc.encode(
        [Delta(0, content="lo", finish_reason="stop"), Usage(9, 20)]
    )
    out += enc.finish()
    events = sse_events(out)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events if e != "[DONE]"]
    assert all(isinstance(c, dict) and c["id"] == "chatcmpl-abc" and c["created"] == 7 for c in chunks)
    deltas = [c["choices"][0]["delta"] if c["choices"] else None for c in chunks]  # type: ignore[index]
    assert deltas == [
        {"role": "assistant", "content": "", "refusal": None},
        {"content": "Hel"},
        {"content": "lo"},
        {},
        None,
    ]
    assert [c["choices"][0]["finish_reason"] if c["choices"] else "-" for c in chunks] == [
        None,
        None,
        None,
        "stop",
        "-",
    ]  # type: ignore[index]
    assert all(c["usage"] is None for c in chunks[:-1])  # type: ignore[index]
    assert chunks[-1]["usage"] == FULL_USAGE  # type: ignore[index]
    assert enc.usage == Usage(9, 20)
    for c in chunks:
        ChatCompletionChunk.model_validate(c)


def test_no_usage_chunk_unless_asked_but_usage_kept() -> None:
    enc = encoder(include_usage=False)
    out = enc.encode([Delta(0, content="x", finish_reason="stop"), Usage(1, 1)]) + enc.finish()
    assert b'"usage"' not in out
    assert enc.usage == Usage(1, 1)


def test_usage_fallback_and_zeros() -> None:
    enc = encoder(include_usage=True)
    out = enc.encode([Delta(0, content="x", finish_reason="stop")]) + enc.finish(Usage(5, 6))
    assert sse_events(out)[-2]["usage"]["total_tokens"] == 11  # type: ignore[index]
    enc = encoder(include_usage=True)
    out = enc.finish()
    assert sse_events(out) == [
        {
            "id": "chatcmpl-abc",
            "object": "chat.completion.chunk",
            "created": 7,
            "model": "m",
            "service_tier": None,
            "system_fingerprint": None,
            "choices": [],
            "usage": {**FULL_USAGE, "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        },
        "[DONE]",
    ]


def test_continuous_usage() -> None:
    enc = encoder(include_usage=True, continuous_usage=True)
    out = enc.encode([Usage(3, 1), Delta(0, content="x")])
    chunks = sse_events(out)
    assert chunks[-1]["usage"]["completion_tokens"] == 1  # type: ignore[index]


def test_tool_turn_first_chunk_has_null_content_and_no_repeats() -> None:
    enc = encoder()
    out = enc.encode([Delta(0, tool_calls=[ToolCallDelta(0, "x", "f", '{"a"')])])
    out += enc.encode([Delta(0, tool_calls=[ToolCallDelta(0, None, None, ": 1}")])])
    out += enc.encode([Delta(0, tool_calls=[ToolCallDelta(1, "y", "g", "")])])
    out += enc.encode([Delta(0, tool_calls=[ToolCallDelta(1, None, None, "{}")], finish_reason="tool_calls")])
    out += enc.finish()
    chunks = [e for e in sse_events(out) if e != "[DONE]"]
    deltas = [c["choices"][0]["delta"] for c in chunks]  # type: ignore[index]
    first = deltas[0]
    assert first["role"] == "assistant" and first["content"] is None and first["refusal"] is None
    assert first["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", first["tool_calls"][0]["id"])
    later = [d["tool_calls"][0] for d in deltas[1:] if "tool_calls" in d]
    ids = [t for t in later if "id" in t]
    assert [t["function"]["name"] for t in ids] == ["g"]
    for t in later:
        if "id" not in t:
            assert set(t) == {"index", "function"} and set(t["function"]) == {"arguments"}
    assert deltas[-1] == {} and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"  # type: ignore[index]


def test_error_ends_stream() -> None:
    enc = encoder()
    err = context_length_exceeded("too long")
    out = enc.encode([Delta(0, content="a"), err, Delta(0, content="never")])
    events = sse_events(out)
    assert events[-2] == {
        "error": {
            "message": "too long",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    assert events[-1] == "[DONE]"
    assert enc.encode([Delta(0, content="x")]) == b"" and enc.finish() == b"" and enc.error(err) == b""


def test_error_method() -> None:
    enc = encoder()
    assert sse_events(enc.error(ApiError(500, "boom"))) == [
        {"error": {"message": "boom", "type": "server_error", "param": None, "code": None}},
        "[DONE]",
    ]


def test_empty_choice_still_gets_role_and_finish() -> None:
    enc = encoder()
    chunks = sse_events(enc.encode([Delta(0, finish_reason="length")]) + enc.finish())
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}  # type: ignore[index]
    assert chunks[1]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]


def test_logprobs_in_stream_chunk() -> None:
    lp = {"content": [{"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []}], "refusal": None}
    enc = encoder()
    chunks = sse_events(enc.encode([Delta(0, content="a", logprobs=lp)]))
    assert chunks[-1]["choices"][0]["logprobs"] == lp  # type: ignore[index]


def _sdk_accumulate(data: bytes) -> ChatCompletion:
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for ev in sse_events(data):
        if ev != "[DONE]":
            state.handle_chunk(ChatCompletionChunk.model_validate(ev))
    return state.get_final_completion()


def test_sdk_accumulator_assembles_tool_calls_like_non_stream() -> None:
    for dialect in ("vllm", "sglang"):
        d = get_dialect(dialect)
        for stream_sc, body_sc in [(STREAMS[1], BODIES[1]), (STREAMS[2], BODIES[2])]:
            chunks = stream_sc.vllm if dialect == "vllm" else stream_sc.sglang
            final = _sdk_accumulate(run_stream(d, chunks, "chat", named=stream_sc.tool_choice_named))
            raw = body_sc.vllm if dialect == "vllm" else body_sc.sglang
            body = encode_completion(
                d.decode_response("chat", raw),
                endpoint="chat",
                id="chatcmpl-test",
                created=1234,
                model="public-model",
                tool_choice_named=body_sc.tool_choice_named,
            )
            ref = ChatCompletion.model_validate_json(body)
            got, want = final.choices[0], ref.choices[0]
            assert got.finish_reason == want.finish_reason
            assert got.message.content == want.message.content is None
            assert got.message.tool_calls and want.message.tool_calls
            for g, w in zip(got.message.tool_calls, want.message.tool_calls, strict=True):
                assert re.fullmatch(r"call_[A-Za-z0-9]{24}", g.id)
                assert (g.type, g.function.name, g.function.arguments) == (
                    w.type,
                    w.function.name,
                    w.function.arguments,
                )  # type: ignore[union-attr]


def test_sdk_accumulator_parallel_calls() -> None:
    for dialect, chunks in (("vllm", STREAMS[3].vllm), ("sglang", STREAMS[3].sglang)):
        final = _sdk_accumulate(run_stream(get_dialect(dialect), chunks, "chat"))
        calls = final.choices[0].message.tool_calls or []
        assert [(c.function.name, c.function.arguments) for c in calls] == [
            ("a", '{"x": 1}'),
            ("b", '{"y": 2}'),
        ]  # type: ignore[union-attr]
        assert final.choices[0].finish_reason == "tool_calls"


def test_accumulate_delta_never_doubles_ids() -> None:
    out = run_stream(get_dialect("sglang"), STREAMS[1].sglang, "chat")
    acc: dict[object, object] = {}
    for ev in sse_events(out):
        if ev != "[DONE]" and ev["choices"]:  # type: ignore[index]
            accumulate_delta(acc, ev["choices"][0]["delta"])  # type: ignore[index]
    (tc,) = acc["tool_calls"]  # type: ignore[misc]
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", tc["id"]) and tc["function"]["name"] == "get_weather"


_text = st.text(max_size=8)
_tool = st.builds(ToolCallDelta, st.integers(0, 3), st.none() | _text, st.none() | _text, _text)
_delta = st.builds(
    Delta,
    st.integers(0, 3),
    st.none() | _text,
    st.none() | _text,
    st.none() | st.lists(_tool, max_size=3),
    st.none() | st.sampled_from(["stop", "length", "tool_calls", "content_filter"]),
)
_event = _delta | st.builds(
    Usage,
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.none() | st.integers(0, 9),
    st.none() | st.integers(0, 9),
)


@settings(max_examples=examples(200), deadline=None)
@given(
    batches=st.lists(st.lists(_event, max_size=4), max_size=6),
    endpoint=st.sampled_from(["chat", "completions"]),
    include_usage=st.booleans(),
    named=st.booleans(),
)
def test_encoder_output_is_always_json_events(
    batches: list[list[Any]], endpoint: Any, include_usage: bool, named: bool
) -> None:
    enc = StreamEncoder(
        endpoint=endpoint,
        id="x",
        created=1,
        model='m"\n',
        include_usage=include_usage,
        tool_choice_named=named,
    )
    out = b"".join(enc.encode(b) for b in batches) + enc.finish()
    events = sse_events(out)
    assert events[-1] == "[DONE]"
    finished: set[int] = set()
    for ev in events[:-1]:
        assert isinstance(ev, dict) and ev["id"] == "x" and ev["model"] == 'm"\n'
        for ch in ev["choices"]:
            assert ch["index"] not in finished  # nothing after a choice's finish chunk
            if ch["finish_reason"] is not None:
                finished.add(ch["index"])
        if endpoint == "chat" and include_usage:
            ChatCompletionChunk.model_validate(ev)


def test_completions_stream_chunks_validate_with_sdk() -> None:
    from openai.types import Completion as SdkCompletion

    sc = next(s for s in STREAMS if s.endpoint == "completions")
    for name, chunks in (("vllm", sc.vllm), ("sglang", sc.sglang)):
        events = sse_events(run_stream(get_dialect(name), chunks, "completions"))
        assert events[-1] == "[DONE]"
        for ev in events[:-1]:  # the SDK builds stream chunks without validation (finish_reason null)
            assert isinstance(ev, dict) and ev["object"] == "text_completion" and ev["id"] == "cmpl-test"
            for ch in ev["choices"]:
                assert set(ch) == {"text", "index", "logprobs", "finish_reason"}
    body = BODIES[-1]
    out = encode_completion(
        get_dialect("sglang").decode_response("completions", body.sglang),
        endpoint="completions",
        id="cmpl-x",
        created=1,
        model="m",
        tool_choice_named=False,
    )
    SdkCompletion.model_validate_json(out)
