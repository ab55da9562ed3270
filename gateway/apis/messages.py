"""Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.

    MessagesIntake   after the parse stage: the translation into a chat request
                     (messages_request.py) and `ctx.answer` (written by `engines.anthropic`)
    CountTokens      the last stage of count_tokens: `{"input_tokens": N}`, N the gateway's own
                     estimate of the translated prompt (the sanitise stage's, which admission
                     also uses), with no engine round trip
    credentials      Anthropic clients send `x-api-key`: on these paths it counts as
                     `Authorization: Bearer <key>` (an `Authorization` header wins)

Errors on these paths are Anthropic's shape (`engines.anthropic.render_error`), including the
authentication, limit (429 with `retry-after`) and mid-stream errors.
"""

from __future__ import annotations

from typing import Any

import orjson

from engines.anthropic import MessagesStream, encode_message, new_message_id
from engines.base import Dialect, StreamWriter, Usage
from gateway.apis.messages_request import translate
from gateway.core.context import RequestContext
from gateway.core.responses import JSON, BytesResponse, Response


def credentials(headers: dict[bytes, bytes]) -> None:
    """`x-api-key` as a bearer credential, when no `Authorization` header is present."""
    key = headers.get(b"x-api-key")
    if key and b"authorization" not in headers:
        headers[b"authorization"] = b"Bearer " + key.strip()


def _estimate(ctx: RequestContext) -> int:
    features: Any = ctx.extras.get("features")
    return int(features.prompt_tokens) if features is not None else 0


class MessagesAnswer:
    """`gateway.core.answer.Answer` for one Messages request."""

    __slots__ = ("_ctx", "_model", "finish_reasons")
    content_type = JSON

    def __init__(self, ctx: RequestContext, model: str) -> None:
        self._ctx = ctx
        self._model = model
        self.finish_reasons: tuple[str, ...] = ()

    def body(self, dialect: Dialect, data: bytes) -> tuple[bytes, Usage]:
        completion = dialect.decode_response("chat", data)
        self.finish_reasons = tuple(c.finish_reason for c in completion.choices if c.finish_reason)
        return encode_message(completion, id=new_message_id(), model=self._served()), completion.usage

    def _served(self) -> str:
        """The model that answers: the one asked for, or the fallback that took over."""
        model = self._ctx.model
        return model.name if model is not None else self._model

    def stream(self) -> StreamWriter:
        return MessagesStream(
            id=new_message_id(), model=self._served(), input_tokens_estimate=_estimate(self._ctx)
        )

    async def complete(self) -> None:
        return None


class MessagesIntake:
    name = "messages"

    def __init__(self, count_only: bool = False) -> None:
        self._count_only = count_only

    async def __call__(self, ctx: RequestContext) -> Response | None:
        model = ctx.body["model"]
        ctx.body = translate(ctx.body, count_only=self._count_only)
        ctx.stream = ctx.body.get("stream") is True
        ctx.include_usage = False
        if not self._count_only:
            ctx.answer = MessagesAnswer(ctx, model)
        return None


class CountTokens:
    name = "count_tokens"

    async def __call__(self, ctx: RequestContext) -> Response | None:
        return BytesResponse(200, orjson.dumps({"input_tokens": _estimate(ctx)}), ctx.response_headers)
