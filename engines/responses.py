"""OpenAI's Responses API on the answer side: neutral `Completion` / stream events → Response objects
and the Responses event stream. Pure: no I/O (the gateway stores what `response` holds).

Both engines' chat answers come out here alike (the request was translated into a chat request by
`gateway.apis`), so a client cannot tell which engine answered. Shapes follow OpenAI's API and the
`openai` SDK's types (`openai.types.responses`):

- output items, in the order the engine produced them: `reasoning` (only when the engine returned
  reasoning text: `content: [{"type": "reasoning_text"}]`, `summary: []`), `message` (one
  `output_text` part, `annotations: []`, `logprobs: []`), `function_call` (`call_id` `call_` + 24
  hex, `arguments` as the engine wrote them); ids `rs_`/`msg_`/`fc_` + 48 hex;
- `finish_reason` `length` → `status: "incomplete"`, `incomplete_details.reason:
  "max_output_tokens"` (`content_filter` → `"content_filter"`); otherwise `completed`;
- usage: `input_tokens`, `input_tokens_details.cached_tokens`, `output_tokens`,
  `output_tokens_details.reasoning_tokens`, `total_tokens`.

`ResponsesStream` writes `event: <type>\\ndata: <json>\\n\\n` events, each with a `sequence_number`
from 0: `response.created`, `response.in_progress` (both with the response `in_progress`, output
`[]`; they go out with the first event that has content, so a backend that accepts and stalls is
still failed over), then per item `response.output_item.added`, `response.content_part.added`,
the deltas (`response.output_text.delta`, `response.reasoning_text.delta`,
`response.function_call_arguments.delta`), their `.done`, `response.content_part.done`,
`response.output_item.done`; last `response.completed` (or `response.incomplete`). An error after
the start: an `error` event, then `response.failed`. No `[DONE]` (OpenAI sends none).
A text delta costs one `orjson.dumps` of the text and a few concatenations.
"""

from __future__ import annotations

from random import getrandbits
from typing import Any

import orjson

from engines.base import Completion, Delta, StreamEvent, ToolCallDelta, Usage
from engines.errors import ApiError
from engines.openai import new_tool_call_id

_dumps = orjson.dumps
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def new_id(prefix: str) -> str:
    """`prefix` + `_` + 48 hex characters (OpenAI's response and item ids have this form)."""
    return f"{prefix}_{getrandbits(192):048x}"


def encode_usage(u: Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens or 0, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens or 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    }


def response_object(
    head: dict[str, Any],
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None,
    incomplete: str | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The Response object: `head` holds `id`, `created_at`, `model` and the request's echoed fields
    (instructions, tools, tool_choice, text, reasoning, store, metadata, …: `gateway.apis` writes it)."""
    out: dict[str, Any] = {
        "id": head["id"],
        "object": "response",
        "created_at": head["created_at"],
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
    }
    for key, value in head.items():
        if key not in out:
            out[key] = value
    out["output"] = output
    out["usage"] = encode_usage(usage) if usage is not None else None
    return out


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _message(id: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": id, "type": "message", "status": status, "content": content, "role": "assistant"}


def _reasoning(id: str, status: str, text: str | None) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if text is not None else []
    return {"id": id, "type": "reasoning", "summary": [], "content": content, "status": status}


def _function_call(id: str, status: str, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": id,
        "type": "function_call",
        "status": status,
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
    }


def _status(finish: str | None) -> tuple[str, str | None]:
    incomplete = _INCOMPLETE.get(finish or "")
    return ("incomplete", incomplete) if incomplete else ("completed", None)


def encode_response(c: Completion, head: dict[str, Any]) -> dict[str, Any]:
    """The Response object of a non-streamed answer (choice 0: the Responses API has no `n`)."""
    ch = min(c.choices, key=lambda x: x.index) if c.choices else None
    status, incomplete = _status(ch.finish_reason if ch else None)
    item_status = "incomplete" if incomplete else "completed"
    output: list[dict[str, Any]] = []
    if ch is not None:
        if ch.reasoning:
            output.append(_reasoning(new_id("rs"), item_status, ch.reasoning))
        if ch.content or not ch.tool_calls:
            output.append(_message(new_id("msg"), item_status, [_text_part(ch.content or "")]))
        for t in ch.tool_calls or ():
            output.append(_function_call(new_id("fc"), "completed", new_tool_call_id(), t.name, t.arguments))
    return response_object(head, status=status, output=output, usage=c.usage, incomplete=incomplete)


class _Item:
    """One output item of a stream while it is written."""

    __slots__ = ("call_id", "done", "id", "index", "kind", "name", "parts", "prefix", "status", "tool_index")

    def __init__(self, kind: str, index: int, id: str) -> None:
        self.kind = kind  # "message" | "reasoning" | "function_call"
        self.index = index
        self.id = id
        self.parts: list[str] = []
        self.done = False
        self.status = "in_progress"
        self.prefix = b""  # the constant bytes of this item's delta events after sequence_number
        self.call_id = ""
        self.name = ""
        self.tool_index = -1

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def snapshot(self, status: str) -> dict[str, Any]:
        if self.kind == "message":
            return _message(self.id, status, [_text_part(self.text)] if status != "in_progress" else [])
        if self.kind == "reasoning":
            return _reasoning(self.id, status, self.text if status != "in_progress" else None)
        return _function_call(self.id, status, self.call_id, self.name, self.text)


_DELTA_TYPE = {
    "message": b"response.output_text.delta",
    "reasoning": b"response.reasoning_text.delta",
    "function_call": b"response.function_call_arguments.delta",
}


class ResponsesStream:
    """Writes one Responses event stream from neutral events (see the module docstring).
    One per response; implements `engines.base.StreamWriter`."""

    __slots__ = (
        "_current",
        "_done",
        "_finish",
        "_head",
        "_items",
        "_seq",
        "_started",
        "_tools",
        "response",
        "usage",
    )

    def __init__(self, head: dict[str, Any]) -> None:
        self._head = head
        self._seq = 0
        self._started = False
        self._done = False
        self._items: list[_Item] = []
        self._current: _Item | None = None
        self._tools: dict[int, _Item] = {}
        self._finish: str | None = None
        self.usage: Usage | None = None
        #: the final Response object once `finish()` (or `error()`) has run
        self.response: dict[str, Any] | None = None

    # -- event writers ------------------------------------------------------------------------
    def _event(self, kind: str, body: dict[str, Any]) -> bytes:
        seq = self._seq
        self._seq = seq + 1
        payload = {"type": kind, "sequence_number": seq, **body}
        return b"event: " + kind.encode() + b"\ndata: " + _dumps(payload) + b"\n\n"

    def _lifecycle(self, kind: str, status: str, output: list[dict[str, Any]], **extra: Any) -> bytes:
        usage = self.usage if kind != "response.created" and kind != "response.in_progress" else None
        obj = response_object(self._head, status=status, output=output, usage=usage, **extra)
        if kind != "response.created" and kind != "response.in_progress":
            self.response = obj
        return self._event(kind, {"response": obj})

    def _start(self, out: list[bytes]) -> None:
        self._started = True
        out.append(self._lifecycle("response.created", "in_progress", []))
        out.append(self._lifecycle("response.in_progress", "in_progress", []))

    def _open(self, kind: str, out: list[bytes], tool: ToolCallDelta | None = None) -> _Item:
        if not self._started:  # every output starts with an item: the header goes first
            self._start(out)
        self._close_current(out)
        prefix = {"message": "msg", "reasoning": "rs", "function_call": "fc"}[kind]
        item = _Item(kind, len(self._items), new_id(prefix))
        self._items.append(item)
        self._current = item
        if tool is not None:
            item.call_id = new_tool_call_id()
            item.name = tool.name or ""
            item.tool_index = tool.index
            self._tools[tool.index] = item
        out.append(
            self._event(
                "response.output_item.added",
                {"output_index": item.index, "item": item.snapshot("in_progress")},
            )
        )
        tail = b',"item_id":"' + item.id.encode() + b'","output_index":' + str(item.index).encode()
        if kind == "message":
            part = _text_part("")
        elif kind == "reasoning":
            part = {"type": "reasoning_text", "text": ""}
        else:
            item.prefix = tail + b',"delta":'
            return item
        out.append(
            self._event(
                "response.content_part.added",
                {"item_id": item.id, "output_index": item.index, "content_index": 0, "part": part},
            )
        )
        item.prefix = tail + b',"content_index":0,"delta":'
        return item

    def _delta(self, item: _Item, text: str) -> bytes:
        item.parts.append(text)
        kind = _DELTA_TYPE[item.kind]
        seq = self._seq
        self._seq = seq + 1
        tail = b',"logprobs":[]}\n\n' if item.kind == "message" else b"}\n\n"
        return (
            b"event: " + kind + b'\ndata: {"type":"' + kind + b'","sequence_number":' + str(seq).encode()
            + item.prefix + _dumps(text) + tail
        )  # fmt: skip

    def _close(self, item: _Item, out: list[bytes], status: str) -> None:
        if item.done:
            return
        item.done = True
        where = {"item_id": item.id, "output_index": item.index}
        if item.kind == "function_call":
            status = "completed"
        item.status = status
        text = item.text
        if item.kind == "function_call":
            out.append(self._event("response.function_call_arguments.done", {**where, "arguments": text}))
        else:
            if item.kind == "message":
                out.append(
                    self._event(
                        "response.output_text.done",
                        {**where, "content_index": 0, "text": text, "logprobs": []},
                    )
                )
                part: dict[str, Any] = _text_part(text)
            else:
                out.append(
                    self._event("response.reasoning_text.done", {**where, "content_index": 0, "text": text})
                )
                part = {"type": "reasoning_text", "text": text}
            out.append(self._event("response.content_part.done", {**where, "content_index": 0, "part": part}))
        out.append(
            self._event(
                "response.output_item.done", {"output_index": item.index, "item": item.snapshot(status)}
            )
        )

    def _close_current(self, out: list[bytes]) -> None:
        if self._current is not None:
            self._close(self._current, out, "completed")
            self._current = None

    # -- StreamWriter -------------------------------------------------------------------------
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
                return b"".join(out) + self.error(ev)
        return b"".join(out)

    def _on_delta(self, d: Delta, out: list[bytes]) -> None:
        cur = self._current
        if d.reasoning:
            if cur is None or cur.kind != "reasoning":
                cur = self._open("reasoning", out)
            out.append(self._delta(cur, d.reasoning))
        if d.content:
            if cur is None or cur.kind != "message":
                cur = self._open("message", out)
            out.append(self._delta(cur, d.content))
        for t in d.tool_calls or ():
            item = self._tools.get(t.index)
            if item is None:
                item = cur = self._open("function_call", out, t)
            if t.arguments and not item.done:
                out.append(self._delta(item, t.arguments))
        if d.finish_reason is not None:
            self._finish = d.finish_reason

    @property
    def finish_reasons(self) -> tuple[str, ...]:
        return (self._finish,) if self._finish is not None else ()

    def finish(self) -> bytes:
        if self._done:
            return b""
        self._done = True
        out: list[bytes] = []
        if not self._items:
            self._open("message", out)
        status, incomplete = _status(self._finish)
        item_status = "incomplete" if incomplete else "completed"
        for item in self._items:
            self._close(item, out, item_status)
        self._current = None
        output = [item.snapshot(item.status) for item in self._items]
        kind = "response.incomplete" if incomplete else "response.completed"
        out.append(self._lifecycle(kind, status, output, incomplete=incomplete))
        return b"".join(out)

    def error(self, err: ApiError) -> bytes:
        if self._done:
            return b""
        self._done = True
        out: list[bytes] = []
        if not self._started:
            self._start(out)
        out.append(
            self._event("error", {"code": err.code or err.type, "message": err.message, "param": err.param})
        )
        output = [item.snapshot(item.status if item.done else "incomplete") for item in self._items]
        code = "server_error" if err.status >= 500 else "invalid_prompt"
        out.append(
            self._lifecycle("response.failed", "failed", output, error={"code": code, "message": err.message})
        )
        return b"".join(out)
