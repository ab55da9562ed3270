"""The one encoder: neutral `Completion` / stream events → OpenAI's exact wire bytes.

Every byte a client sees from a completion passes through here, whichever engine answered, so the
two pools are indistinguishable. Shapes follow OpenAI's API (shared/OPENAI.md); the choices made
where OpenAI says nothing are documented in docs/engines.md:

- reasoning text goes under ONE field name, `reasoning_content` (message and delta), only when the
  engine produced some; OpenAI itself has no such field;
- `finish_reason` is normalised: a turn that produced tool calls ends `tool_calls`, except when the
  client forced a named function (`tool_choice_named`), which ends `stop` as OpenAI documents;
- tool call ids are always fresh `call_` + 24 alphanumerics (engine ids are never shown);
- `service_tier` and `system_fingerprint` are `null`.

`StreamEncoder` is on the path of every token: the constant bytes of each chunk are computed once
per stream, and a plain text delta costs one `orjson.dumps` of the text plus a concatenation.
"""

from __future__ import annotations

from random import getrandbits
from typing import Any

import orjson

from engines.base import Choice, Completion, Delta, Endpoint, StreamEvent, ToolCallDelta, Usage
from engines.errors import ApiError

__all__ = [
    "StreamEncoder",
    "encode_completion",
    "encode_usage",
    "new_completion_id",
    "new_tool_call_id",
]

_dumps = orjson.dumps
_DONE = b"data: [DONE]\n\n"


def new_completion_id(endpoint: Endpoint) -> str:
    """`chatcmpl-` + 29 hex characters for chat, `cmpl-` + 29 for completions. Ids must be unique, not
    secret: the process's Mersenne Twister (seeded from os.urandom, reseeded in a forked child) costs
    no system call per id."""
    return ("chatcmpl-%029x" if endpoint == "chat" else "cmpl-%029x") % getrandbits(116)


def new_tool_call_id() -> str:
    """`call_` + 24 hex characters (OpenAI: `call_` + 24 alphanumerics)."""
    return f"call_{getrandbits(96):024x}"


def encode_usage(u: Usage) -> dict[str, Any]:
    """OpenAI's `usage` object; unknown details are reported as 0, as OpenAI does."""
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens or 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": u.reasoning_tokens or 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def final_finish_reason(reason: str | None, had_tool_calls: bool, tool_choice_named: bool) -> str | None:
    """The same `finish_reason` for the same situation on every engine.

    A named `tool_choice` ends `stop` (OpenAI's documented value; vLLM agrees, SGLang says
    `tool_calls`); otherwise a turn that produced tool calls and stopped naturally ends `tool_calls`
    (whatever the engine said). `length` and `content_filter` are kept as they are.
    """
    if reason == "tool_calls" or (reason == "stop" and had_tool_calls):
        return "stop" if tool_choice_named else "tool_calls"
    return reason


def _message(c: Choice) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant"}
    if c.tool_calls:
        msg["content"] = c.content or None
    else:
        msg["content"] = c.content if c.content is not None else ""
    if c.reasoning is not None:
        msg["reasoning_content"] = c.reasoning
    if c.tool_calls:
        msg["tool_calls"] = [
            {
                "id": new_tool_call_id(),
                "type": "function",
                "function": {"name": t.name, "arguments": t.arguments},
            }
            for t in c.tool_calls
        ]
    msg["refusal"] = None
    msg["annotations"] = []
    return msg


def encode_completion(
    c: Completion, *, endpoint: Endpoint, id: str, created: int, model: str, tool_choice_named: bool
) -> bytes:
    """OpenAI's non-streamed response body for `c`."""
    choices = sorted(c.choices, key=lambda ch: ch.index)
    if endpoint == "chat":
        body: dict[str, Any] = {
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": ch.index,
                    "message": _message(ch),
                    "logprobs": ch.logprobs,
                    "finish_reason": final_finish_reason(
                        ch.finish_reason, bool(ch.tool_calls), tool_choice_named
                    ),
                }
                for ch in choices
            ],
            "usage": encode_usage(c.usage),
            "service_tier": None,
            "system_fingerprint": None,
        }
    else:
        body = {
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "text": ch.content or "",
                    "index": ch.index,
                    "logprobs": ch.logprobs,
                    "finish_reason": ch.finish_reason,
                }
                for ch in choices
            ],
            "usage": encode_usage(c.usage),
            "system_fingerprint": None,
        }
    return _dumps(body)


class _ChoiceState:
    """Per-choice progress of one stream."""

    __slots__ = ("finish", "finished", "started", "tool_calls", "tools_seen")

    def __init__(self) -> None:
        self.started = False  # role chunk sent
        self.finish: str | None = None  # pending finish_reason, sent by StreamEncoder.finish()
        self.finished = False
        self.tool_calls = False
        self.tools_seen: set[int] = set()


class StreamEncoder:
    """Writes one OpenAI SSE stream from neutral events. One instance per response, not shared.

    Layout (OpenAI's, from recordings of the live API):
    - same `id`/`created` on every chunk; every choice carries `logprobs` and `finish_reason: null`
      until its end; with `include_usage` every chunk carries `"usage": null`;
    - each choice starts with a role chunk: `{"role": "assistant", "content": "", "refusal": null}`,
      or, when the turn starts with a tool call, `content: null` and that call's first piece in the
      same delta. The role chunk waits for the first non-empty delta (engines send their role chunk
      together with the first token anyway);
    - a tool call's first piece is `{"index", "id", "type", "function": {"name", "arguments": ""}}`,
      later pieces only `{"index", "function": {"arguments"}}` — id and name never repeat;
    - reasoning, content and each tool-call piece go in separate chunks, in that order;
    - `finish_reason` goes in its own chunk with an empty delta, emitted by `finish()` (so that
      nothing an engine flushes late can follow it), then the usage chunk if asked, then `[DONE]`.

    After an `ApiError` event (or `error()`), the stream is over: later calls return `b""`.
    """

    __slots__ = (
        "_chat",
        "_choice_tail",
        "_choices",
        "_content_key",
        "_content_prefix",
        "_continuous",
        "_done",
        "_head",
        "_include_usage",
        "_named",
        "_tail",
        "usage",
    )

    def __init__(
        self,
        *,
        endpoint: Endpoint,
        id: str,
        created: int,
        model: str,
        include_usage: bool,
        tool_choice_named: bool,
        continuous_usage: bool = False,
    ) -> None:
        self._chat = endpoint == "chat"
        self._include_usage = include_usage
        self._continuous = continuous_usage and include_usage
        self._named = tool_choice_named
        #: the last usage the engine reported (the gateway bills from it, asked for or not).
        self.usage: Usage | None = None
        self._done = False
        self._choices: dict[int, _ChoiceState] = {}
        obj = b"chat.completion.chunk" if self._chat else b"text_completion"
        self._head = (
            b'data: {"id":'
            + _dumps(id)
            + b',"object":"'
            + obj
            + b'","created":'
            + _dumps(created)
            + b',"model":'
            + _dumps(model)
            + (b',"service_tier":null' if self._chat else b"")
            + b',"system_fingerprint":null,"choices":['
        )
        self._tail = b'],"usage":null}\n\n' if include_usage else b"]}\n\n"
        self._choice_tail = b',"logprobs":null,"finish_reason":null}'
        self._content_key = b'"content":' if self._chat else b'"text":'
        self._content_prefix: dict[int, bytes] = {}

    # -- chunk writers ------------------------------------------------------------------------

    def _chunk(self, choice: bytes) -> bytes:
        if self._continuous and self.usage is not None:
            return self._head + choice + b'],"usage":' + _dumps(encode_usage(self.usage)) + b"}\n\n"
        return self._head + choice + self._tail

    def _delta_chunk(self, index: int, delta: dict[str, Any], logprobs: Any = None) -> bytes:
        if self._chat:
            choice: dict[str, Any] = {
                "index": index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": None,
            }
        else:
            choice = {
                "text": delta.get("text", ""),
                "index": index,
                "logprobs": logprobs,
                "finish_reason": None,
            }
        return self._chunk(_dumps(choice))

    def _text_chunk(self, index: int, text: str) -> bytes:
        prefix = self._content_prefix.get(index)
        if prefix is None:
            if self._chat:
                prefix = b'{"index":' + str(index).encode() + b',"delta":{"content":'
            else:
                prefix = b'{"text":'
            self._content_prefix[index] = prefix
        if self._chat:
            return self._chunk(prefix + _dumps(text) + b"}" + self._choice_tail)
        return self._chunk(prefix + _dumps(text) + b',"index":' + str(index).encode() + self._choice_tail)

    def _finish_chunk(self, index: int, reason: str) -> bytes:
        if self._chat:
            choice: dict[str, Any] = {"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"text": "", "index": index, "logprobs": None, "finish_reason": reason}
        return self._chunk(_dumps(choice))

    def _role(self, index: int, st: _ChoiceState, out: list[bytes], first_tool: ToolCallDelta | None) -> None:
        st.started = True
        if not self._chat:
            return
        if first_tool is None:
            out.append(self._delta_chunk(index, {"role": "assistant", "content": "", "refusal": None}))
            return
        st.tools_seen.add(first_tool.index)
        st.tool_calls = True
        delta = {
            "role": "assistant",
            "content": None,
            "tool_calls": [self._first_piece(first_tool)],
            "refusal": None,
        }
        out.append(self._delta_chunk(index, delta))
        if first_tool.arguments:
            out.append(self._args_chunk(index, first_tool))

    @staticmethod
    def _first_piece(t: ToolCallDelta) -> dict[str, Any]:
        return {
            "index": t.index,
            "id": new_tool_call_id(),
            "type": "function",
            "function": {"name": t.name or "", "arguments": ""},
        }

    def _args_chunk(self, index: int, t: ToolCallDelta) -> bytes:
        return self._delta_chunk(
            index, {"tool_calls": [{"index": t.index, "function": {"arguments": t.arguments}}]}
        )

    # -- public API ---------------------------------------------------------------------------

    def encode(self, events: list[StreamEvent]) -> bytes:
        """Zero or more complete `data: …\\n\\n` events for `events` (in order)."""
        if self._done:
            return b""
        out: list[bytes] = []
        for ev in events:
            if type(ev) is Delta:
                self._delta(ev, out)
            elif type(ev) is Usage:
                self.usage = ev
            elif isinstance(ev, ApiError):
                out.append(self.error(ev))
                break
        return b"".join(out)

    def _delta(self, d: Delta, out: list[bytes]) -> None:
        idx = d.index
        st = self._choices.get(idx)
        if st is None:
            st = self._choices[idx] = _ChoiceState()
        if st.finished:
            return
        content = d.content
        tools = d.tool_calls
        if not st.started:
            if not (content or d.reasoning or tools or d.finish_reason):
                return
            first_tool = tools[0] if (tools and not content and not d.reasoning) else None
            self._role(idx, st, out, first_tool)
            if first_tool is not None:
                tools = tools[1:] if tools else None
        if d.reasoning and self._chat:
            out.append(self._delta_chunk(idx, {"reasoning_content": d.reasoning}))
        if content:
            if d.logprobs is None:
                out.append(self._text_chunk(idx, content))
            else:
                key = "content" if self._chat else "text"
                out.append(self._delta_chunk(idx, {key: content}, d.logprobs))
        if tools and self._chat:
            for t in tools:
                if t.index in st.tools_seen:
                    if t.arguments:
                        out.append(self._args_chunk(idx, t))
                else:
                    st.tools_seen.add(t.index)
                    st.tool_calls = True
                    out.append(self._delta_chunk(idx, {"tool_calls": [self._first_piece(t)]}))
                    if t.arguments:
                        out.append(self._args_chunk(idx, t))
        if d.finish_reason is not None:
            st.finish = d.finish_reason

    @property
    def finish_reasons(self) -> tuple[str, ...]:
        """The engine's finish reason of each choice that has one, in choice order (for traces)."""
        return tuple(st.finish for _, st in sorted(self._choices.items()) if st.finish is not None)

    def finish(self, usage_fallback: Usage | None = None) -> bytes:
        """The pending finish chunks (choice order), the usage chunk if the client asked for it, `[DONE]`.

        The usage chunk uses the engine's last usage, else `usage_fallback`, else zeros.
        """
        if self._done:
            return b""
        self._done = True
        out: list[bytes] = []
        for idx in sorted(self._choices):
            st = self._choices[idx]
            if st.finish is None or st.finished:
                continue
            if not st.started:
                self._role(idx, st, out, None)
            reason = final_finish_reason(st.finish, st.tool_calls, self._named) if self._chat else st.finish
            out.append(self._finish_chunk(idx, reason or "stop"))
            st.finished = True
        if self._include_usage:
            u = self.usage or usage_fallback or Usage()
            out.append(self._head + b'],"usage":' + _dumps(encode_usage(u)) + b"}\n\n")
        out.append(_DONE)
        return b"".join(out)

    def error(self, err: ApiError) -> bytes:
        """One `data: {"error": …}` event, then `[DONE]`; ends the stream."""
        if self._done:
            return b""
        self._done = True
        return b"data: " + err.body() + b"\n\n" + _DONE
