"""OpenAI's request semantics, checked once at the gateway so both engines' pools answer alike.

`validate_request(endpoint, body)` raises `ApiError` (400, OpenAI's type/code/param/message wording)
for what OpenAI rejects and the engines treat differently — or not at all. It reads only the fields
present, so a plain request costs a few dictionary lookups. Judgement calls (docs/engines.md):
- `n > 1` is allowed with any temperature, as OpenAI allows it (choices may then be identical);
- `tool_choice: "none"` without `tools` is allowed (nothing to constrain); any other value is not;
- legacy completions' `logprobs` is an integer 0..5 (OpenAI's limit), chat's a boolean;
- null means "not given" for every optional field.
Size and injection bounds belong to the sanitiser, not here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engines.base import Endpoint
from engines.errors import ApiError, above_max_length, invalid_request

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_TOOL_CHOICES = frozenset({"none", "auto", "required"})
_RESPONSE_FORMATS = frozenset({"text", "json_object", "json_schema", "structural_tag"})


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    t = type(v)
    if t is bool:
        return "a boolean"
    if t is int:
        return "an integer"
    if t is float:
        return "a decimal"
    if t is str:
        return "a string"
    if t is list:
        return "an array"
    if t is dict:
        return "an object"
    return "an unknown type"


def _type_error(param: str, expected: str, v: Any) -> ApiError:
    return invalid_request(
        f"Invalid type for '{param}': expected {expected}, but got {_kind(v)} instead.",
        param=param,
        code="invalid_type",
    )


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_num(v: Any) -> bool:
    t = type(v)
    return t is int or t is float


def _range(param: str, v: float, lo: float | None, hi: float | None) -> None:
    word = "integer" if type(v) is int else "decimal"
    if lo is not None and v < lo:
        raise invalid_request(
            f"Invalid '{param}': {word} below minimum value. Expected a value >= {lo}, but got {v} instead.",
            param=param,
            code=f"{word}_below_min_value",
        )
    if hi is not None and v > hi:
        raise invalid_request(
            f"Invalid '{param}': {word} above maximum value. Expected a value <= {hi}, but got {v} instead.",
            param=param,
            code=f"{word}_above_max_value",
        )


def _int_field(lo: int | None, hi: int | None) -> Callable[[str, Any], None]:
    def check(param: str, v: Any) -> None:
        if not _is_int(v):
            raise _type_error(param, "an integer", v)
        _range(param, v, lo, hi)

    return check


def _num_field(lo: float | None, hi: float | None) -> Callable[[str, Any], None]:
    def check(param: str, v: Any) -> None:
        if not _is_num(v):
            raise _type_error(param, "a decimal", v)
        _range(param, v, lo, hi)

    return check


def _typed(pred: Callable[[Any], bool], expected: str) -> Callable[[str, Any], None]:
    def check(param: str, v: Any) -> None:
        if not pred(v):
            raise _type_error(param, expected, v)

    return check


def _stop(param: str, v: Any) -> None:
    if type(v) is str:
        return
    if type(v) is not list or not all(type(s) is str for s in v):
        raise _type_error(param, "a string or an array of strings", v)


_bool = _typed(lambda v: type(v) is bool, "a boolean")
_str = _typed(lambda v: type(v) is str, "a string")
_obj = _typed(lambda v: type(v) is dict, "an object")

#: simple per-field checks shared by both endpoints (field → check(param, value)).
_COMMON: dict[str, Callable[[str, Any], None]] = {
    "stream": _bool,
    "n": _int_field(1, 128),
    "temperature": _num_field(0, 2),
    "top_p": _num_field(0, 1),
    "frequency_penalty": _num_field(-2, 2),
    "presence_penalty": _num_field(-2, 2),
    "max_tokens": _int_field(1, None),
    "seed": _int_field(None, None),
    "stop": _stop,
    "user": _str,
    "logit_bias": _obj,
    "stream_options": _obj,
}
_CHAT: dict[str, Callable[[str, Any], None]] = {
    **_COMMON,
    "max_completion_tokens": _int_field(1, None),
    "logprobs": _bool,
    "top_logprobs": _int_field(0, 20),
    "parallel_tool_calls": _bool,
    "response_format": _obj,
    "tools": _typed(lambda v: type(v) is list, "an array"),
}
_COMPLETIONS: dict[str, Callable[[str, Any], None]] = {
    **_COMMON,
    "logprobs": _int_field(0, 5),
    "echo": _bool,
    "suffix": _str,
    "best_of": _int_field(1, 20),
}


def validate_request(endpoint: Endpoint, body: Any) -> None:
    """Raise `ApiError` (400) if `body` breaks OpenAI's rules for `endpoint`; return None if not."""
    if type(body) is not dict:
        raise invalid_request("The request body must be a JSON object.")
    model = body.get("model")
    if model is None:
        raise invalid_request("You must provide a model parameter.")
    if type(model) is not str:
        raise _type_error("model", "a string", model)
    checks = _CHAT if endpoint == "chat" else _COMPLETIONS
    for key, value in body.items():
        if value is None:
            continue
        check = checks.get(key)
        if check is not None:
            check(key, value)
    _stream_options(body)
    if endpoint == "chat":
        _messages(body.get("messages"))
        _tools(body)
        _logprobs(body)
        _response_format(body.get("response_format"))
    else:
        _prompt(body.get("prompt"))


def _stream_options(body: dict[str, Any]) -> None:
    so = body.get("stream_options")
    if so is None:
        return
    if body.get("stream") is not True:
        raise invalid_request(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.", param="stream_options"
        )
    for k in ("include_usage", "continuous_usage_stats"):
        v = so.get(k)
        if v is not None and type(v) is not bool:
            raise _type_error(f"stream_options.{k}", "a boolean", v)


def _logprobs(body: dict[str, Any]) -> None:
    if body.get("top_logprobs") is not None and body.get("logprobs") is not True:
        raise invalid_request(
            "Invalid value for 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' is specified.",
            param="top_logprobs",
        )


def _response_format(rf: Any) -> None:
    if rf is None:
        return
    t = rf.get("type")
    if type(t) is not str:
        raise _type_error("response_format.type", "a string", t)
    if t not in _RESPONSE_FORMATS:
        raise invalid_request(
            f"Invalid value: '{t}'. Supported values are: 'text', 'json_object', 'json_schema' and 'structural_tag'.",
            param="response_format.type",
            code="invalid_value",
        )
    if t == "json_schema":
        js = rf.get("json_schema")
        if type(js) is not dict:
            raise invalid_request(
                "Missing required parameter: 'response_format.json_schema'.",
                param="response_format.json_schema",
                code="missing_required_parameter",
            )
        name = js.get("name")
        if type(name) is not str:
            raise invalid_request(
                "Missing required parameter: 'response_format.json_schema.name'.",
                param="response_format.json_schema.name",
                code="missing_required_parameter",
            )


def _tools(body: dict[str, Any]) -> None:
    tools = body.get("tools")
    names: set[str] = set()
    if tools is not None:
        if not tools:
            raise invalid_request(
                "Invalid 'tools': empty array. Expected an array with minimum length 1, but got an empty array instead.",
                param="tools",
                code="empty_array",
            )
        for i, t in enumerate(tools):
            p = f"tools[{i}]"
            if type(t) is not dict:
                raise _type_error(p, "an object", t)
            if t.get("type") != "function":
                raise invalid_request(
                    f"Invalid value for '{p}.type': expected 'function'.",
                    param=f"{p}.type",
                    code="invalid_value",
                )
            fn = t.get("function")
            if type(fn) is not dict:
                raise _type_error(f"{p}.function", "an object", fn)
            name = fn.get("name")
            if type(name) is not str:
                raise _type_error(f"{p}.function.name", "a string", name)
            params = fn.get("parameters")
            if params is not None and type(params) is not dict:
                raise _type_error(f"{p}.function.parameters", "an object", params)
            names.add(name)
    tc = body.get("tool_choice")
    if tc is None:
        return
    if type(tc) is str:
        if tc not in _TOOL_CHOICES:
            raise invalid_request(
                f"Invalid value: '{tc}'. Supported values are: 'none', 'auto', and 'required'.",
                param="tool_choice",
                code="invalid_value",
            )
        if tc != "none" and tools is None:
            raise _tool_choice_without_tools()
        return
    if type(tc) is not dict:
        raise _type_error("tool_choice", "a string or an object", tc)
    fn = tc.get("function")
    name = fn.get("name") if type(fn) is dict else None
    if tc.get("type") != "function" or type(name) is not str:
        raise invalid_request(
            'Invalid value for \'tool_choice\': expected {"type": "function", "function": {"name": …}}.',
            param="tool_choice",
        )
    if tools is None:
        raise _tool_choice_without_tools()
    if name not in names:
        raise invalid_request(
            f"Invalid value for 'tool_choice': no function named {name} was specified in the 'tools' parameter.",
            param="tool_choice",
        )


def _tool_choice_without_tools() -> ApiError:
    return invalid_request(
        "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
        param="tool_choice",
    )


def _missing(param: str) -> ApiError:
    return invalid_request(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _messages(messages: Any) -> None:
    if messages is None:
        raise _missing("messages")
    if type(messages) is not list:
        raise _type_error("messages", "an array", messages)
    if not messages:
        raise invalid_request(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            param="messages",
            code="empty_array",
        )
    for i, m in enumerate(messages):
        p = f"messages[{i}]"
        if type(m) is not dict:
            raise _type_error(p, "an object", m)
        role = m.get("role")
        if role is None:
            raise _missing(f"{p}.role")
        if type(role) is not str:
            raise _type_error(f"{p}.role", "a string", role)
        if role not in _ROLES:
            raise invalid_request(
                f"Invalid value: '{role}'. Supported values are: 'system', 'developer', 'user', 'assistant', and 'tool'.",
                param=f"{p}.role",
                code="invalid_value",
            )
        content = m.get("content")
        if content is None:
            if role != "assistant":  # an assistant turn may carry only tool calls (or a prefix)
                raise _missing(f"{p}.content")
        elif type(content) is list:
            _parts(f"{p}.content", content)
        elif type(content) is not str:
            raise _type_error(f"{p}.content", "a string or an array", content)
        if role == "tool" and type(m.get("tool_call_id")) is not str:
            raise _missing(f"{p}.tool_call_id")
        tcs = m.get("tool_calls")
        if tcs is not None and role == "assistant":
            _assistant_tool_calls(f"{p}.tool_calls", tcs)


def _parts(p: str, parts: list[Any]) -> None:
    for j, part in enumerate(parts):
        q = f"{p}[{j}]"
        if type(part) is not dict:
            raise _type_error(q, "an object", part)
        t = part.get("type")
        if type(t) is not str:
            raise _missing(f"{q}.type") if t is None else _type_error(f"{q}.type", "a string", t)
        if t == "text" and type(part.get("text")) is not str:
            raise _type_error(f"{q}.text", "a string", part.get("text"))


def _assistant_tool_calls(p: str, tcs: Any) -> None:
    if type(tcs) is not list:
        raise _type_error(p, "an array", tcs)
    for k, tc in enumerate(tcs):
        q = f"{p}[{k}]"
        if type(tc) is not dict:
            raise _type_error(q, "an object", tc)
        fn = tc.get("function")
        if type(fn) is not dict:
            raise _type_error(f"{q}.function", "an object", fn)
        if type(fn.get("name")) is not str:
            raise _type_error(f"{q}.function.name", "a string", fn.get("name"))
        if type(fn.get("arguments")) is not str:
            raise _type_error(f"{q}.function.arguments", "a string", fn.get("arguments"))


#: most prompts in one completions batch (vLLM's default `VLLM_MAX_COMPLETION_PROMPTS`; SGLang has no
#: limit): the same answer from both pools
MAX_PROMPTS = 1024
#: the largest token id taken (a 32-bit signed int, as the engines' tensors hold them)
MAX_TOKEN_ID = (1 << 31) - 1


def _prompt(prompt: Any) -> None:
    """A completions `prompt`: a string, token ids, or a batch (strings or token-id arrays), each of
    its prompts non-empty and its token ids in range. vLLM refuses an empty prompt in a batch and
    SGLang serves it (its scheduler died on an empty token array, and on a negative id: measured), so
    the gateway refuses them for both."""
    if prompt is None:
        raise _missing("prompt")
    if type(prompt) is str:
        return
    if type(prompt) is list and not prompt:
        raise invalid_request(
            "Invalid 'prompt': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            param="prompt",
            code="empty_array",
        )
    if type(prompt) is list:
        first = prompt[0]
        if type(first) is int and all(type(x) is int for x in prompt):
            token_ids(prompt, "prompt")
            return
        if len(prompt) > MAX_PROMPTS:
            raise above_max_length("prompt", MAX_PROMPTS, len(prompt), "array")
        if type(first) is str and all(type(x) is str for x in prompt):
            for i, x in enumerate(prompt):
                if not x:
                    raise _empty_prompt(i)
            return
        if type(first) is list and all(type(x) is list for x in prompt):
            for i, x in enumerate(prompt):
                if not x:
                    raise _empty_prompt(i)
                token_ids(x, f"prompt[{i}]")
            return
    raise _type_error("prompt", "a string, an array of strings, or an array of token arrays", prompt)


def _empty_prompt(i: int) -> ApiError:
    return invalid_request(
        f"Invalid 'prompt[{i}]': empty prompt. Every prompt of a batch must have at least one token.",
        param=f"prompt[{i}]",
        code="invalid_value",
    )


def token_ids(ids: list[Any], param: str) -> None:
    """Each of `ids` an int token id in 0..`MAX_TOKEN_ID` (a completions prompt's, an embeddings input's)."""
    for j, t in enumerate(ids):
        if type(t) is not int:
            raise _type_error(f"{param}[{j}]", "an integer token id", t)
        if t < 0 or t > MAX_TOKEN_ID:
            _range(f"{param}[{j}]", t, 0, MAX_TOKEN_ID)
