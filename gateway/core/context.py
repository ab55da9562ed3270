"""The one typed object that flows through the pipeline for a request.

Stages fill it in order (see gateway/pipeline.py); later stages may rely on what earlier ones set.
`finalizers` run once when the response has ended — sent in full, failed or abandoned by the client —
in reverse order of registration, so a stage that reserves something (a limit, an in-flight slot)
registers its release right where it reserves it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from engines.base import Endpoint, Usage
from gateway.core.responses import ErrorRenderer, openai_error
from policies.access import ModelAccess
from policies.budgets import Budget

if TYPE_CHECKING:
    from gateway.core.answer import Answer
    from gateway.core.fleet import Backend, Pool
    from gateway.core.settings import ModelSettings
    from gateway.core.trace import RequestTrace

#: the client's API, decided by the path before anything else runs (metrics' and the access log's
#: `endpoint`); `endpoint` below is the engine endpoint it is translated to
Api = Literal[
    "chat",
    "completions",
    "responses",
    "responses.get",
    "responses.delete",
    "responses.input_items",
    "embeddings",
    "messages",
    "messages.count_tokens",
    "tokenize",
    "detokenize",
    "rerank",
    "score",
    "audio.transcriptions",
    "audio.translations",
]

Finalizer = Callable[["RequestContext"], Awaitable[None] | None]


@dataclass(slots=True, eq=False)
class Principal:
    """Who is calling. `anonymous` when authentication is off.

    A principal proven by an API key also carries the key's own grants: `key_id`, its model access
    (None: the key narrows nothing), its budgets and its flow-control class (None: its tier's);
    `key_rev` changes whenever an operator changes them, so caches keyed by it see the change.
    """

    user: str
    tenant: str | None = None
    roles: frozenset[str] = frozenset()
    tier: str = "default"
    key_id: str | None = None
    key_access: ModelAccess | None = None
    key_budgets: tuple[Budget, ...] = ()
    key_rev: int = 0
    key_class: str | None = None

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles


ANONYMOUS = Principal(user="anonymous")


@dataclass(slots=True, eq=False)
class RequestContext:
    request_id: str
    endpoint: Endpoint
    #: time.perf_counter() when the request arrived (not loop.time(): uvloop's clock ticks in whole
    #: milliseconds, too coarse for the latencies the metrics and access log report)
    started: float
    headers: dict[bytes, bytes]  # request headers, lower-cased names (last value wins)
    receive: Callable[[], Awaitable[Any]]  # the ASGI receive channel (the body is read by a stage)
    #: the server's disconnect-callback setter, when it has one (gateway/edge/http_cycle.py); else the
    #: stages that must notice a client leaving park a task on `receive`
    on_disconnect: Callable[[Callable[[], None] | None], None] | None = None
    raw_body: bytes = b""
    body: dict[str, Any] = field(default_factory=dict)  # the parsed, validated OpenAI request
    principal: Principal = ANONYMOUS
    model: ModelSettings | None = None
    stream: bool = False
    include_usage: bool = False  # the client asked for the usage chunk
    pool: Pool | None = None
    backend: Backend | None = None
    route_reason: str = ""
    affinity: str = "none"
    #: the prompt tokens the routing expects the backend to prefill (`Decision.prefill`); each
    #: upstream attempt's lease counts them in its backend's `prefill` until the first token comes back
    prefill: int = 0
    attempts: int = 0
    status: int = 0
    usage: Usage | None = None
    first_token_at: float | None = None
    error_kind: str | None = None  # label for metrics and the access log when the request failed
    response_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    finalizers: list[Finalizer] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)  # per-stage scratch space (documented by the stage)
    #: the client's API (`endpoint` is the engine's); its error shape, and how its answer is written
    #: when that is not OpenAI's chat/completions (set by the API's intake stage, gateway/apis/)
    api: Api = "chat"
    render_error: ErrorRenderer = openai_error
    answer: Answer | None = None
    #: the engine request's content type when it is not JSON (a multipart audio upload)
    upstream_type: str | None = None
    #: this request's trace when tracing is on (gateway/core/trace.py); None when it is off
    trace: RequestTrace | None = None
    #: the request's flow-control class (gateway/flow/classes.py; "" before the flow stage ran)
    flow_class: str = ""


def session_header(ctx: RequestContext) -> str | None:
    """The session the request's `x-session-id` header names (agent harnesses send it), or None."""
    raw = ctx.headers.get(b"x-session-id")
    return raw.decode("latin-1")[:256] if raw else None
