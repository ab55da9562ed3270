"""Literal engine payloads, as vLLM and SGLang send them (shared/ENGINES.md and the engines' source).

Each scenario is the *same* logical answer in both engines' dialects, so the gateway's output for the
two must be byte-identical (modulo `id`/`created`, which the gateway mints, and tool call ids).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from engines.base import Dialect, Endpoint
from engines.openai import StreamEncoder


def _j(obj: object) -> bytes:
    return orjson.dumps(obj)


# -- vLLM stream chunk builders (explicitly-set fields present even when null) --------------------


def v_chunk(choices: list[dict[str, object]], usage: object = None, with_usage: bool = False) -> bytes:
    obj: dict[str, object] = {
        "id": "chatcmpl-9f2c",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "served-llama",
        "choices": choices,
    }
    if with_usage:
        obj["usage"] = usage
    return _j(obj)


def v_choice(index: int = 0, finish: str | None = None, **delta: object) -> dict[str, object]:
    c: dict[str, object] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
    if finish is not None:
        c["stop_reason"] = None
        c["token_ids"] = None
    return c


def s_chunk(choices: list[dict[str, object]], usage: object = None) -> bytes:
    return _j(
        {
            "id": "5c1e8fdd0a8e4a7c9d6d",
            "object": "chat.completion.chunk",
            "created": 1700000001,
            "model": "default",
            "choices": choices,
            "usage": usage,
        }
    )


def s_choice(
    index: int = 0,
    finish: str | None = None,
    role: str | None = None,
    content: str | None = None,
    reasoning_content: str | None = None,
    tool_calls: object = None,
    matched_stop: object = None,
) -> dict[str, object]:
    return {
        "index": index,
        "delta": {
            "role": role,
            "content": content,
            "reasoning_content": reasoning_content,
            "tool_calls": tool_calls,
        },
        "logprobs": None,
        "finish_reason": finish,
        "matched_stop": matched_stop,
    }


V_USAGE = {"prompt_tokens": 9, "total_tokens": 29, "completion_tokens": 20}
S_USAGE = {
    "prompt_tokens": 9,
    "total_tokens": 29,
    "completion_tokens": 20,
    "prompt_tokens_details": None,
    "reasoning_tokens": 0,
}


@dataclass(frozen=True)
class StreamScenario:
    name: str
    endpoint: Endpoint
    vllm: list[bytes]
    sglang: list[bytes]
    tool_choice_named: bool = False


def _text_stream() -> StreamScenario:
    vllm = [
        v_chunk([v_choice(role="assistant", content="")]),
        v_chunk([v_choice(content="Hello")]),
        v_chunk([v_choice(content=" world", finish="stop")]),  # last text and finish together
        v_chunk([], V_USAGE, with_usage=True),
    ]
    sglang = [
        s_chunk([s_choice(role="assistant", content="")]),
        s_chunk([s_choice(content="Hello")]),
        s_chunk([s_choice(content=" world")]),
        s_chunk([s_choice(finish="stop", matched_stop=2)]),  # separate finish chunk
        s_chunk([], S_USAGE),
    ]
    return StreamScenario("text", "chat", vllm, sglang)


def _tool_stream(named: bool) -> StreamScenario:
    vllm = [
        v_chunk([v_choice(role="assistant", content="")]),
        v_chunk(
            [
                v_choice(
                    tool_calls=[
                        {
                            "index": 0,
                            "id": "chatcmpl-tool-8a1b2c",
                            "type": "function",
                            "function": {"name": "get_weather"},
                        }
                    ]
                )
            ]
        ),
        v_chunk([v_choice(tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}])]),
        v_chunk(
            [
                v_choice(
                    tool_calls=[{"index": 0, "function": {"arguments": '"Paris"}'}}],
                    finish="stop" if named else "tool_calls",
                )
            ]
        ),
        v_chunk([], V_USAGE, with_usage=True),
    ]
    first = {
        "id": "call_0123456789abcdef01234567",
        "index": 0,
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }

    def later(args: str) -> dict[str, object]:
        return {"id": None, "index": 0, "type": "function", "function": {"name": None, "arguments": args}}

    sglang = [
        s_chunk([s_choice(role="assistant", content="")]),
        s_chunk([s_choice(content="", tool_calls=[first])]),
        s_chunk([s_choice(tool_calls=[later('{"city": ')])]),
        s_chunk([s_choice(tool_calls=[later('"Paris"}')])]),  # leftover arguments flushed at finish
        s_chunk([s_choice(finish="tool_calls", matched_stop=None)]),
        s_chunk([], S_USAGE),
    ]
    return StreamScenario(
        "tool_named" if named else "tool_auto", "chat", vllm, sglang, tool_choice_named=named
    )


def _parallel_tools() -> StreamScenario:
    def vt(i: int, name: str | None = None, args: str | None = None) -> dict[str, object]:
        if name is not None:
            return {"index": i, "id": f"chatcmpl-tool-{i}", "type": "function", "function": {"name": name}}
        return {"index": i, "function": {"arguments": args}}

    def st(i: int, name: str | None = None, args: str = "") -> dict[str, object]:
        if name is not None:
            return {
                "id": f"call_{i:024d}",
                "index": i,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
        return {"id": None, "index": i, "type": "function", "function": {"name": None, "arguments": args}}

    vllm = [
        v_chunk([v_choice(role="assistant", content="")]),
        v_chunk([v_choice(tool_calls=[vt(0, "a")])]),
        v_chunk([v_choice(tool_calls=[vt(0, args='{"x": 1}')])]),
        v_chunk([v_choice(tool_calls=[vt(1, "b")])]),
        v_chunk([v_choice(tool_calls=[vt(1, args='{"y": 2}')], finish="tool_calls")]),
        v_chunk([], V_USAGE, with_usage=True),
    ]
    sglang = [
        s_chunk([s_choice(role="assistant", content="")]),
        s_chunk([s_choice(tool_calls=[st(0, "a")])]),
        s_chunk([s_choice(tool_calls=[st(0, args='{"x": 1}')])]),
        s_chunk([s_choice(tool_calls=[st(1, "b")])]),
        s_chunk([s_choice(tool_calls=[st(1, args='{"y": 2}')])]),
        s_chunk([s_choice(finish="tool_calls")]),
        s_chunk([], S_USAGE),
    ]
    return StreamScenario("parallel_tools", "chat", vllm, sglang)


def _reasoning_stream() -> StreamScenario:
    vllm = [
        v_chunk([v_choice(role="assistant", content="")]),
        v_chunk([v_choice(reasoning="Think")]),
        v_chunk([v_choice(reasoning=" hard")]),
        v_chunk([v_choice(content="42", finish="stop")]),
        v_chunk(
            [],
            {**V_USAGE, "completion_tokens_details": {"reasoning_tokens": 2}},
            with_usage=True,
        ),
    ]
    sglang = [
        s_chunk([s_choice(role="assistant", content="")]),
        s_chunk([s_choice(reasoning_content="Think")]),
        s_chunk([s_choice(reasoning_content=" hard")]),
        s_chunk([s_choice(content="42")]),
        s_chunk([s_choice(finish="stop")]),
        s_chunk([], {**S_USAGE, "reasoning_tokens": 2}),
    ]
    return StreamScenario("reasoning", "chat", vllm, sglang)


def _n2_stream() -> StreamScenario:
    vllm = [
        v_chunk([v_choice(0, role="assistant", content="")]),
        v_chunk([v_choice(1, role="assistant", content="")]),
        v_chunk([v_choice(0, content="A")]),
        v_chunk([v_choice(1, content="B")]),
        v_chunk([v_choice(1, content="b", finish="length")]),
        v_chunk([v_choice(0, content="a", finish="stop")]),
        v_chunk([], {"prompt_tokens": 9, "total_tokens": 13, "completion_tokens": 4}, with_usage=True),
    ]
    sglang = [
        s_chunk([s_choice(0, role="assistant", content="")]),
        s_chunk([s_choice(0, content="A")]),
        s_chunk([s_choice(1, role="assistant", content="")]),
        s_chunk([s_choice(1, content="B")]),
        s_chunk([s_choice(1, content="b")]),
        s_chunk([s_choice(0, content="a")]),
        s_chunk([s_choice(1, finish="length")]),
        s_chunk([s_choice(0, finish="stop")]),
        s_chunk([], {**S_USAGE, "total_tokens": 13, "completion_tokens": 4}),
    ]
    return StreamScenario("n2", "chat", vllm, sglang)


def _cached_usage_stream() -> StreamScenario:
    vllm = [
        v_chunk([v_choice(role="assistant", content="")]),
        v_chunk([v_choice(content="ok", finish="stop")]),
        v_chunk([], {**V_USAGE, "prompt_tokens_details": {"cached_tokens": 8}}, with_usage=True),
    ]
    sglang = [
        s_chunk([s_choice(role="assistant", content="")]),
        s_chunk([s_choice(content="ok")]),
        s_chunk([s_choice(finish="stop")]),
        s_chunk([], {**S_USAGE, "prompt_tokens_details": {"cached_tokens": 8}}),
    ]
    return StreamScenario("cached_usage", "chat", vllm, sglang)


def _completions_stream() -> StreamScenario:
    def vc(text: str, finish: str | None = None) -> bytes:
        return _j(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 1,
                "model": "served",
                "choices": [
                    {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": None,
                        "prompt_logprobs": None,
                    }
                ],
                "usage": None,
            }
        )

    def sc(text: str, finish: str | None = None) -> bytes:
        return _j(
            {
                "id": "ab12",
                "object": "text_completion",
                "created": 1,
                "model": "default",
                "choices": [
                    {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": finish,
                        "matched_stop": None,
                    }
                ],
                "usage": None,
            }
        )

    vllm = [
        vc("Once"),
        vc(" upon", "length"),
        _j(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 1,
                "model": "s",
                "choices": [],
                "usage": V_USAGE,
            }
        ),
    ]
    sglang = [
        sc("Once"),
        sc(" upon"),
        sc("", "length"),
        _j(
            {
                "id": "ab12",
                "object": "text_completion",
                "created": 1,
                "model": "d",
                "choices": [],
                "usage": S_USAGE,
            }
        ),
    ]
    return StreamScenario("completions", "completions", vllm, sglang)


def _mid_stream_error() -> StreamScenario:
    vllm = [
        v_chunk([v_choice(role="assistant", content="")]),
        v_chunk([v_choice(content="Hi")]),
        _j(
            {
                "error": {
                    "message": "engine died at /opt/vllm/x.py",
                    "type": "InternalServerError",
                    "param": None,
                    "code": 500,
                }
            }
        ),
    ]
    sglang = [
        s_chunk([s_choice(role="assistant", content="")]),
        s_chunk([s_choice(content="Hi")]),
        _j(
            {
                "error": {
                    "object": "error",
                    "message": "scheduler crashed on 10.0.0.3:30000",
                    "type": "InternalServerError",
                    "param": None,
                    "code": 500,
                }
            }
        ),
    ]
    return StreamScenario("mid_stream_error", "chat", vllm, sglang)


STREAMS = [
    _text_stream(),
    _tool_stream(False),
    _tool_stream(True),
    _parallel_tools(),
    _reasoning_stream(),
    _n2_stream(),
    _cached_usage_stream(),
    _completions_stream(),
    _mid_stream_error(),
]


# -- non-streamed bodies ---------------------------------------------------------------------------


def v_body(message: dict[str, object], finish: str, usage: dict[str, object] | None = None) -> bytes:
    return _j(
        {
            "id": "chatcmpl-5d1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "served-llama",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "tool_calls": [],
                        "reasoning": None,
                        **message,
                    },
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "token_ids": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage or {**V_USAGE, "prompt_tokens_details": None},
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "kv_transfer_params": None,
        }
    )


def s_body(message: dict[str, object], finish: str, usage: dict[str, object] | None = None) -> bytes:
    return _j(
        {
            "id": "0f3a9c2b7d",
            "object": "chat.completion",
            "created": 1700000001,
            "model": "default",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "",
                        "reasoning_content": None,
                        "tool_calls": None,
                        **message,
                    },
                    "logprobs": None,
                    "finish_reason": finish,
                    "matched_stop": 151645,
                }
            ],
            "usage": usage or S_USAGE,
            "metadata": {"weight_version": "default"},
        }
    )


@dataclass(frozen=True)
class BodyScenario:
    name: str
    endpoint: Endpoint
    vllm: bytes
    sglang: bytes
    tool_choice_named: bool = False


_V_TOOL = [
    {
        "id": "chatcmpl-tool-77",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
]
_S_TOOL = [
    {
        "id": "call_aaaaaaaaaaaaaaaaaaaaaaaa",
        "index": 0,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
]

BODIES = [
    BodyScenario(
        "text", "chat", v_body({"content": "Hello world"}, "stop"), s_body({"content": "Hello world"}, "stop")
    ),
    BodyScenario(
        "tool_auto",
        "chat",
        v_body({"tool_calls": _V_TOOL}, "tool_calls"),
        s_body({"tool_calls": _S_TOOL}, "tool_calls"),
    ),
    BodyScenario(
        "tool_named",
        "chat",
        v_body({"tool_calls": _V_TOOL}, "stop"),
        s_body({"tool_calls": _S_TOOL}, "tool_calls"),
        tool_choice_named=True,
    ),
    BodyScenario(
        "reasoning",
        "chat",
        v_body(
            {"content": "42", "reasoning": "Think hard"},
            "stop",
            {
                **V_USAGE,
                "prompt_tokens_details": {"cached_tokens": 4},
                "completion_tokens_details": {"reasoning_tokens": 2},
            },
        ),
        s_body(
            {"content": "42", "reasoning_content": "Think hard"},
            "stop",
            {**S_USAGE, "prompt_tokens_details": {"cached_tokens": 4}, "reasoning_tokens": 2},
        ),
    ),
    BodyScenario(
        "length",
        "chat",
        v_body({"content": "Once upon"}, "length"),
        s_body({"content": "Once upon"}, "length"),
    ),
    BodyScenario(
        "completions",
        "completions",
        _j(
            {
                "id": "cmpl-7",
                "object": "text_completion",
                "created": 1,
                "model": "served",
                "choices": [
                    {
                        "index": 0,
                        "text": "Once upon",
                        "logprobs": None,
                        "finish_reason": "length",
                        "stop_reason": None,
                        "prompt_logprobs": None,
                        "token_ids": None,
                        "prompt_token_ids": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": {**V_USAGE, "prompt_tokens_details": None},
                "kv_transfer_params": None,
            }
        ),
        _j(
            {
                "id": "ab12",
                "object": "text_completion",
                "created": 1,
                "model": "default",
                "choices": [
                    {
                        "index": 0,
                        "text": "Once upon",
                        "logprobs": None,
                        "finish_reason": "length",
                        "matched_stop": None,
                    }
                ],
                "usage": S_USAGE,
                "metadata": {"weight_version": "default"},
            }
        ),
    ),
]


# -- errors ---------------------------------------------------------------------------------------

V_CONTEXT = _j(
    {
        "error": {
            "message": "You passed 5000 input tokens and requested 100 output tokens. However, the model's context "
            "length is only 4096 tokens, resulting in a maximum input length of 3996 tokens. Please reduce the "
            "length of the input prompt. (parameter=input_tokens, value=5000)",
            "type": "BadRequestError",
            "param": "input_tokens",
            "code": 400,
        }
    }
)
# vLLM 0.32 (measured): a prompt past the context; a max_tokens that does not fit is cut instead
V_CONTEXT_032 = _j(
    {
        "error": {
            "message": "This model's maximum context length is 4096 tokens. However, your prompt contains at least "
            "4097 input tokens, which exceeds this limit even without any output tokens. Please reduce the length "
            "of the input prompt. (parameter=input_tokens, value=4097)",
            "type": "BadRequestError",
            "param": "input_tokens",
            "code": 400,
        }
    }
)
S_CONTEXT_1 = _j(
    {
        "object": "error",
        "message": "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
)
S_CONTEXT_2 = _j(
    {
        "object": "error",
        "message": "Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a "
        "total of 5100 tokens: 5000 tokens from the input messages and 100 tokens for the completion. Please reduce "
        "the number of tokens in the input messages or the completion to fit within the limit.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
)
V_UNKNOWN_MODEL = _j(
    {
        "error": {
            "message": "The model `foo` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
)
V_VALIDATION = _j(
    {
        "error": {
            "message": "1 validation error:\n  {'type': 'float_parsing', 'loc': ('body', 'temperature'), 'msg': "
            "'Input should be a valid number', 'input': 'hot'} For further information visit "
            "https://errors.pydantic.dev/2.9/v/float_parsing",
            "type": "Bad Request",
            "param": None,
            "code": 400,
        }
    }
)
V_AUTO_TOOLS = _j(
    {
        "error": {
            "message": '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    }
)
V_500 = _j(
    {
        "error": {
            "message": 'Traceback (most recent call last):\n  File "/usr/lib/python3/vllm/engine.py", line 3, in run\n'
            "RuntimeError: CUDA error at 10.1.2.3:8000",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
    }
)
S_500 = _j(
    {
        "object": "error",
        "message": "Internal error at http://10.1.2.3:30000/generate",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }
)

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="1",model_name="llama"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 1.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.5
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 1000.0
vllm:prefix_cache_queries_created{engine="0",model_name="llama"} 1.7e9
vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 250.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="llama"} 0.0
"""

SGLANG_METRICS = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 4.0
sglang:num_running_reqs{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="1"} 4.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 0.75
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 0.5
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{engine_type="unified",is_streaming="false",model_name="qwen"} 1000.0
sglang:prompt_tokens_total{engine_type="unified",is_streaming="true",model_name="qwen"} 600.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",engine_type="unified",model_name="qwen"} 1000.0
sglang:cached_tokens_total{cache_source="host",engine_type="unified",model_name="qwen"} 200.0
"""


# -- runners ---------------------------------------------------------------------------------------

_CALL_ID = re.compile(rb'"call_[0-9a-f]{24}"')


def run_stream(
    dialect: Dialect,
    chunks: list[bytes],
    endpoint: Endpoint,
    *,
    include_usage: bool = True,
    named: bool = False,
) -> bytes:
    """The client's bytes for an engine stream: decode every event, encode, finish (or error)."""
    decoder = dialect.stream_decoder(endpoint)
    encoder = StreamEncoder(
        endpoint=endpoint,
        id="chatcmpl-test" if endpoint == "chat" else "cmpl-test",
        created=1234,
        model="public-model",
        include_usage=include_usage,
        tool_choice_named=named,
    )
    out = b""
    for c in chunks:
        out += encoder.encode(decoder.feed(c))
    return out + encoder.finish()


def stable(data: bytes) -> bytes:
    """Output with the random tool call ids replaced by a placeholder."""
    return _CALL_ID.sub(b'"call_X"', data)


def sse_events(data: bytes) -> list[object]:
    """The JSON payloads of an SSE byte string (checking the framing), `[DONE]` as the string."""
    assert data.endswith(b"\n\n")
    events: list[object] = []
    for block in data.split(b"\n\n")[:-1]:
        assert block.startswith(b"data: "), block
        payload = block[len(b"data: ") :]
        events.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
    return events
