"""`Apis`: the client APIs beyond chat and completions, assembled from their settings.

The root (`gateway/app.py`) asks it which API a request's method and path name (`match`, before
anything else runs: the API decides the error shape, so authentication's own errors come out in
it), and for the wing's stages of each API, which it places in that API's pipeline:

    responses               [auth] parse  ResponsesIntake  validate sanitise [admit] route proxy
    messages                [auth] parse  MessagesIntake   validate sanitise [admit] route proxy
    messages.count_tokens   [auth] parse  MessagesIntake   validate sanitise [admit] CountTokens
    embeddings              [auth] parse(task embed) EmbeddingsIntake        [admit] route proxy
    tokenize                [auth] parse(any task)   TokenizeIntake   media   [admit] route proxy
    detokenize              [auth] parse(any task)   DetokenizeIntake         [admit] route proxy
    rerank, score           [auth] parse(task score) RerankIntake|ScoreIntake [admit] route proxy
    audio.transcriptions, audio.translations
                            [auth] form parse(task transcribe) AudioIntake   [admit] route proxy
    responses.get|delete|input_items   [auth] ResponseLookup

`start(redis)` binds the Responses store: Redis when the process has a client, else memory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from redis.asyncio import Redis

from engines.anthropic import render_error as anthropic_error
from engines.audio import Task
from engines.base import Endpoint
from engines.errors import ApiError
from gateway.apis.audio import FORM_BYTES, AudioIntake
from gateway.apis.embeddings import EmbeddingsIntake
from gateway.apis.messages import CountTokens, MessagesIntake, credentials
from gateway.apis.responses import QUERY, RESPONSE_ID, ResponseLookup, ResponsesIntake
from gateway.apis.responses_store import MemoryResponseStore, RedisResponseStore, ResponseStore
from gateway.apis.scoring import RerankIntake, ScoreIntake
from gateway.apis.settings import ApisSettings
from gateway.apis.tokenize import DetokenizeIntake, TokenizeIntake
from gateway.core.context import Api, RequestContext
from gateway.core.responses import ErrorRenderer, openai_error
from policies.features import FeatureConfig

log = logging.getLogger("gateway.apis")

#: without Redis, stored responses kept in this process at most (the least recently used go first)
MEMORY_MAX_ENTRIES = 10_000
#: a response whose stored record (its conversation so far) would be larger is not stored: reading
#: it back or continuing it answers 404 (resending the conversation in full always works), and no
#: single conversation holds more than 8 MiB of Redis
MAX_RECORD_BYTES = 8 * 1024 * 1024

_PREFIX = "/v1/responses/"
_INPUT_ITEMS = "/input_items"


@dataclass(frozen=True, slots=True)
class ApiRoute:
    """What a request's method and path name: its API, the engine endpoint it is translated to, its
    error shape; `allowed` False when the path exists but not for this method (405)."""

    api: Api
    endpoint: Endpoint
    render_error: ErrorRenderer = openai_error
    allowed: bool = True
    response_id: str = ""
    methods: tuple[str, ...] = field(default=("POST",))

    def prepare(self, ctx: RequestContext, query: bytes) -> None:
        """Put what the API's stages read into the new context (before authentication runs)."""
        ctx.api = self.api
        ctx.endpoint = self.endpoint
        ctx.render_error = self.render_error
        if self.render_error is anthropic_error:
            credentials(ctx.headers)
            ctx.response_headers.append((b"request-id", ctx.request_id.encode()))
        if self.response_id:
            ctx.extras[RESPONSE_ID] = self.response_id
            ctx.extras[QUERY] = query

    def not_allowed(self, method: str, path: str) -> ApiError:
        return ApiError(405, f"Method {method} not allowed on {path}.", type="invalid_request_error")


_POST: dict[str, ApiRoute] = {
    "/v1/responses": ApiRoute("responses", "chat"),
    "/v1/embeddings": ApiRoute("embeddings", "embeddings"),
    "/v1/messages": ApiRoute("messages", "chat", anthropic_error),
    "/v1/messages/count_tokens": ApiRoute("messages.count_tokens", "chat", anthropic_error),
    "/tokenize": ApiRoute("tokenize", "tokenize"),
    "/v1/tokenize": ApiRoute("tokenize", "tokenize"),
    "/detokenize": ApiRoute("detokenize", "detokenize"),
    "/v1/detokenize": ApiRoute("detokenize", "detokenize"),
    "/rerank": ApiRoute("rerank", "rerank"),
    "/v1/rerank": ApiRoute("rerank", "rerank"),
    "/v1/score": ApiRoute("score", "score"),
    "/v1/audio/transcriptions": ApiRoute("audio.transcriptions", "transcriptions"),
    "/v1/audio/translations": ApiRoute("audio.translations", "translations"),
}


class Apis:
    def __init__(self, settings: ApisSettings) -> None:
        self._settings = settings
        r = settings.responses
        self.store: ResponseStore = MemoryResponseStore(r.store_ttl_s, MEMORY_MAX_ENTRIES)

    def start(self, redis: Redis | None) -> None:
        if redis is not None:
            self.store = RedisResponseStore(redis, self._settings.responses.store_ttl_s)
        log.info(
            "apis: /v1/responses store %s (ttl %gs)",
            "in Redis" if self.store.shared else "in memory (this process only)",
            self._settings.responses.store_ttl_s,
        )

    def match(self, method: str, path: str) -> ApiRoute | None:
        """The API of a request, or None when the path is none of this wing's."""
        route = _POST.get(path)
        if route is not None:
            return route if method == "POST" else _disallowed(route)
        if not path.startswith(_PREFIX):
            return None
        rest = path[len(_PREFIX) :]
        if rest.endswith(_INPUT_ITEMS):
            response_id = rest[: -len(_INPUT_ITEMS)]
            if not _plain(response_id):
                return None
            route = ApiRoute("responses.input_items", "chat", response_id=response_id, methods=("GET",))
            return route if method == "GET" else _disallowed(route)
        if not _plain(rest):
            return None
        if method == "GET":
            return ApiRoute("responses.get", "chat", response_id=rest, methods=("GET",))
        if method == "DELETE":
            return ApiRoute("responses.delete", "chat", response_id=rest, methods=("DELETE",))
        return _disallowed(ApiRoute("responses.get", "chat", response_id=rest, methods=("GET", "DELETE")))

    # -- the wing's stages, per API -----------------------------------------------------------
    def responses_intake(self) -> ResponsesIntake:
        return ResponsesIntake(self.store, MAX_RECORD_BYTES)

    def messages_intake(self, count_only: bool = False) -> MessagesIntake:
        return MessagesIntake(count_only)

    def count_tokens(self) -> CountTokens:
        return CountTokens()

    def embeddings_intake(self, features: FeatureConfig, context_slack: float) -> EmbeddingsIntake:
        return EmbeddingsIntake(features, context_slack)

    def tokenize_intake(self, features: FeatureConfig) -> TokenizeIntake:
        return TokenizeIntake(features)

    def detokenize_intake(self, features: FeatureConfig) -> DetokenizeIntake:
        return DetokenizeIntake(features)

    def rerank_intake(self, features: FeatureConfig, context_slack: float) -> RerankIntake:
        return RerankIntake(features, context_slack)

    def score_intake(self, features: FeatureConfig, context_slack: float) -> ScoreIntake:
        return ScoreIntake(features, context_slack)

    def audio_intake(self, task: Task, features: FeatureConfig, max_file_bytes: int) -> AudioIntake:
        return AudioIntake(task, max_file_bytes, features)

    def audio_body_bytes(self, max_file_bytes: int) -> int:
        """The cap of a speech-to-text request's body: the file's and its text fields'."""
        return max_file_bytes + FORM_BYTES

    def lookup(self, api: Api) -> ResponseLookup:
        kind = {"responses.get": "get", "responses.delete": "delete", "responses.input_items": "input_items"}[
            api
        ]
        return ResponseLookup(self.store, kind)  # type: ignore[arg-type]


def _disallowed(route: ApiRoute) -> ApiRoute:
    return ApiRoute(route.api, route.endpoint, route.render_error, allowed=False, methods=route.methods)


def _plain(response_id: str) -> bool:
    return 0 < len(response_id) <= 128 and "/" not in response_id
