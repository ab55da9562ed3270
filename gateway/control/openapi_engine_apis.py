"""The OpenAPI entries of the engines' own APIs the gateway serves (gateway/apis/tokenize.py,
scoring.py, audio.py): tokenize and detokenize, rerank and score, speech to text. Documentation
only, like `openapi_apis.py`; nothing here runs per request.

The request models list what the gateway reads, with the bounds it enforces; the answers are vLLM's
shapes (OpenAI's for audio) whichever engine served.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from gateway.control.openapi_apis import OpenAIError

_BEARER: list[dict[str, list[str]]] = [{"bearerAuth": []}]
_ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": OpenAIError, "description": "an error"} for s in (400, 401, 404, 413, 429, 503)
}
_TEXTS = Field(description="a string, or 1..2,048 strings")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TokenizeRequest(_Open):
    model: str = Field(description="a model some pool serves (GET /v1/models)")
    prompt: str | None = Field(None, description="exactly one of `prompt` and `messages`")
    messages: list[dict[str, Any]] | None = Field(None, description="as chat's, rendered by the template")
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    return_token_strs: bool | None = None


class Tokenized(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Open):
    model: str
    tokens: list[int] = Field(description="token ids in 0..2**31-1")


class Detokenized(BaseModel):
    prompt: str


class RerankRequest(_Open):
    model: str = Field(description="a model with `task: score` (a cross-encoder)")
    query: str
    documents: str | list[str] = _TEXTS
    top_n: int | None = Field(None, ge=0, description="0 or absent: every document")
    return_documents: bool | None = None
    instruction: str | None = None


class RerankResult(BaseModel):
    index: int
    document: dict[str, Any] | None = None
    relevance_score: float


class RerankResponse(_Open):
    id: str = Field(description="rerank-…")
    model: str
    usage: dict[str, int]
    results: list[RerankResult] = Field(description="best first")


class ScoreRequest(_Open):
    model: str = Field(description="a model with `task: score`")
    text_1: str | list[str] = _TEXTS
    text_2: str | list[str] = Field(description="paired 1:1, 1:N or N:N with `text_1`")


class ScoreItem(BaseModel):
    index: int
    object: Literal["score"]
    score: float


class ScoreResponse(_Open):
    id: str = Field(description="score-…")
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreItem]
    usage: dict[str, Any]


class AudioForm(BaseModel):
    """`multipart/form-data`; the file at most `sanitise.media.max_bytes`."""

    file: bytes = Field(json_schema_extra={"format": "binary"})
    model: str = Field(description="a model with `task: transcribe`")
    response_format: Literal["json", "text", "verbose_json"] | None = None
    language: str | None = None
    prompt: str | None = None
    temperature: float | None = Field(None, ge=0, le=1)


class Transcript(_Open):
    text: str
    usage: dict[str, Any] | None = Field(None, description='{"type": "duration", "seconds"}')


def _never_called() -> None:  # pragma: no cover - docs-only routes are never mounted
    raise AssertionError("documentation-only route")


def engine_apis_router(model_names: Sequence[str]) -> APIRouter:
    """Docs-only routes for the engines' own APIs (never mounted)."""
    names = ", ".join(f"`{n}`" for n in model_names) or "none"
    extra = {"security": _BEARER, "description": f"Models served at start-up: {names}."}
    router = APIRouter(tags=["Engine APIs"], responses=_ERRORS)

    @router.post(
        "/tokenize", response_model=Tokenized, summary="Token ids of a prompt or chat", openapi_extra=extra
    )
    async def tokenize(body: TokenizeRequest) -> None:
        _never_called()

    @router.post("/detokenize", response_model=Detokenized, summary="Text of token ids", openapi_extra=extra)
    async def detokenize(body: DetokenizeRequest) -> None:
        _never_called()

    for path in ("/v1/rerank", "/rerank"):

        @router.post(
            path, response_model=RerankResponse, summary="Rank documents by a query", openapi_extra=extra
        )
        async def rerank(body: RerankRequest) -> None:
            _never_called()

    @router.post("/v1/score", response_model=ScoreResponse, summary="Score text pairs", openapi_extra=extra)
    async def score(body: ScoreRequest) -> None:
        _never_called()

    audio = {
        **extra,
        "requestBody": {"content": {"multipart/form-data": {"schema": AudioForm.model_json_schema()}}},
    }
    text: dict[int | str, dict[str, Any]] = {
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "the transcript"}
    }
    for path, summary in (
        ("/v1/audio/transcriptions", "Speech to text in the spoken language"),
        ("/v1/audio/translations", "Speech to English text"),
    ):

        @router.post(path, response_model=Transcript, responses=text, summary=summary, openapi_extra=audio)
        async def transcribe() -> None:
            _never_called()

    return router
