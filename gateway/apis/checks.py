"""Small type checks the translators share, worded as OpenAI words them (`Invalid type for 'x': …`).

Each raises `ApiError` 400 with `param` naming the client's field (`input[2].content`), so a client
sees its own request's paths, never those of the chat request it is translated into.
"""

from __future__ import annotations

from typing import Any

from engines.errors import ApiError, invalid_request

_KINDS = {
    bool: "a boolean",
    int: "an integer",
    float: "a decimal",
    str: "a string",
    list: "an array",
    dict: "an object",
}


def kind(v: Any) -> str:
    return "null" if v is None else _KINDS.get(type(v), "an unknown type")


def type_error(param: str, expected: str, v: Any) -> ApiError:
    return invalid_request(
        f"Invalid type for '{param}': expected {expected}, but got {kind(v)} instead.",
        param=param,
        code="invalid_type",
    )


def missing(param: str) -> ApiError:
    return invalid_request(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def invalid_value(param: str, value: Any, allowed: tuple[str, ...]) -> ApiError:
    shown = ", ".join(f"'{a}'" for a in allowed)
    return invalid_request(
        f"Invalid value: '{str(value)[:64]}'. Supported values are: {shown}.",
        param=param,
        code="invalid_value",
    )


def unsupported(param: str, what: str) -> ApiError:
    return invalid_request(
        f"{what} is not supported by this gateway.", param=param, code="unsupported_parameter"
    )


def string(body: dict[str, Any], key: str, param: str | None = None) -> str | None:
    v = body.get(key)
    if v is not None and type(v) is not str:
        raise type_error(param or key, "a string", v)
    return v


def boolean(body: dict[str, Any], key: str, param: str | None = None) -> bool | None:
    v = body.get(key)
    if v is not None and type(v) is not bool:
        raise type_error(param or key, "a boolean", v)
    return v


def number(body: dict[str, Any], key: str, lo: float, hi: float, param: str | None = None) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    p = param or key
    if type(v) not in (int, float):
        raise type_error(p, "a decimal", v)
    if v < lo:
        raise invalid_request(
            f"Invalid '{p}': decimal below minimum value. Expected a value >= {lo}, but got {v} instead.",
            param=p,
            code="decimal_below_min_value",
        )
    if v > hi:
        raise invalid_request(
            f"Invalid '{p}': decimal above maximum value. Expected a value <= {hi}, but got {v} instead.",
            param=p,
            code="decimal_above_max_value",
        )
    return float(v) if type(v) is float else v


def integer(body: dict[str, Any], key: str, lo: int, param: str | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    p = param or key
    if type(v) is not int:
        raise type_error(p, "an integer", v)
    if v < lo:
        raise invalid_request(
            f"Invalid '{p}': integer below minimum value. Expected a value >= {lo}, but got {v} instead.",
            param=p,
            code="integer_below_min_value",
        )
    return v
