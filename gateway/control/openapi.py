"""The public API in the OpenAPI document: documentation only, never on the request path.

`/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/v1/models/{id}`, `/healthz`, `/health` and
`/readyz` are answered by `gateway.app.Gateway` before any framework routing, so they are not routes of the
admin FastAPI app. `document_public_api(app, models)` makes the admin app's `/openapi.json` describe
them anyway: it builds docs-only routes on a router that is never mounted, and merges their paths and
schemas into the admin app's document (with the bearer security scheme both APIs use). Nothing here
runs per request; the handlers below are never called.

The request models describe what the gateway accepts: OpenAI's fields with OpenAI's ranges, plus
`extra` fields, which the gateway passes to engines that know them (docs/engines.md). `model` is any
string (unknown names are a 404); the names served at start-up are listed in the description.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field

from gateway.control.openapi_apis import apis_router
from gateway.control.openapi_engine_apis import engine_apis_router

_SECURITY: list[dict[str, list[str]]] = [{"bearerAuth": []}]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- errors ---------------------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error envelope; every error the gateway answers has this shape."""

    error: ErrorDetail


# -- chat -----------------------------------------------------------------------------------------
class ContentPart(_Open):
    type: Literal["text", "image_url", "input_audio", "file"]
    text: str | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(_Open):
    role: Literal["system", "developer"]
    content: str | list[ContentPart]
    name: str | None = None


class UserMessage(_Open):
    role: Literal["user"]
    content: str | list[ContentPart]
    name: str | None = None


class AssistantMessage(_Open):
    role: Literal["assistant"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None


class ToolMessage(_Open):
    role: Literal["tool"]
    content: str | list[ContentPart]
    tool_call_id: str


ChatMessage = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


class FunctionDef(_Open):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Open):
    include_usage: bool | None = None


class ChatCompletionRequest(_Open):
    model: str = Field(description="a model some pool serves (GET /v1/models)")
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int | None = Field(None, ge=1, le=128)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, int] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    user: str | None = None


class Usage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatChoice(_Open):
    index: int
    message: dict[str, Any]
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class ChatCompletion(_Open):
    id: str = Field(description="chatcmpl-…")
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


# -- legacy completions ---------------------------------------------------------------------------
class CompletionRequest(_Open):
    model: str = Field(description="a model some pool serves (GET /v1/models)")
    prompt: str | list[str] | list[int] | list[list[int]]
    suffix: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int | None = Field(None, ge=1, le=128)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    echo: bool | None = None
    seed: int | None = None
    logprobs: int | None = Field(None, ge=0, le=5)
    user: str | None = None


class CompletionChoice(_Open):
    index: int
    text: str
    finish_reason: str | None


class Completion(_Open):
    id: str = Field(description="cmpl-…")
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


# -- models and probes ----------------------------------------------------------------------------
class Model(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]


class Status(BaseModel):
    status: str


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in (
        (400, "invalid request (param names the field)"),
        (401, "missing or invalid credentials"),
        (404, "unknown model"),
        (413, "body larger than server.max_body_bytes"),
        (429, "rate limited (retry-after says when)"),
        (503, "no backend can take the request now"),
    )
}
_SSE = {
    "text/event-stream": {
        "schema": {"type": "string", "description": "`data: <chunk>` events, `data: [DONE]` last"}
    }
}


def _never_called() -> None:  # pragma: no cover - docs-only routes are never mounted
    raise AssertionError("documentation-only route")


def public_router(model_names: Sequence[str]) -> APIRouter:
    """Docs-only routes for the endpoints `gateway.app` answers itself (never mounted)."""
    names = ", ".join(f"`{n}`" for n in model_names) or "none"
    router = APIRouter(tags=["OpenAI-compatible"])
    chat_extra = {"security": _SECURITY, "description": f"Models served at start-up: {names}."}

    @router.post(
        "/v1/chat/completions",
        response_model=ChatCompletion,
        responses={**_ERRORS, 200: {"content": _SSE, "description": "the completion, or its stream"}},
        summary="Chat completion (streaming with `stream: true`)",
        openapi_extra=chat_extra,
    )
    async def chat_completions(body: ChatCompletionRequest) -> None:
        _never_called()

    @router.post(
        "/v1/completions",
        response_model=Completion,
        responses={**_ERRORS, 200: {"content": _SSE, "description": "the completion, or its stream"}},
        summary="Legacy completion (streaming with `stream: true`)",
        openapi_extra=chat_extra,
    )
    async def completions(body: CompletionRequest) -> None:
        _never_called()

    @router.get(
        "/v1/models",
        response_model=ModelList,
        responses={401: _ERRORS[401]},
        summary="The models the caller may use (authenticated like chat)",
        openapi_extra={"security": _SECURITY},
    )
    async def models() -> None:
        _never_called()

    @router.get(
        "/v1/models/{model_id}",
        response_model=Model,
        responses={401: _ERRORS[401], 404: {"model": ErrorResponse, "description": "unknown model"}},
        summary="One model (404 also when the caller may not use it)",
        openapi_extra={"security": _SECURITY},
    )
    async def model(model_id: str) -> None:
        _never_called()

    @router.get("/healthz", response_model=Status, summary="200 while the process is alive", tags=["probes"])
    async def healthz() -> None:
        _never_called()

    @router.get(
        "/health", response_model=Status, summary="The same as /healthz (what engines serve)", tags=["probes"]
    )
    async def health() -> None:
        _never_called()

    @router.get(
        "/readyz",
        response_model=Status,
        responses={503: {"model": Status, "description": "not ready"}},
        summary="200 when a backend is healthy (and Redis answers, when configured)",
        tags=["probes"],
    )
    async def readyz() -> None:
        _never_called()

    return router


def document_public_api(app: FastAPI, model_names: Sequence[str]) -> None:
    """Make `app.openapi()` (served at /openapi.json) describe the public API as well as the admin one."""
    public = public_router(model_names)
    apis = apis_router(model_names)  # /v1/responses…, /v1/embeddings, /v1/messages… (openapi_apis.py)
    engine_apis = engine_apis_router(model_names)  # tokenize, rerank, score, audio (openapi_engine_apis.py)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title="LLM gateway",
                version=app.version,
                description=(
                    "OpenAI-compatible public API (answered by the gateway's own ASGI dispatcher; "
                    "documented here) and the admin API (admin role)."
                ),
                routes=[*public.routes, *apis.routes, *engine_apis.routes, *app.routes],
            )
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a JWT or an sk-gw- API key",
                },
                "apiKeyAuth": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "x-api-key",
                    "description": "the same credential, as Anthropic clients send it (/v1/messages* only)",
                },
            }
            for path, item in schema.get("paths", {}).items():
                if path.startswith("/admin/"):
                    for op in item.values():
                        op.setdefault("security", _SECURITY)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
