"""The first stages: read the body (size-capped), parse it, resolve the model, validate semantics.

After `ParseStage`, `ctx.raw_body`, `ctx.body`, `ctx.model`, `ctx.stream` and `ctx.include_usage` are
set. A model whose `task` is not the endpoint's (an embedding model on chat, a chat model on
embeddings) is a 400 naming the model; tokenizing takes a model of any task. `ValidateStage`
applies the OpenAI semantics both engines disagree on (engines.validate), so both pools answer alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from engines import multipart
from engines.base import Endpoint
from engines.errors import ApiError, invalid_request, model_not_found
from engines.validate import validate_request
from gateway.core.context import Principal, RequestContext
from gateway.core.responses import Receive, Response
from gateway.core.settings import ModelSettings

_BAD_JSON = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your "
    "HTTP library correctly. The API expects a JSON payload, but what was sent was not valid JSON.)"
)


async def read_body(receive: Receive, max_bytes: int) -> bytes:
    """The whole request body, or ApiError 413 as soon as it grows past `max_bytes`."""
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > max_bytes:
            raise _too_large(max_bytes)
        return body
    parts = [body]
    size = len(body)
    while message.get("more_body", False):
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ApiError(400, "The client closed the connection before sending the whole body.")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        parts.append(chunk)
    return b"".join(parts)


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413, f"The request body is larger than the maximum of {max_bytes} bytes.", code="request_too_large"
    )


#: what a model of each task is, and where it is used (a refusal's words)
_TASKS = {
    "generate": ("a text generation model", "chat, completions, /v1/responses or /v1/messages"),
    "embed": ("an embedding model", "/v1/embeddings"),
    "score": ("a scoring model", "/v1/rerank or /v1/score"),
    "transcribe": ("a speech-to-text model", "/v1/audio/transcriptions or /v1/audio/translations"),
}


def wrong_task(model: str, task: str) -> ApiError:
    """A model that exists but does another task (`task`, the model's) than the endpoint's."""
    what, where = _TASKS[task]
    return invalid_request(f"The model `{model}` is {what}: use it with {where}.", param="model")


#: (principal, public model name) → may the principal use the model (gateway/admission/access.py)
Permits = Callable[[Principal, str], bool]


class ParseStage:
    """`permits`, when given, is asked right after the model is resolved: a model the caller may not
    use is answered exactly like one that does not exist (404 `model_not_found`, before any other
    check could reveal that it exists). `task` None takes a model of any task (tokenizing)."""

    name = "parse"

    def __init__(
        self,
        models: dict[str, ModelSettings],
        max_body_bytes: int,
        permits: Permits | None = None,
        task: str | None = "generate",
    ) -> None:
        # the gateway's own mapping, which a reload changes in place
        self._all = models
        self._task = task
        self._max = max_body_bytes
        self._permits = permits

    async def __call__(self, ctx: RequestContext) -> Response | None:
        raw = await read_body(ctx.receive, self._max)
        ctx.raw_body = raw
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise invalid_request(f"The request body is not valid UTF-8 (byte {exc.start}).") from None
            raise invalid_request(_BAD_JSON) from None
        if not isinstance(body, dict):
            raise invalid_request("The request body must be a JSON object.")
        ctx.body = body
        ctx.model = self.resolve(ctx, body.get("model"))
        ctx.stream = body.get("stream") is True
        ctx.include_usage = ctx.stream and _asks_usage(body.get("stream_options"))
        return None

    def resolve(self, ctx: RequestContext, model: Any) -> ModelSettings:
        """The settings of the model a request names: 400 without one, 404 for a model that does not
        exist or that the caller may not use, 400 for one of another task."""
        if not isinstance(model, str) or not model:
            raise invalid_request("you must provide a model parameter", param="model")
        spec = self._all.get(model)
        if spec is None or (self._permits is not None and not self._permits(ctx.principal, model)):
            # a model the caller may not use is the same 404 as an unknown one (no existence leak)
            raise model_not_found(model)
        if self._task is not None and spec.task != self._task:
            raise wrong_task(model, spec.task)
        return spec


class FormParseStage(ParseStage):
    """`ParseStage` for a `multipart/form-data` upload (speech to text) instead of JSON: `ctx.body`
    holds each text field (a list for a repeated `name[]` field) and each file as an
    `engines.multipart.Part`. Another content type, a malformed form or a field given twice is a 400."""

    async def __call__(self, ctx: RequestContext) -> Response | None:
        boundary = multipart.boundary(ctx.headers.get(b"content-type", b"").decode("latin-1"))
        if boundary is None:
            raise invalid_request("The request body must be multipart/form-data with a file part.")
        raw = await read_body(ctx.receive, self._max)
        body: dict[str, Any] = {}
        try:
            for part in multipart.parse(raw, boundary):
                value: Any = part if part.filename is not None else part.text
                if part.name.endswith("[]"):
                    body.setdefault(part.name, []).append(value)
                elif part.name in body:
                    raise invalid_request(f"The form gives '{part.name}' more than once.", param=part.name)
                else:
                    body[part.name] = value
        except ValueError as exc:
            raise invalid_request(f"The request body is not a valid multipart form: {exc}.") from None
        ctx.body = body
        ctx.model = self.resolve(ctx, body.get("model"))
        return None


def _asks_usage(options: Any) -> bool:
    return isinstance(options, dict) and options.get("include_usage") is True


class ValidateStage:
    name = "validate"

    def __init__(self, endpoint_check: Callable[[Endpoint, dict[str, Any]], None] = validate_request) -> None:
        self._check = endpoint_check

    async def __call__(self, ctx: RequestContext) -> Response | None:
        self._check(ctx.endpoint, ctx.body)
        return None
