"""The Responses API's stages: create (`POST /v1/responses`) and read back (`GET`/`DELETE
/v1/responses/{id}`, `GET /v1/responses/{id}/input_items`).

    ResponsesIntake   after the parse stage: the previous response (by `previous_response_id`, the
                      caller's own only: another principal's id is a 404 like an unknown one), the
                      translation into a chat request (responses_request.py), and `ctx.answer`
    ResponsesAnswer   writes the answer with `engines.responses` and, before its last bytes go out,
                      stores it (`store` is true by default): the client can read it back or
                      continue from it the moment it has it, on any replica sharing the store
    ResponseLookup    the read-back endpoints: authentication, then the store

A store that cannot be written (Redis down) does not fail the answer the client already has: it is
logged, and a later lookup answers 404.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Literal
from urllib.parse import parse_qsl

import orjson

from engines.base import Dialect, StreamWriter, Usage
from engines.errors import ApiError, invalid_request
from engines.responses import ResponsesStream, encode_response, new_id
from gateway.apis.responses_request import Translation, translate
from gateway.apis.responses_store import ResponseStore, StoredResponse, owner_of
from gateway.core.context import RequestContext
from gateway.core.responses import JSON, BytesResponse, Response

log = logging.getLogger("gateway.apis")

#: ctx.extras keys the gateway's dispatcher fills for the read-back endpoints
RESPONSE_ID = "apis.response_id"
QUERY = "apis.query"


def not_found(response_id: str, param: str | None = None) -> ApiError:
    if param == "previous_response_id":
        return ApiError(
            404,
            f"Previous response with id '{response_id[:128]}' not found.",
            type="invalid_request_error",
            param=param,
            code="previous_response_not_found",
        )
    return ApiError(404, f"Response with id '{response_id[:128]}' not found.", type="invalid_request_error")


class ResponsesAnswer:
    """`gateway.core.answer.Answer` for one Responses request."""

    __slots__ = ("_max_bytes", "_owner", "_response", "_store", "_t", "_writer", "finish_reasons")
    content_type = JSON

    def __init__(self, t: Translation, store: ResponseStore, owner: str, max_record_bytes: int) -> None:
        self._t = t
        self._store = store
        self._owner = owner
        self._max_bytes = max_record_bytes
        self._response: dict[str, Any] | None = None
        self._writer: ResponsesStream | None = None
        self.finish_reasons: tuple[str, ...] = ()

    def body(self, dialect: Dialect, data: bytes) -> tuple[bytes, Usage]:
        completion = dialect.decode_response("chat", data)
        self.finish_reasons = tuple(c.finish_reason for c in completion.choices if c.finish_reason)
        self._response = encode_response(completion, self._t.head)
        return orjson.dumps(self._response), completion.usage

    def stream(self) -> StreamWriter:
        self._writer = ResponsesStream(self._t.head)
        return self._writer

    async def complete(self) -> None:
        response = self._response if self._writer is None else self._writer.response
        if not self._t.store or response is None:
            return
        record = StoredResponse(
            self._owner, response, self._t.input_items, [*self._t.context, *response["output"]]
        )
        try:
            raw = record.dumps()
            if len(raw) > self._max_bytes:
                log.warning(
                    "response %s not stored: its record is %d bytes (at most %d)",
                    record.id,
                    len(raw),
                    self._max_bytes,
                )
                return
            await self._store.put(record)
        except Exception as exc:
            log.error("response %s could not be stored: %s", record.id, exc)


class ResponsesIntake:
    name = "responses"

    def __init__(self, store: ResponseStore, max_record_bytes: int) -> None:
        self._store = store
        self._max_bytes = max_record_bytes

    async def __call__(self, ctx: RequestContext) -> Response | None:
        body = ctx.body
        owner = owner_of(ctx.principal)
        context: list[dict[str, Any]] | None = None
        previous = body.get("previous_response_id")
        if previous is not None:
            if type(previous) is not str:
                raise invalid_request(
                    "Invalid type for 'previous_response_id': expected a string.",
                    param="previous_response_id",
                )
            record = await self._store.get(owner, previous)
            if record is None:
                raise not_found(previous, "previous_response_id")
            context = record.context
        t = translate(body, context=context, response_id=new_id("resp"), created_at=int(time.time()))
        ctx.body = t.chat
        ctx.answer = ResponsesAnswer(t, self._store, owner, self._max_bytes)
        return None


class ResponseLookup:
    """GET / DELETE /v1/responses/{id} and GET /v1/responses/{id}/input_items."""

    def __init__(self, store: ResponseStore, kind: Literal["get", "delete", "input_items"]) -> None:
        self._store = store
        self._kind = kind
        self.name = f"responses.{kind}"

    async def __call__(self, ctx: RequestContext) -> Response | None:
        response_id: str = ctx.extras.get(RESPONSE_ID, "")
        owner = owner_of(ctx.principal)
        query = _query(ctx.extras.get(QUERY, b""))
        if self._kind == "delete":
            if not await self._store.delete(owner, response_id):
                raise not_found(response_id)
            body: Any = {"id": response_id, "object": "response.deleted", "deleted": True}
            return BytesResponse(200, orjson.dumps(body), ctx.response_headers)
        record = await self._store.get(owner, response_id)
        if record is None:
            raise not_found(response_id)
        if self._kind == "get":
            if query.get("stream") in ("true", "1"):
                raise invalid_request(
                    "Streaming a stored response again (stream=true) is not supported by this gateway.",
                    param="stream",
                )
            return BytesResponse(200, orjson.dumps(record.response), ctx.response_headers)
        return BytesResponse(
            200, orjson.dumps(input_items_page(record.input_items, query)), ctx.response_headers
        )


def _query(raw: bytes) -> dict[str, str]:
    return dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True))


def input_items_page(items: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
    """OpenAI's list page of input items: `limit` 1–100 (20), `order` desc (default) or asc, `after`."""
    limit_raw = query.get("limit", "20")
    if not limit_raw.isdigit() or not 1 <= int(limit_raw) <= 100:
        raise invalid_request(
            f"Invalid 'limit': expected an integer from 1 to 100, got '{limit_raw[:16]}'.", param="limit"
        )
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid_request(
            f"Invalid value: '{order[:16]}'. Supported values are: 'asc' and 'desc'.", param="order"
        )
    ordered = list(reversed(items)) if order == "desc" else list(items)
    after = query.get("after")
    if after:
        ids = [it.get("id") for it in ordered]
        if after not in ids:
            raise invalid_request(f"No input item with id '{after[:128]}' in this response.", param="after")
        ordered = ordered[ids.index(after) + 1 :]
    limit = int(limit_raw)
    page = ordered[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(ordered) > limit,
    }
