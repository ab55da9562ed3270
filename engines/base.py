"""The one interface every engine dialect implements, and the engine-neutral events it produces.

The gateway never branches on the engine. It hands a validated OpenAI request to a `Dialect`, which
writes the engine's request; the engine's answer comes back through the same `Dialect`, decoded into
the neutral types below; `engines.openai` encodes those into OpenAI's exact wire shapes. Because a
single encoder writes every byte a client sees, a client cannot tell which engine answered.

    client JSON ──► Dialect.build_request ──► engine
    engine JSON ──► Dialect.decode_response ──► Completion ──► openai.encode_completion ──► client
    engine SSE  ──► StreamDecoder.feed      ──► [Delta | Usage | ApiError] ──► openai.StreamEncoder

The other client APIs write the same neutral events in their own shapes (a `StreamWriter` each:
`engines.responses`, `engines.anthropic`; embeddings: `Dialect.decode_embeddings` →
`engines.embeddings`), so every API answers alike whichever engine answered.

Contracts:
- Decoders never raise on engine output they do not understand: they return an `ApiError` event (or
  raise `ApiError` from `decode_response`) with a generic upstream message — never the engine's
  address or a stack trace.
- `Usage` is always known at the end of a stream: the request side always asks the engine for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from engines.errors import ApiError

#: the engine endpoint a request goes to (the client's API may differ: `gateway.core.context.Api`)
Endpoint = Literal[
    "chat",
    "completions",
    "embeddings",
    "tokenize",
    "detokenize",
    "rerank",
    "score",
    "transcriptions",
    "translations",
]
#: the endpoints that generate no tokens: their cost is their input alone
INPUT_ONLY: frozenset[Endpoint] = frozenset({"embeddings", "tokenize", "detokenize", "rerank", "score"})
FinishReason = Literal["stop", "length", "tool_calls", "content_filter"]


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class ToolCallDelta:
    """One piece of a streamed tool call. `id` and `name` are set on a call's first piece only
    (decoders drop the repeats some engines send); `arguments` is a fragment to concatenate."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class Delta:
    """One choice's increment in a stream. All fields optional; `finish_reason` set on the last."""

    index: int = 0
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
    finish_reason: str | None = None
    logprobs: Any = None
    #: the stop string that ended the choice, when the engine says which (finish_reason "stop")
    stop_sequence: str | None = None


StreamEvent = Delta | Usage | ApiError


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class Choice:
    """One finished choice. For the completions endpoint `content` holds the text."""

    index: int
    content: str | None
    finish_reason: str | None
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None
    logprobs: Any = None
    #: the stop string that ended the choice, when the engine says which (finish_reason "stop")
    stop_sequence: str | None = None


@dataclass(slots=True)
class Completion:
    choices: list[Choice]
    usage: Usage = field(default_factory=Usage)


@dataclass(slots=True)
class Embeddings:
    """An embeddings answer: one vector per input, in input order, each either floats or the
    base64 string of its little-endian float32 values (as the engine sent it)."""

    vectors: list[list[float] | str]
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What an engine reports about itself on `/metrics` (None where it does not say)."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    #: vLLM: lifetime hits/queries from its counters; SGLang: its gauge (last prefill batch).
    prefix_cache_hit_rate: float | None = None
    #: vLLM's raw counters (tokens), so a scraper can compute a windowed rate by differencing.
    prefix_cache_hits: float | None = None
    prefix_cache_queries: float | None = None


class StreamWriter(Protocol):
    """Writes one client stream from neutral events, in the client's API (`engines.openai.StreamEncoder`
    for chat and completions; `engines.responses`, `engines.anthropic` for the others). One per
    response; after `error()` or `finish()` the stream is over."""

    #: the last usage the engine reported (the gateway bills from it)
    usage: Usage | None

    @property
    def finish_reasons(self) -> tuple[str, ...]:
        """The engine's finish reason of each choice that has one so far, in choice order (traces'
        `gen_ai.response.finish_reasons`: the engine's words, `stop`, `length`, `tool_calls`…)."""
        ...

    def encode(self, events: list[StreamEvent]) -> bytes:
        """Zero or more complete SSE events for `events` (an `ApiError` among them ends the stream)."""
        ...

    def finish(self) -> bytes:
        """The stream's closing events, after the engine's last event."""
        ...

    def error(self, err: ApiError) -> bytes:
        """The events that end the stream with `err`."""
        ...


class StreamDecoder(Protocol):
    def feed(self, data: bytes) -> list[StreamEvent]:
        """Decode the payload of one SSE `data:` event (without the `data: ` prefix, not `[DONE]`)."""
        ...


class Dialect(Protocol):
    """An engine's wire dialect. Implementations are stateless and shared by all requests."""

    name: str
    #: the engine's path of each endpoint it serves (an endpoint missing here is not served)
    paths: dict[Endpoint, str]
    #: path probed by active health checks; 200 means healthy.
    health_path: str
    #: path of the engine's Prometheus metrics.
    metrics_path: str

    def build_request(self, endpoint: Endpoint, body: dict[str, Any], served_model: str) -> bytes:
        """The engine's request body (JSON bytes) for a validated OpenAI request `body`.

        Always asks the engine for usage when streaming; maps the model to `served_model`; drops or
        translates what this engine would reject or silently ignore (documented per dialect);
        raises `ApiError` (400, `param` set) for what cannot be honoured. Does not mutate `body`.
        """
        ...

    def decode_response(self, endpoint: Endpoint, body: bytes) -> Completion:
        """A non-streamed 200 body → neutral `Completion`."""
        ...

    def stream_decoder(self, endpoint: Endpoint) -> StreamDecoder:
        """A fresh decoder for one streamed response."""
        ...

    def decode_embeddings(self, body: bytes) -> Embeddings:
        """A 200 body of the engine's `/v1/embeddings` → neutral `Embeddings` (raises `ApiError`)."""
        ...

    def decode_error(self, status: int, body: bytes, endpoint: Endpoint = "chat") -> ApiError:
        """A non-200 engine answer → OpenAI's error (status, type, code, param, message).

        `endpoint` picks the `param` of a context-length error (`messages` or `prompt`). Never raises.
        """
        ...

    def parse_metrics(self, text: str) -> EngineLoad:
        """The engine's Prometheus text → load figures used for routing."""
        ...
