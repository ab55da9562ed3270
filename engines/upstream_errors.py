"""Engine error bodies → OpenAI's errors. Shared by both dialects (their shapes overlap).

Accepted shapes: vLLM's nested `{"error": {message, type, param, code: int}}`, SGLang's flat
`{"object": "error", message, type, param, code}`, FastAPI's `{"detail": …}`, and anything else
(treated as an opaque upstream failure). The mapping (docs/engines.md, "Errors"):

    context too long (either engine's wording)   → 400 context_length_exceeded, param messages|prompt,
                                                   one canonical OpenAI-style message
    unknown model                                → 404 model_not_found
    tool parser not configured                   → 400, param tool_choice, no server flags named
    other 4xx                                    → 400 invalid_request_error, the engine's message
                                                   with URLs, hosts, paths and tracebacks removed
    401/403 (engine auth: our misconfiguration)  → 500 server_error
    429, 503                                     → 503 server_error "overloaded"
    other 5xx, garbage                           → 500 server_error, generic message
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from engines.base import Endpoint
from engines.errors import ApiError, context_length_exceeded, overloaded, server_error

_CONTEXT = re.compile(
    r"context length|context window|maximum context|too many tokens|longer than the model", re.I
)
_CTX_LEN = re.compile(r"context length (?:is only |is |of )?\(?(\d+)", re.I)
_INPUT = re.compile(
    r"passed (\d+) input tokens|input \((\d+) tokens\)|(\d+) tokens from the input|(\d+) in the messages"
    r"|messages resulted in (\d+)|prompt contains (?:at least )?(\d+) input tokens",  # the last: vLLM 0.32
    re.I,
)
_OUTPUT = re.compile(
    r"requested (\d+) output tokens|(\d+) tokens for the completion|(\d+) in the completion", re.I
)
_MODEL = re.compile(r"model\b.*\b(does not exist|not found)", re.I)
_TOOL_PARSER = re.compile(r"--enable-auto-tool-choice|--tool-call-parser|tool.call.parser", re.I)

_TRACEBACK = re.compile(r"Traceback \(most recent call last\).*", re.S)
_FILE_REF = re.compile(r'File "[^"]*"(, line \d+)?(, in \S+)?')
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I)
_HOSTPORT = re.compile(
    r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b|\[[0-9a-f:]+\](?::\d+)?|\b[\w.-]+:\d{2,5}\b", re.I
)
_PATH = re.compile(r"(?<![\w.])(?:~|\.{1,2})?/(?:[\w.@+-]+/)*[\w.@+-]+")
_PARAM_OK = re.compile(r"^[A-Za-z_][\w.\[\]]{0,63}$")
_MAX_MESSAGE = 1000

#: the request field a context-length error is about, per engine endpoint
_PROMPT_PARAM: dict[Endpoint, str] = {
    "chat": "messages",
    "completions": "prompt",
    "embeddings": "input",
    "tokenize": "prompt",
    "detokenize": "tokens",
    "rerank": "documents",
    "score": "text_2",
    "transcriptions": "file",
    "translations": "file",
}

GENERIC_UPSTREAM = "The server had an error while processing your request. Sorry about that!"


def scrub(message: str) -> str:
    """The message without tracebacks, file references, URLs, host:port pairs or paths."""
    m = _TRACEBACK.sub("", message)
    m = _FILE_REF.sub("", m)
    m = _URL.sub("<redacted>", m)
    m = _HOSTPORT.sub("<redacted>", m)
    m = _PATH.sub("<redacted>", m)
    m = " ".join(m.split())
    if len(m) > _MAX_MESSAGE:
        m = m[: _MAX_MESSAGE - 1] + "…"
    return m


def _first_int(rx: re.Pattern[str], text: str) -> int | None:
    m = rx.search(text)
    if m is None:
        return None
    for g in m.groups():
        if g is not None:
            return int(g)
    return None


def context_error(message: str, endpoint: Endpoint) -> ApiError:
    """One canonical message whichever engine's wording came in (OpenAI's classic wording)."""
    param = what = _PROMPT_PARAM[endpoint]
    ctx = _first_int(_CTX_LEN, message)
    inp = _first_int(_INPUT, message)
    out = _first_int(_OUTPUT, message)
    if ctx is None:
        text = (
            f"The {what} exceed this model's maximum context length. Please reduce the length of the {what}."
        )
    elif inp is not None and out is not None:
        text = (
            f"This model's maximum context length is {ctx} tokens. However, you requested {inp + out} tokens "
            f"({inp} in the {what}, {out} in the completion). Please reduce the length of the {what} or completion."
        )
    elif inp is not None:
        text = (
            f"This model's maximum context length is {ctx} tokens. However, your {what} resulted in {inp} "
            f"tokens. Please reduce the length of the {what}."
        )
    else:
        text = f"This model's maximum context length is {ctx} tokens. Please reduce the length of the {what}."
    return context_length_exceeded(text, param=param)


def _fields(obj: Any) -> tuple[str, Any, Any]:
    """(message, param, code) from any of the accepted shapes."""
    if type(obj) is not dict:
        return "", None, None
    inner = obj.get("error")
    if type(inner) is dict:
        obj = inner
    elif type(inner) is str:
        return inner, None, None
    msg = obj.get("message")
    if msg is None and "detail" in obj:
        detail = obj["detail"]
        msg = detail if type(detail) is str else ""
    return (msg if type(msg) is str else ""), obj.get("param"), obj.get("code")


def map_error(status: int, message: str, param: Any, endpoint: Endpoint) -> ApiError:
    """The OpenAI error for an engine's (status, message, param)."""
    if status >= 500 or status < 400:
        return overloaded() if status == 503 else server_error(GENERIC_UPSTREAM)
    if status in (401, 403):
        return server_error(GENERIC_UPSTREAM)
    if status == 429:
        return overloaded()
    if _CONTEXT.search(message):
        return context_error(message, endpoint)
    if status == 404 or _MODEL.search(message):
        return ApiError(
            404,
            "The model does not exist or you do not have access to it.",
            type="invalid_request_error",
            code="model_not_found",
        )
    if _TOOL_PARSER.search(message):
        return ApiError(
            400,
            "Tool calling is not available for this model.",
            type="invalid_request_error",
            param="tool_choice",
        )
    p = param if type(param) is str and _PARAM_OK.match(param) else None
    if p == "input_tokens":
        p = _PROMPT_PARAM[endpoint]
    text = scrub(message) or "Invalid request."
    return ApiError(400, text, type="invalid_request_error", param=p)


def decode_error_body(status: int, body: bytes, endpoint: Endpoint) -> ApiError:
    """A non-200 answer → `ApiError`. Never raises."""
    try:
        obj = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        obj = None
    msg, param, _ = _fields(obj)
    return map_error(status, msg, param, endpoint)


def decode_error_event(obj: dict[str, Any], endpoint: Endpoint) -> ApiError:
    """A mid-stream `{"error": …}` event (status from its int `code`, else 500)."""
    msg, param, code = _fields(obj)
    status = code if type(code) is int and 400 <= code <= 599 else 500
    return map_error(status, msg, param, endpoint)
