"""engines.responses: the Responses encoder, byte for byte (ids fixed by patching the id source)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from engines import openai as openai_encoder
from engines import responses
from engines.base import Choice, Completion, Delta, ToolCall, ToolCallDelta, Usage
from engines.errors import ApiError
from engines.responses import ResponsesStream, encode_response

HEAD: dict[str, Any] = {"id": "resp_1", "created_at": 7, "model": "m", "tools": [], "store": True}


@pytest.fixture(autouse=True)
def fixed_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(responses, "getrandbits", lambda bits: 10)
    monkeypatch.setattr(openai_encoder, "getrandbits", lambda bits: 11)


def _events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().strip().split("\n\n"):
        event, data = block.split("\n")
        assert event.startswith("event: ") and data.startswith("data: ")
        body = orjson.loads(data[6:])
        assert body["type"] == event[7:]
        out.append((event[7:], body))
    return out


def test_a_text_stream_byte_for_byte() -> None:
    s = ResponsesStream(HEAD)
    assert s.encode([]) == b""  # nothing with content yet: nothing sent (a stalled engine is failed over)
    first = s.encode([Delta(content="Hel")])
    more = s.encode([Delta(content="lo"), Delta(finish_reason="stop"), Usage(5, 2, 1, None)])
    end = s.finish()
    msg = "msg_" + "0" * 47 + "a"
    created = (
        b'{"id":"resp_1","object":"response","created_at":7,"status":"in_progress","background":false,'
        b'"error":null,"incomplete_details":null,"model":"m","tools":[],"store":true,"output":[],"usage":null}'
    )
    assert first == (
        b'event: response.created\ndata: {"type":"response.created","sequence_number":0,"response":'
        + created
        + b"}\n\n"
        b'event: response.in_progress\ndata: {"type":"response.in_progress","sequence_number":1,"response":'
        + created
        + b"}\n\n"
        b'event: response.output_item.added\ndata: {"type":"response.output_item.added","sequence_number":2,'
        b'"output_index":0,"item":{"id":"' + msg.encode() + b'","type":"message","status":"in_progress",'
        b'"content":[],"role":"assistant"}}\n\n'
        b'event: response.content_part.added\ndata: {"type":"response.content_part.added","sequence_number":3,'
        b'"item_id":"' + msg.encode() + b'","output_index":0,"content_index":0,"part":{"type":"output_text",'
        b'"annotations":[],"logprobs":[],"text":""}}\n\n'
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":4,'
        b'"item_id":"'
        + msg.encode()
        + b'","output_index":0,"content_index":0,"delta":"Hel","logprobs":[]}\n\n'
    )
    assert more == (
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":5,'
        b'"item_id":"'
        + msg.encode()
        + b'","output_index":0,"content_index":0,"delta":"lo","logprobs":[]}\n\n'
    )
    kinds = [k for k, _ in _events(end)]
    assert kinds == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = _events(end)[-1][1]
    assert done["sequence_number"] == 9
    assert done["response"]["status"] == "completed"
    assert done["response"]["output"] == [
        {
            "id": msg,
            "type": "message",
            "status": "completed",
            "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": "Hello"}],
            "role": "assistant",
        }
    ]
    assert done["response"]["usage"] == {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": 1, "cache_write_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 7,
    }
    assert s.response == done["response"]
    assert s.finish() == b"" and s.encode([Delta(content="late")]) == b""


def test_reasoning_then_text_then_a_tool_call_are_three_items_in_order() -> None:
    s = ResponsesStream(HEAD)
    raw = s.encode([Delta(reasoning="think"), Delta(content="ok")])
    raw += s.encode([Delta(tool_calls=[ToolCallDelta(0, "x", "f", "")])])
    raw += s.encode([Delta(tool_calls=[ToolCallDelta(0, None, None, '{"a"')])])
    raw += s.encode([Delta(tool_calls=[ToolCallDelta(0, None, None, ":1}")], finish_reason="tool_calls")])
    raw += s.finish()
    events = _events(raw)
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
    kinds = [k for k, _ in events]
    assert kinds.count("response.output_item.added") == 3
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
    args = [e["delta"] for k, e in events if k == "response.function_call_arguments.delta"]
    assert args == ['{"a"', ":1}"]
    final = events[-1][1]["response"]
    assert [o["type"] for o in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][0]["content"] == [{"type": "reasoning_text", "text": "think"}]
    call = final["output"][2]
    assert (
        call["arguments"] == '{"a":1}' and call["name"] == "f" and call["call_id"] == "call_" + "0" * 23 + "b"
    )
    assert call["status"] == "completed"


def test_length_is_incomplete() -> None:
    s = ResponsesStream(HEAD)
    raw = s.encode([Delta(content="abc", finish_reason="length")]) + s.finish()
    kind, last = _events(raw)[-1]
    assert kind == "response.incomplete"
    assert last["response"]["status"] == "incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["status"] == "incomplete"


def test_an_error_mid_stream_is_an_error_event_then_failed() -> None:
    s = ResponsesStream(HEAD)
    s.encode([Delta(content="a")])
    raw = s.encode([ApiError(502, "broken", type="server_error")])
    (k1, e1), (k2, e2) = _events(raw)
    assert (k1, k2) == ("error", "response.failed")
    assert e1 == {
        "type": "error",
        "sequence_number": 5,
        "code": "server_error",
        "message": "broken",
        "param": None,
    }
    assert e2["response"]["status"] == "failed"
    assert e2["response"]["error"] == {"code": "server_error", "message": "broken"}
    assert s.finish() == b""


def test_an_empty_answer_is_still_a_message() -> None:
    s = ResponsesStream(HEAD)
    raw = s.encode([Delta(finish_reason="stop")]) + s.finish()
    events = _events(raw)
    assert events[0][0] == "response.created"
    assert events[-1][1]["response"]["output"][0]["content"][0]["text"] == ""


def test_non_streamed() -> None:
    c = Completion([Choice(0, "hi", "tool_calls", "why", [ToolCall("x", "f", "{}")])], Usage(3, 4, None, 2))
    r = encode_response(c, HEAD)
    assert r["status"] == "completed" and r["object"] == "response" and r["id"] == "resp_1"
    assert [o["type"] for o in r["output"]] == ["reasoning", "message", "function_call"]
    assert r["usage"]["output_tokens_details"] == {"reasoning_tokens": 2}
    assert list(r)[:7] == [
        "id",
        "object",
        "created_at",
        "status",
        "background",
        "error",
        "incomplete_details",
    ]
