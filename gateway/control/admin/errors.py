"""The admin API's answers to errors: OpenAI's error shape for every failure, never a stack trace.

ApiError                  its own status and body
HTTPException (routing)   404 "Invalid URL", 405, ... in the same shape
RequestValidationError    400 invalid_request_error naming the first bad field
RedisError, OSError       503 server_error, code redis_unavailable: the shared state is unreachable
"""

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException

from engines.errors import ApiError, invalid_request
from gateway.control.admin.common import NO_STORE

log = logging.getLogger("gateway.control")


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(RedisError, _store_unreachable)
    app.add_exception_handler(OSError, _store_unreachable)


def shared_state_unreachable(method: str, path: str, exc: BaseException) -> ApiError:
    what = "nothing was changed" if method not in ("GET", "HEAD") else f"{path} cannot be read now"
    return ApiError(
        503,
        f"Shared state (Redis) is unreachable ({type(exc).__name__}): {what}. docs/operations.md says "
        "what still works during a Redis outage.",
        type="server_error",
        code="redis_unavailable",
    )


def _answer(err: ApiError) -> Response:
    headers = {**NO_STORE, **(err.headers or {})}
    return Response(err.body(), status_code=err.status, media_type="application/json", headers=headers)


async def _api_error(request: Request, exc: ApiError) -> Response:
    return _answer(exc)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        return _answer(ApiError(404, f"Invalid URL ({request.method} {request.url.path})"))
    return _answer(ApiError(exc.status_code, str(exc.detail)))


async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    return _answer(
        invalid_request(f"Invalid request: {first.get('msg', 'bad input')}", param=".".join(loc) or None)
    )


async def _store_unreachable(request: Request, exc: Exception) -> Response:
    log.warning(
        "admin %s %s: shared state unreachable (%s)", request.method, request.url.path, type(exc).__name__
    )
    return _answer(shared_state_unreachable(request.method, request.url.path, exc))
