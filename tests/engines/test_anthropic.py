"""engines.anthropic: the Messages encoder and error shape, byte for byte."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from engines import anthropic
from engines.anthropic import MessagesStream, encode_message, render_error
from engines.base import Choice, Completion, Delta, ToolCall, ToolCallDelta, Usage
from engines.errors import ApiError


@pytest.fixture(autouse=True)
def fixed_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(anthropic, "getrandbits", lambda bits: 12)


def _events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().strip().split("\n\n"):
        event, data = block.split("\n")
        out.append((event[7:], orjson.loads(data[6:])))
    return out


def test_a_text_stream_byte_for_byte() -> None:
    s = MessagesStream(id="msg_1", model="m", input_tokens_estimate=9)
    assert s.encode([]) == b""
    raw = s.encode([Delta(content="Hi")])
    assert raw == (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message",'
        b'"role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":'
        b'{"input_tokens":9,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}}\n\n'
        b'event: ping\ndata: {"type":"ping"}\n\n'
        b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":'
        b'{"type":"text","text":""}}\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
        b'"text":"Hi"}}\n\n'
    )
    s.encode([Delta(finish_reason="stop", stop_sequence="END"), Usage(10, 3, 4, None)])
    assert s.finish() == (
        b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"stop_sequence",'
        b'"stop_sequence":"END"},"usage":{"input_tokens":6,"cache_creation_input_tokens":0,'
        b'"cache_read_input_tokens":4,"output_tokens":3}}\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )


def test_thinking_then_tool_use_blocks() -> None:
    s = MessagesStream(id="msg_1", model="m", input_tokens_estimate=1)
    raw = s.encode([Delta(reasoning="hmm")])
    raw += s.encode([Delta(tool_calls=[ToolCallDelta(0, "c", "f", "")])])
    raw += s.encode(
        [
            Delta(tool_calls=[ToolCallDelta(0, None, None, '{"x":')]),
            Delta(tool_calls=[ToolCallDelta(0, None, None, "1}")]),
        ]
    )
    raw += s.encode([Delta(finish_reason="tool_calls")]) + s.finish()
    events = _events(raw)
    kinds = [k for k, _ in events]
    assert kinds == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[2][1]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert events[4][1]["delta"] == {"type": "signature_delta", "signature": ""}
    assert events[6][1]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_" + "0" * 23 + "c",
        "name": "f",
        "input": {},
    }
    assert [e["delta"]["partial_json"] for k, e in events[7:9]] == ['{"x":', "1}"]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_an_error_mid_stream() -> None:
    s = MessagesStream(id="msg_1", model="m", input_tokens_estimate=1)
    s.encode([Delta(content="a")])
    assert s.encode([ApiError(502, "gone", type="server_error")]) == (
        b'event: error\ndata: {"type":"error","error":{"type":"api_error","message":"gone"}}\n\n'
    )
    assert s.finish() == b""


def test_non_streamed() -> None:
    c = Completion([Choice(0, "hi", "stop", None, [ToolCall("x", "f", '{"a": 1}')])], Usage(5, 2))
    body = orjson.loads(encode_message(c, id="msg_1", model="m"))
    assert body == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [
            {"type": "text", "text": "hi"},
            {"type": "tool_use", "id": "toolu_" + "0" * 23 + "c", "name": "f", "input": {"a": 1}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 5,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 2,
        },
    }
    bad = Completion([Choice(0, None, "tool_calls", None, [ToolCall("x", "f", "not json")])])
    assert orjson.loads(encode_message(bad, id="m", model="m"))["content"][0]["input"] == {}
    length = Completion([Choice(0, "abc", "length")])
    assert orjson.loads(encode_message(length, id="m", model="m"))["stop_reason"] == "max_tokens"


@pytest.mark.parametrize(
    ("status", "out_status", "kind"),
    [
        (400, 400, "invalid_request_error"),
        (401, 401, "authentication_error"),
        (403, 403, "permission_error"),
        (404, 404, "not_found_error"),
        (413, 413, "request_too_large"),
        (429, 429, "rate_limit_error"),
        (500, 500, "api_error"),
        (502, 502, "api_error"),
        (503, 529, "overloaded_error"),
        (504, 504, "timeout_error"),
    ],
)
def test_error_shapes(status: int, out_status: int, kind: str) -> None:
    got_status, body = render_error(ApiError(status, "why"))
    assert got_status == out_status
    assert orjson.loads(body) == {"type": "error", "error": {"type": kind, "message": "why"}}
