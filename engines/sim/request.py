"""Request parsing shared by both dialects: JSON body → checked fields → `Job`.

Errors are raised as `RequestError`; each dialect's app renders them in its own shape (vLLM nested,
SGLang flat). Type checks follow the engines' pydantic models loosely: a field of the wrong type is a
400 "validation error"; explicit `null` is accepted except for the fields the dialect passes in
`non_nullable` (SGLang: `n`, `frequency_penalty`, `presence_penalty`, `logprobs`, `stream`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from engines.sim import tokenizer
from engines.sim.generator import Constraint

Kind = Literal["chat", "completion"]


class RequestError(Exception):
    """A request the engine rejects; `err_type` None means the dialect's default for `status`.
    `in_stream`: a streamed request learns of it only after its 200 (vLLM's input processing runs
    inside its stream generator), as one `data: {"error": …}` event and `[DONE]`."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        err_type: str | None = None,
        in_stream: bool = False,
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.err_type = err_type
        self.in_stream = in_stream


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


_CHECKS: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "model": (lambda v: isinstance(v, str), "string_type", "Input should be a valid string"),
    "n": (_is_int, "int_type", "Input should be a valid integer"),
    "max_tokens": (_is_int, "int_type", "Input should be a valid integer"),
    "max_completion_tokens": (_is_int, "int_type", "Input should be a valid integer"),
    "min_tokens": (_is_int, "int_type", "Input should be a valid integer"),
    "top_logprobs": (_is_int, "int_type", "Input should be a valid integer"),
    "seed": (_is_int, "int_type", "Input should be a valid integer"),
    "top_k": (_is_int, "int_type", "Input should be a valid integer"),
    "temperature": (_is_num, "float_type", "Input should be a valid number"),
    "top_p": (_is_num, "float_type", "Input should be a valid number"),
    "frequency_penalty": (_is_num, "float_type", "Input should be a valid number"),
    "presence_penalty": (_is_num, "float_type", "Input should be a valid number"),
    "min_p": (_is_num, "float_type", "Input should be a valid number"),
    "repetition_penalty": (_is_num, "float_type", "Input should be a valid number"),
    "stream": (lambda v: isinstance(v, bool), "bool_type", "Input should be a valid boolean"),
    "ignore_eos": (lambda v: isinstance(v, bool), "bool_type", "Input should be a valid boolean"),
    "stop": (
        lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)),
        "string_type",
        "Input should be a valid string",
    ),
    "messages": (lambda v: isinstance(v, list), "list_type", "Input should be a valid list"),
    "tools": (lambda v: isinstance(v, list), "list_type", "Input should be a valid list"),
    "tool_choice": (lambda v: isinstance(v, str | dict), "union_type", "Input should be a valid string"),
    "response_format": (lambda v: isinstance(v, dict), "dict_type", "Input should be a valid dictionary"),
    "stream_options": (lambda v: isinstance(v, dict), "dict_type", "Input should be a valid dictionary"),
    "chat_template_kwargs": (
        lambda v: isinstance(v, dict),
        "dict_type",
        "Input should be a valid dictionary",
    ),
}
_CHAT_LOGPROBS = (lambda v: isinstance(v, bool), "bool_type", "Input should be a valid boolean")
_COMPLETION_LOGPROBS = (_is_int, "int_type", "Input should be a valid integer")


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body, or a 400."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(
            f"1 validation error:\n  JSON decode error: {exc}", err_type="Bad Request"
        ) from exc
    if not isinstance(body, dict):
        raise RequestError(
            "1 validation error:\n  Input should be a valid dictionary", err_type="Bad Request"
        )
    return body


def check_types(body: dict[str, Any], kind: Kind, model_name: str, non_nullable: frozenset[str]) -> None:
    """Raise a pydantic-style 400 for the first field of the wrong type."""
    errors: list[str] = []
    required = "messages" if kind == "chat" else "prompt"
    if required not in body:
        errors.append(f"{{'type': 'missing', 'loc': ('body', '{required}'), 'msg': 'Field required'}}")
    for key, value in body.items():
        check = _CHECKS.get(key)
        if key == "logprobs":
            check = _CHAT_LOGPROBS if kind == "chat" else _COMPLETION_LOGPROBS
        if check is None:
            continue
        if value is None:
            if key in non_nullable:
                errors.append(
                    f"{{'type': '{check[1]}', 'loc': ('body', '{key}'), 'msg': '{check[2]}', 'input': None}}"
                )
            continue
        if not check[0](value):
            errors.append(
                f"{{'type': '{check[1]}', 'loc': ('body', '{key}'), 'msg': '{check[2]}', 'input': {value!r}}}"
            )
    if errors:
        n = len(errors)
        title = f"{n} validation error{'s' if n > 1 else ''} for {model_name}"
        raise RequestError(title + ":\n  " + "\n  ".join(errors), err_type="Bad Request")
    n_val = body.get("n")
    if n_val is not None and n_val < 1:
        raise RequestError(f"n must be at least 1, got {n_val}.", param="n")


def seed_of(body: dict[str, Any]) -> int:
    """The request's `seed`, else a stable hash of the canonical body (stream settings left out)."""
    seed = body.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        return seed
    canon = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    digest = hashlib.blake2b(orjson.dumps(canon, option=orjson.OPT_SORT_KEYS), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def stop_list(body: dict[str, Any]) -> tuple[str, ...]:
    """The `stop` field as a tuple of strings."""
    stop = body.get("stop")
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list):
        return tuple(s for s in stop if isinstance(s, str) and s)
    return ()


def max_tokens_of(body: dict[str, Any]) -> int | None:
    """`max_completion_tokens`, else `max_tokens`, else None."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


@dataclass(frozen=True, slots=True)
class PromptIn:
    """One prompt of a request: its text (decoded, for token-id prompts) and its token ids."""

    text: str
    ids: list[int]


PromptForm = Literal["text", "tokens", "texts", "token_lists", "invalid"]


def prompt_form(prompt: Any) -> PromptForm:
    """Which of the four `/v1/completions` prompt forms `prompt` is (`invalid`: none; an empty list
    is `texts`, as both engines' first union member that accepts it)."""
    if isinstance(prompt, str):
        return "text"
    if not isinstance(prompt, list):
        return "invalid"
    if all(isinstance(p, str) for p in prompt):
        return "texts"
    if all(_is_int(t) for t in prompt):
        return "tokens"
    if all(isinstance(p, list) and all(_is_int(t) for t in p) for p in prompt):
        return "token_lists"
    return "invalid"


def _token_id_errors(ids: list[Any]) -> list[tuple[int, str, str]]:
    """(position, pydantic type, message) of every element of `ids` that is not a token id (int >= 0)."""
    out: list[tuple[int, str, str]] = []
    for j, t in enumerate(ids):
        if not _is_int(t):
            out.append((j, "int_type", "Input should be a valid integer"))
        elif t < 0:
            out.append((j, "greater_than_equal", "Input should be greater than or equal to 0"))
    return out


def prompt_validation_error(prompt: Any, loc: Callable[[str, tuple[int, ...]], str]) -> str | None:
    """Pydantic's error for a list `prompt` that none of `list[int >= 0] | list[list[int >= 0]] | str |
    list[str]` accepts: every failing element of every union member, in that order, as the engines
    print it (`loc(member, path)` writes a location in the dialect's style); None when one member
    accepts it (or it is no list)."""
    if not isinstance(prompt, list):
        return None
    flat = [((j,), kind, msg) for j, kind, msg in _token_id_errors(prompt)]
    strs = [
        ((i,), "string_type", "Input should be a valid string")
        for i, p in enumerate(prompt)
        if not isinstance(p, str)
    ]
    if not flat or not strs:
        return None
    nested: list[tuple[tuple[int, ...], str, str]] = []
    for i, p in enumerate(prompt):
        if isinstance(p, list):
            nested += [((i, j), kind, msg) for j, kind, msg in _token_id_errors(p)]
        else:
            nested.append(((i,), "list_type", "Input should be a valid list"))
    if not nested:
        return None
    failures = [
        *(("list[int]", *f) for f in flat),
        *(("list[list[int]]", *f) for f in nested),
        ("str", (), "string_type", "Input should be a valid string"),
        *(("list[str]", *f) for f in strs),
    ]
    lines = [
        f"{{'type': '{kind}', 'loc': {loc(member, path)}, 'msg': '{msg}'}}"
        for member, path, kind, msg in failures
    ]
    return f"{len(lines)} validation errors:\n  " + "\n  ".join(lines)


def completion_prompts(prompt: Any, form: PromptForm) -> list[PromptIn]:
    """The prompts of a `/v1/completions` `prompt` of `form` (`prompt_form`), one per engine request: a
    string or a list of token ids is one prompt, a list of strings or of token-id lists one prompt per
    element (the dialect has refused the forms its engine refuses before calling this)."""
    if form == "text":
        return [PromptIn(prompt, tokenizer.encode(prompt))]
    if form == "tokens":
        return [PromptIn(tokenizer.decode(prompt), list(prompt))]
    if form == "texts":
        return [PromptIn(p, tokenizer.encode(p)) for p in prompt]
    if form == "token_lists":
        return [PromptIn(tokenizer.decode(p), list(p)) for p in prompt]
    return [PromptIn("", [])]


def response_format_constraint(rf: Any) -> Constraint | None:
    """The output constraint of an OpenAI `response_format` (None for text / unknown)."""
    if not isinstance(rf, dict):
        return None
    kind = rf.get("type")
    if kind == "json_object":
        return ("json", {"type": "object"})
    if kind == "json_schema":
        js = rf.get("json_schema") or {}
        schema = js.get("schema", js.get("schema_")) if isinstance(js, dict) else None
        return ("json", schema if isinstance(schema, dict) else {"type": "object"})
    return None


@dataclass(slots=True)
class Usage:
    """Token accounting of one request."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """prompt + completion."""
        return self.prompt_tokens + self.completion_tokens
