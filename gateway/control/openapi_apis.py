"""The OpenAPI entries of the client APIs beyond chat (gateway/apis/): OpenAI's Responses API and
embeddings, Anthropic's Messages API. Documentation only, like `openapi.py`, which merges these
docs-only routes into the admin app's `/openapi.json`; nothing here runs per request.

The request models list what the gateway reads, with the ranges it enforces; other fields are
answered as docs/api.md says (passed on as on chat for Responses; refused for Messages, as
Anthropic refuses them). Errors on `/v1/messages*` are Anthropic's shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

_BEARER: list[dict[str, list[str]]] = [{"bearerAuth": []}]
_ANTHROPIC_AUTH: list[dict[str, list[str]]] = [{"bearerAuth": []}, {"apiKeyAuth": []}]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class _OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    error: _OpenAIErrorDetail


class _AnthropicErrorDetail(BaseModel):
    type: Literal[
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "api_error",
        "timeout_error",
        "overloaded_error",
    ]
    message: str


class AnthropicError(BaseModel):
    """Anthropic's error shape (every error on /v1/messages*; 503 is sent as 529 overloaded_error)."""

    type: Literal["error"]
    error: _AnthropicErrorDetail


# -- Responses ------------------------------------------------------------------------------------
class ResponsesFunctionTool(_Open):
    type: Literal["function"]
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesRequest(_Open):
    model: str = Field(description="a model some pool serves (GET /v1/models)")
    input: str | list[dict[str, Any]] | None = Field(
        None, description="a string, or items: message, function_call, function_call_output, reasoning"
    )
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool | None = Field(
        None, description="default true: stored with a TTL, readable by its owner only"
    )
    stream: bool | None = None
    max_output_tokens: int | None = Field(None, ge=16)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    tools: list[ResponsesFunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = Field(
        None, description="{format: {type: text | json_object | json_schema}}"
    )
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None


class ResponseObject(_Open):
    id: str = Field(description="resp_…")
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete", "failed", "in_progress"]
    model: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None = None


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response.deleted"]
    deleted: bool


class InputItemList(BaseModel):
    object: Literal["list"]
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


# -- embeddings -----------------------------------------------------------------------------------
class EmbeddingsRequest(_Open):
    model: str = Field(description="a model whose task is `embed`")
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: dict[str, int]


# -- Anthropic Messages ---------------------------------------------------------------------------
class AnthropicMessage(_Open):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class AnthropicTool(_Open):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]


class MessagesRequest(BaseModel):
    model: str = Field(description="a model some pool serves (GET /v1/models)")
    messages: list[AnthropicMessage]
    max_tokens: int = Field(ge=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


class CountTokensRequest(BaseModel):
    model: str
    messages: list[AnthropicMessage]
    system: str | list[dict[str, Any]] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


class MessageObject(_Open):
    id: str = Field(description="msg_…")
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    stop_sequence: str | None
    usage: dict[str, int]


class CountTokens(BaseModel):
    input_tokens: int = Field(description="the gateway's estimate of the translated prompt")


def _errors(model: type[BaseModel], statuses: Sequence[int]) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": model, "description": "an error"} for s in statuses}


_OPENAI = (400, 401, 404, 413, 429, 503)
_SSE = {
    "text/event-stream": {"schema": {"type": "string", "description": "`event: <type>` + `data: <json>`"}}
}


def _never_called() -> None:  # pragma: no cover - docs-only routes are never mounted
    raise AssertionError("documentation-only route")


def apis_router(model_names: Sequence[str]) -> APIRouter:
    """Docs-only routes for the endpoints gateway/apis/ answers (never mounted)."""
    names = ", ".join(f"`{n}`" for n in model_names) or "none"
    openai_extra = {"security": _BEARER, "description": f"Models served at start-up: {names}."}
    router = APIRouter()

    @router.post(
        "/v1/responses",
        response_model=ResponseObject,
        responses={
            **_errors(OpenAIError, _OPENAI),
            200: {"content": _SSE, "description": "the response, or its events"},
        },
        summary="OpenAI Responses API (streaming with `stream: true`)",
        tags=["OpenAI-compatible"],
        openapi_extra=openai_extra,
    )
    async def responses(body: ResponsesRequest) -> None:
        _never_called()

    @router.get(
        "/v1/responses/{response_id}",
        response_model=ResponseObject,
        responses=_errors(OpenAIError, (400, 401, 404)),
        summary="A stored response (its owner only)",
        tags=["OpenAI-compatible"],
        openapi_extra={"security": _BEARER},
    )
    async def get_response(response_id: str) -> None:
        _never_called()

    @router.delete(
        "/v1/responses/{response_id}",
        response_model=ResponseDeleted,
        responses=_errors(OpenAIError, (401, 404)),
        summary="Delete a stored response",
        tags=["OpenAI-compatible"],
        openapi_extra={"security": _BEARER},
    )
    async def delete_response(response_id: str) -> None:
        _never_called()

    @router.get(
        "/v1/responses/{response_id}/input_items",
        response_model=InputItemList,
        responses=_errors(OpenAIError, (400, 401, 404)),
        summary="A stored response's input items",
        tags=["OpenAI-compatible"],
        openapi_extra={"security": _BEARER},
    )
    async def input_items(
        response_id: str, limit: int = 20, order: Literal["asc", "desc"] = "desc", after: str | None = None
    ) -> None:
        _never_called()

    @router.post(
        "/v1/embeddings",
        response_model=EmbeddingsResponse,
        responses=_errors(OpenAIError, _OPENAI),
        summary="Embeddings (models with `task: embed`)",
        tags=["OpenAI-compatible"],
        openapi_extra=openai_extra,
    )
    async def embeddings(body: EmbeddingsRequest) -> None:
        _never_called()

    anthropic_extra = {
        "security": _ANTHROPIC_AUTH,
        "description": f"Anthropic's Messages API; `x-api-key` or a bearer token. Models: {names}.",
    }

    @router.post(
        "/v1/messages",
        response_model=MessageObject,
        responses={
            **_errors(AnthropicError, (400, 401, 404, 413, 429, 529)),
            200: {"content": _SSE, "description": "the message, or its events"},
        },
        summary="Anthropic Messages API (streaming with `stream: true`)",
        tags=["Anthropic-compatible"],
        openapi_extra=anthropic_extra,
    )
    async def messages(body: MessagesRequest) -> None:
        _never_called()

    @router.post(
        "/v1/messages/count_tokens",
        response_model=CountTokens,
        responses=_errors(AnthropicError, (400, 401, 404, 413, 429)),
        summary="Count a Messages request's input tokens (the gateway's estimate)",
        tags=["Anthropic-compatible"],
        openapi_extra=anthropic_extra,
    )
    async def count_tokens(body: CountTokensRequest) -> None:
        _never_called()

    return router
