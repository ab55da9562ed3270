"""Anthropic's Messages API on the answer side: neutral `Completion` / stream events → Anthropic's
message object, its event stream and its error shape. Pure: no I/O.

Shapes follow Anthropic's API and the `anthropic` SDK's types:
- message: `{"id": "msg_…", "type": "message", "role": "assistant", "model", "content": [blocks],
  "stop_reason", "stop_sequence", "usage"}`; blocks in the order the engine produced them:
  `thinking` (reasoning text, `signature: ""` — open models sign nothing), `text`, `tool_use`
  (`id` `toolu_` + 24 hex, `input` the parsed arguments; arguments that are not a JSON object
  become `{}`);
- `stop_reason`: `end_turn`, `stop_sequence` (with the matched `stop_sequence` when the engine says
  which), `max_tokens`, `tool_use`, `refusal` (content filter);
- usage: `input_tokens` (prompt tokens not read from the prefix cache), `cache_read_input_tokens`
  (read from it), `cache_creation_input_tokens: 0`, `output_tokens`.

`MessagesStream` writes `event: <type>\\ndata: <json>\\n\\n`: `message_start` (usage: the gateway's
prompt estimate, output 0 — the engine's figures come with `message_delta`, which overrides them),
`ping`, then per block `content_block_start` / `content_block_delta` (`text_delta`,
`thinking_delta` + a closing `signature_delta`, `input_json_delta`) / `content_block_stop`, then
`message_delta` (`stop_reason`, `stop_sequence`, the full usage) and `message_stop`. Both header
events go out with the first event that has content. An error after the start is one
`event: error` (Anthropic's error object) and the stream ends.

Errors (`error_body`): `{"type": "error", "error": {"type", "message"}}` with Anthropic's type for
the status; 503 (no backend, overloaded) becomes Anthropic's 529 `overloaded_error`.
"""

from __future__ import annotations

from random import getrandbits
from typing import Any

import orjson

from engines.base import Completion, Delta, StreamEvent, ToolCallDelta, Usage
from engines.errors import ApiError

_dumps = orjson.dumps
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
#: statuses Anthropic spells differently: its "overloaded" is 529
_STATUS = {503: 529}


def new_message_id() -> str:
    return f"msg_{getrandbits(96):024x}"


def new_tool_use_id() -> str:
    return f"toolu_{getrandbits(96):024x}"


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    found = _ERROR_TYPES.get(status)
    if found is not None:
        return found
    return "api_error" if status >= 500 else "invalid_request_error"


def error_status(err: ApiError) -> int:
    return _STATUS.get(err.status, err.status)


def error_payload(err: ApiError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(error_status(err)), "message": err.message}}


def render_error(err: ApiError) -> tuple[int, bytes]:
    """(status, body) of `err` in Anthropic's shape (a `gateway.core.responses.ErrorRenderer`)."""
    return error_status(err), _dumps(error_payload(err))


def stop_reason(finish: str | None, had_tool_use: bool, stop_sequence: str | None) -> str:
    if finish == "stop" and stop_sequence is not None:
        return "stop_sequence"
    if had_tool_use and finish in ("stop", "tool_calls"):
        return "tool_use"
    return _STOP.get(finish or "stop", "end_turn")


def encode_usage(u: Usage) -> dict[str, Any]:
    cached = u.cached_tokens or 0
    return {
        "input_tokens": max(0, u.prompt_tokens - cached),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": u.completion_tokens,
    }


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as Anthropic's `input` object (`{}` when they are not one)."""
    if not arguments:
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}
    return value if type(value) is dict else {}


def encode_message(c: Completion, *, id: str, model: str) -> bytes:
    """Anthropic's non-streamed message for `c` (choice 0)."""
    ch = min(c.choices, key=lambda x: x.index) if c.choices else None
    content: list[dict[str, Any]] = []
    finish = None
    stop_sequence = None
    if ch is not None:
        finish = ch.finish_reason
        stop_sequence = ch.stop_sequence if finish == "stop" else None
        if ch.reasoning:
            content.append({"type": "thinking", "thinking": ch.reasoning, "signature": ""})
        if ch.content:
            content.append({"type": "text", "text": ch.content})
        for t in ch.tool_calls or ():
            content.append(
                {
                    "type": "tool_use",
                    "id": new_tool_use_id(),
                    "name": t.name,
                    "input": tool_input(t.arguments),
                }
            )
    if not content:
        content.append({"type": "text", "text": ""})
    had_tools = bool(ch is not None and ch.tool_calls)
    reason = stop_reason(finish, had_tools, stop_sequence)
    return _dumps(
        {
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
            "usage": encode_usage(c.usage),
        }
    )


class MessagesStream:
    """Writes one Messages event stream from neutral events (module docstring). One per response;
    implements `engines.base.StreamWriter`."""

    __slots__ = (
        "_block",
        "_done",
        "_estimate",
        "_finish",
        "_id",
        "_index",
        "_kind",
        "_model",
        "_prefix",
        "_started",
        "_stop_sequence",
        "_tool_use",
        "_tools",
        "usage",
    )

    def __init__(self, *, id: str, model: str, input_tokens_estimate: int) -> None:
        self._id = id
        self._model = model
        self._estimate = input_tokens_estimate
        self._started = False
        self._done = False
        self._index = -1  # the open block's index
        self._kind = ""  # "", "text", "thinking", "tool_use"
        self._block = -1  # the tool index of the open tool_use block
        self._tools: set[int] = set()
        self._tool_use = False
        self._finish: str | None = None
        self._stop_sequence: str | None = None
        self._prefix = b""
        self.usage: Usage | None = None

    @staticmethod
    def _event(kind: str, body: dict[str, Any]) -> bytes:
        return b"event: " + kind.encode() + b"\ndata: " + _dumps({"type": kind, **body}) + b"\n\n"

    def _start(self) -> bytes:
        self._started = True
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": self._estimate,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 0,
            },
        }
        return self._event("message_start", {"message": message}) + b'event: ping\ndata: {"type":"ping"}\n\n'

    def _open(self, kind: str, out: list[bytes], tool: ToolCallDelta | None = None) -> None:
        self._close(out)
        self._index += 1
        self._kind = kind
        if kind == "text":
            block: dict[str, Any] = {"type": "text", "text": ""}
            delta = b'"type":"text_delta","text":'
        elif kind == "thinking":
            block = {"type": "thinking", "thinking": "", "signature": ""}
            delta = b'"type":"thinking_delta","thinking":'
        else:
            assert tool is not None
            self._block = tool.index
            self._tools.add(tool.index)
            self._tool_use = True
            block = {"type": "tool_use", "id": new_tool_use_id(), "name": tool.name or "", "input": {}}
            delta = b'"type":"input_json_delta","partial_json":'
        out.append(self._event("content_block_start", {"index": self._index, "content_block": block}))
        self._prefix = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
            + str(self._index).encode()
            + b',"delta":{'
            + delta
        )

    def _close(self, out: list[bytes]) -> None:
        if not self._kind:
            return
        if self._kind == "thinking":
            out.append(
                self._event(
                    "content_block_delta",
                    {"index": self._index, "delta": {"type": "signature_delta", "signature": ""}},
                )
            )
        out.append(self._event("content_block_stop", {"index": self._index}))
        self._kind = ""
        self._block = -1

    def encode(self, events: list[StreamEvent]) -> bytes:
        if self._done:
            return b""
        out: list[bytes] = []
        for ev in events:
            if type(ev) is Delta:
                if ev.index == 0:
                    self._on_delta(ev, out)
            elif type(ev) is Usage:
                self.usage = ev
            elif isinstance(ev, ApiError):
                body = b"".join(out)
                if body and not self._started:
                    body = self._start() + body
                return body + self.error(ev)
        if out and not self._started:
            return self._start() + b"".join(out)
        return b"".join(out)

    def _on_delta(self, d: Delta, out: list[bytes]) -> None:
        if d.reasoning:
            if self._kind != "thinking":
                self._open("thinking", out)
            out.append(self._prefix + _dumps(d.reasoning) + b"}}\n\n")
        if d.content:
            if self._kind != "text":
                self._open("text", out)
            out.append(self._prefix + _dumps(d.content) + b"}}\n\n")
        for t in d.tool_calls or ():
            if t.index not in self._tools:
                self._open("tool_use", out, t)
            if t.arguments and self._kind == "tool_use" and self._block == t.index:
                out.append(self._prefix + _dumps(t.arguments) + b"}}\n\n")
        if d.finish_reason is not None:
            self._finish = d.finish_reason
            self._stop_sequence = d.stop_sequence

    @property
    def finish_reasons(self) -> tuple[str, ...]:
        return (self._finish,) if self._finish is not None else ()

    def finish(self) -> bytes:
        if self._done:
            return b""
        self._done = True
        out: list[bytes] = []
        if not self._started:
            out.append(self._start())
        if self._index < 0:
            self._open("text", out)
        self._close(out)
        reason = stop_reason(self._finish, self._tool_use, self._stop_sequence)
        usage = self.usage or Usage(prompt_tokens=self._estimate)
        out.append(
            self._event(
                "message_delta",
                {
                    "delta": {
                        "stop_reason": reason,
                        "stop_sequence": self._stop_sequence if reason == "stop_sequence" else None,
                    },
                    "usage": encode_usage(usage),
                },
            )
        )
        out.append(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
        return b"".join(out)

    def error(self, err: ApiError) -> bytes:
        if self._done:
            return b""
        self._done = True
        head = b"" if self._started else self._start()
        return head + b"event: error\ndata: " + _dumps(error_payload(err)) + b"\n\n"
