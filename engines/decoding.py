"""Response-side decoding shared by both dialects: both engines answer in near-OpenAI JSON, and
every difference between them is absorbed here, field by field:

- reasoning: vLLM `reasoning` (older builds `reasoning_content`), SGLang `reasoning_content` →
  `reasoning`;
- usage: `prompt_tokens_details.cached_tokens` (either engine, when enabled),
  `completion_tokens_details.reasoning_tokens` (vLLM) or top-level `reasoning_tokens` (SGLang);
- tool calls: SGLang's `content: ""` beside `tool_calls` → None; SGLang's repeated `id: null` /
  `name: null` on later pieces are dropped — a call's id and name are taken from its first piece only;
- finish reasons: `function_call` → `tool_calls`; unknown → `stop`; `abort` → an error event;
- the stop string that ended a choice: vLLM `stop_reason`, SGLang `matched_stop` (when a string;
  an int there is the EOS token id) → `stop_sequence` (the Anthropic encoder reports it);
- embeddings: both engines' `data[].embedding` (floats or base64) and `usage.prompt_tokens`;
- other engine extras (`metadata`, `token_ids`, `prompt_token_ids`, `kv_transfer_params`, `sglext`,
  `hidden_states`…) are never read, so never shown.

Nothing here raises anything but `ApiError`, whatever the bytes.
"""

from __future__ import annotations

from typing import Any

import orjson

from engines.base import (
    Choice,
    Completion,
    Delta,
    Embeddings,
    Endpoint,
    StreamEvent,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from engines.errors import ApiError, server_error
from engines.upstream_errors import GENERIC_UPSTREAM, decode_error_body, decode_error_event

_loads = orjson.loads
_FINISH = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "content_filter": "content_filter",
    "function_call": "tool_calls",
}


def _upstream_garbage() -> ApiError:
    return server_error(GENERIC_UPSTREAM)


def _int(v: Any) -> int:
    return v if type(v) is int and v >= 0 else 0


def _opt_int(v: Any) -> int | None:
    return v if type(v) is int and v >= 0 else None


def decode_usage(u: Any) -> Usage | None:
    """Either engine's usage object → `Usage` (None when absent or not an object)."""
    if type(u) is not dict:
        return None
    ptd = u.get("prompt_tokens_details")
    cached = _opt_int(ptd.get("cached_tokens")) if type(ptd) is dict else None
    ctd = u.get("completion_tokens_details")
    reasoning = _opt_int(ctd.get("reasoning_tokens")) if type(ctd) is dict else None
    if reasoning is None:
        reasoning = _opt_int(u.get("reasoning_tokens"))
    return Usage(_int(u.get("prompt_tokens")), _int(u.get("completion_tokens")), cached, reasoning)


def _str(v: Any) -> str | None:
    return v if type(v) is str else None


def _top(entries: Any) -> list[dict[str, Any]]:
    if type(entries) is not list:
        return []
    return [
        {"token": e.get("token"), "logprob": e.get("logprob"), "bytes": e.get("bytes")}
        for e in entries
        if type(e) is dict
    ]


def chat_logprobs(lp: Any) -> Any:
    """Chat logprobs in OpenAI's shape `{"content": [...], "refusal": null}` (None if absent)."""
    if type(lp) is not dict:
        return None
    content = lp.get("content")
    if type(content) is not list:
        return None
    return {
        "content": [
            {
                "token": e.get("token"),
                "logprob": e.get("logprob"),
                "bytes": e.get("bytes"),
                "top_logprobs": _top(e.get("top_logprobs")),
            }
            for e in content
            if type(e) is dict
        ],
        "refusal": None,
    }


def text_logprobs(lp: Any) -> Any:
    """Legacy completions logprobs: OpenAI's four lists, nothing else."""
    if type(lp) is not dict:
        return None
    return {
        "tokens": lp.get("tokens"),
        "token_logprobs": lp.get("token_logprobs"),
        "top_logprobs": lp.get("top_logprobs"),
        "text_offset": lp.get("text_offset"),
    }


def finish_reason(v: Any) -> str | None:
    """Engine finish reason → OpenAI's (`abort` is returned as is; callers turn it into an error)."""
    if v is None:
        return None
    if v == "abort":
        return "abort"
    return _FINISH.get(v, "stop") if type(v) is str else "stop"


def _reasoning(d: dict[str, Any]) -> str | None:
    r = d.get("reasoning")
    if type(r) is not str:
        r = d.get("reasoning_content")
    return r if type(r) is str and r else None


def stop_string(ch: dict[str, Any]) -> str | None:
    """The stop string that ended a finished choice (vLLM `stop_reason`, SGLang `matched_stop`)."""
    v = ch.get("stop_reason")
    if type(v) is not str:
        v = ch.get("matched_stop")
    return v if type(v) is str else None


def _is_error(obj: dict[str, Any]) -> bool:
    return obj.get("error") is not None or obj.get("object") == "error"


# -- non-streamed -------------------------------------------------------------------------------


def _tool_calls(raw: Any) -> list[ToolCall] | None:
    if type(raw) is not list or not raw:
        return None
    out = []
    for t in raw:
        if type(t) is not dict:
            continue
        fn = t.get("function")
        fn = fn if type(fn) is dict else {}
        args = fn.get("arguments")
        if type(args) is not str:
            args = orjson.dumps(args).decode() if args is not None else ""
        out.append(ToolCall(_str(t.get("id")) or "", _str(fn.get("name")) or "", args))
    return out or None


def decode_body(endpoint: Endpoint, body: bytes) -> Completion:
    """A non-streamed 200 body of either engine → `Completion`. Raises only `ApiError`."""
    try:
        obj = _loads(body)
    except orjson.JSONDecodeError:
        raise _upstream_garbage() from None
    if type(obj) is not dict:
        raise _upstream_garbage()
    if _is_error(obj):
        raise decode_error_event(obj, endpoint)
    raw = obj.get("choices")
    if type(raw) is not list:
        raise _upstream_garbage()
    choices: list[Choice] = []
    for pos, ch in enumerate(raw):
        if type(ch) is not dict:
            raise _upstream_garbage()
        idx = ch.get("index")
        idx = idx if type(idx) is int and idx >= 0 else pos
        fr = finish_reason(ch.get("finish_reason"))
        if fr == "abort":
            raise _upstream_garbage()
        if endpoint == "chat":
            msg = ch.get("message")
            msg = msg if type(msg) is dict else {}
            tcs = _tool_calls(msg.get("tool_calls"))
            content = _str(msg.get("content"))
            if tcs and not content:
                content = None
            choice = Choice(idx, content, fr, _reasoning(msg), tcs, chat_logprobs(ch.get("logprobs")))
        else:
            choice = Choice(idx, _str(ch.get("text")) or "", fr, logprobs=text_logprobs(ch.get("logprobs")))
        if fr == "stop":
            choice.stop_sequence = stop_string(ch)
        choices.append(choice)
    return Completion(choices, decode_usage(obj.get("usage")) or Usage())


def decode_embeddings_body(body: bytes) -> Embeddings:
    """A 200 body of either engine's `/v1/embeddings` → `Embeddings`. Raises only `ApiError`.

    vLLM: `{"id", "object": "list", "created", "model", "data": [{"index", "object", "embedding"}],
    "usage": {...}}`; SGLang: the same without `id`/`created`, `model` the model path. Vectors are
    put in `index` order; each is a list of numbers or a base64 string."""
    try:
        obj = _loads(body)
    except orjson.JSONDecodeError:
        raise _upstream_garbage() from None
    if type(obj) is not dict:
        raise _upstream_garbage()
    if _is_error(obj):
        raise decode_error_event(obj, "embeddings")
    data = obj.get("data")
    if type(data) is not list:
        raise _upstream_garbage()
    indexed: list[tuple[int, list[float] | str]] = []
    for pos, item in enumerate(data):
        vec = item.get("embedding") if type(item) is dict else None
        if type(vec) is not list and type(vec) is not str:
            raise _upstream_garbage()
        idx = item.get("index")
        indexed.append((idx if type(idx) is int else pos, vec))
    indexed.sort(key=lambda p: p[0])
    usage = decode_usage(obj.get("usage")) or Usage()
    usage.completion_tokens = 0
    return Embeddings([v for _, v in indexed], usage)


# -- streamed -----------------------------------------------------------------------------------


class ChunkDecoder:
    """Stateful decoder of one stream of either engine (see module docstring). Not shared."""

    __slots__ = ("_chat", "_endpoint", "_seen_tools")

    def __init__(self, endpoint: Endpoint) -> None:
        self._endpoint: Endpoint = endpoint
        self._chat = endpoint == "chat"
        self._seen_tools: set[tuple[int, int]] = set()

    def feed(self, data: bytes) -> list[StreamEvent]:
        """One SSE `data:` payload → events. Usage (when present) comes first, then one `Delta` per
        non-empty choice; an engine error, an `abort`, or bytes that are not a chunk → an `ApiError`."""
        try:
            obj = _loads(data)
        except orjson.JSONDecodeError:
            return [_upstream_garbage()]
        if type(obj) is not dict:
            return [_upstream_garbage()]
        if _is_error(obj):
            return [decode_error_event(obj, self._endpoint)]
        events: list[StreamEvent] = []
        u = obj.get("usage")
        if u is not None:
            usage = decode_usage(u)
            if usage is not None:
                events.append(usage)
        choices = obj.get("choices")
        if type(choices) is not list:
            return events if u is not None else [_upstream_garbage()]
        for ch in choices:
            if type(ch) is not dict:
                return [_upstream_garbage()]
            ev = self._choice(ch)
            if ev is not None:
                events.append(ev)
                if type(ev) is not Delta:
                    break
        return events

    def _choice(self, ch: dict[str, Any]) -> StreamEvent | None:
        idx = ch.get("index")
        if type(idx) is not int or idx < 0:
            idx = 0
        fr = ch.get("finish_reason")
        if fr is not None:
            fr = finish_reason(fr)
            if fr == "abort":
                return _upstream_garbage()
        lp = ch.get("logprobs")
        if self._chat:
            d = ch.get("delta")
            if type(d) is not dict:
                d = {}
            content = d.get("content")
            content = content if type(content) is str and content else None
            reasoning = _reasoning(d)
            tcs = d.get("tool_calls")
            tools = self._tools(idx, tcs) if type(tcs) is list and tcs else None
            if lp is not None:
                lp = chat_logprobs(lp)
            if content is None and reasoning is None and tools is None and fr is None:
                return None
            delta = Delta(idx, content, reasoning, tools, fr, lp)
        else:
            text = ch.get("text")
            text = text if type(text) is str and text else None
            if lp is not None:
                lp = text_logprobs(lp)
            if text is None and fr is None:
                return None
            delta = Delta(idx, text, None, None, fr, lp)
        if fr == "stop":
            delta.stop_sequence = stop_string(ch)
        return delta

    def _tools(self, choice: int, raw: list[Any]) -> list[ToolCallDelta] | None:
        out: list[ToolCallDelta] = []
        seen = self._seen_tools
        for pos, t in enumerate(raw):
            if type(t) is not dict:
                continue
            ti = t.get("index")
            if type(ti) is not int or ti < 0:
                ti = pos
            fn = t.get("function")
            fn = fn if type(fn) is dict else {}
            args = fn.get("arguments")
            args = args if type(args) is str else ""
            key = (choice, ti)
            if key in seen:
                if args:
                    out.append(ToolCallDelta(ti, None, None, args))
            else:
                seen.add(key)
                out.append(ToolCallDelta(ti, _str(t.get("id")), _str(fn.get("name")) or "", args))
        return out or None


class OpenAIShapedAnswers:
    """The answer side both dialects share: each engine answers in OpenAI-like JSON whose differences
    `decode_body`, `ChunkDecoder`, `decode_embeddings_body` and `decode_error_body` absorb. A dialect
    inherits these methods and writes only its request side and its metrics."""

    def decode_response(self, endpoint: Endpoint, body: bytes) -> Completion:
        return decode_body(endpoint, body)

    def stream_decoder(self, endpoint: Endpoint) -> ChunkDecoder:
        return ChunkDecoder(endpoint)

    def decode_embeddings(self, body: bytes) -> Embeddings:
        return decode_embeddings_body(body)

    def decode_error(self, status: int, body: bytes, endpoint: Endpoint = "chat") -> ApiError:
        return decode_error_body(status, body, endpoint)
