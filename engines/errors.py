"""The one error type that reaches clients, and its OpenAI wire shape.

    Exception
    └── ApiError            status + OpenAI's {"error": {message, type, param, code}}
        (constructors below name OpenAI's cases: invalid_request, model_not_found, ...)

Every failure a client sees — a validation error at the gateway, an engine's error re-shaped by its
dialect, a rate limit, an upstream outage — is an `ApiError`, turned into bytes in exactly one place
(`ApiError.body`). Messages never carry a backend address, a secret or a stack trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import orjson

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "requests",
}


class ApiError(Exception):
    """An error answered to the client in OpenAI's shape. `headers` are added to the response."""

    __slots__ = ("code", "headers", "message", "param", "status", "type")

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPE_BY_STATUS.get(status, "server_error")
        self.code = code
        self.param = param
        self.headers: dict[str, str] = dict(headers) if headers else {}

    def payload(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def body(self) -> bytes:
        return orjson.dumps(self.payload())

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.message!r}, type={self.type!r}, code={self.code!r}, param={self.param!r})"


def invalid_request(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, type="invalid_request_error", param=param, code=code)


def above_max_length(param: str, limit: int, got: int, kind: Literal["array", "string"]) -> ApiError:
    """OpenAI's answer to an array or a string parameter above its maximum length."""
    a = "an" if kind == "array" else "a"
    return invalid_request(
        f"Invalid '{param}': {kind} too long. Expected {a} {kind} with maximum length {limit}, but got {a} "
        f"{kind} with length {got} instead.",
        param=param,
        code=f"{kind}_above_max_length",
    )


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        type="invalid_request_error",
        code="model_not_found",
    )


def context_length_exceeded(message: str, *, param: str = "messages") -> ApiError:
    return ApiError(400, message, type="invalid_request_error", code="context_length_exceeded", param=param)


def server_error(
    message: str = "The server had an error while processing your request. Sorry about that!",
) -> ApiError:
    return ApiError(500, message, type="server_error")


def overloaded(
    message: str = "That model is currently overloaded with other requests. You can retry your request.",
) -> ApiError:
    return ApiError(503, message, type="server_error")


def upstream_timeout() -> ApiError:
    return ApiError(
        504,
        "The model did not answer in time. You can retry your request.",
        type="server_error",
        code="timeout",
    )
