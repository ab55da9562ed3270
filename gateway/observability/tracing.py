"""OpenTelemetry traces of the request path (docs/tracing.md), exported over OTLP/HTTP.

    POST /v1/chat/completions          SERVER  the request: HTTP and GenAI attributes, the answer's usage
    ├── gateway.auth                   INTERNAL
    ├── gateway.admit                  INTERNAL
    ├── gateway.route                  INTERNAL gateway.pool, gateway.route (the reason), gateway.affinity
    ├── gateway.upstream               CLIENT   one per attempt: gateway.backend, status, error.type;
    │   └── (the engine's own spans)            its span id is the `traceparent` the engine receives
    └── gateway.relay                  INTERNAL streams: from the engine's first event to the end

`Tracing` is built only when `tracing.enabled` is true; with it off nothing here runs and the request
path is exactly the untraced one. On, each request gets a trace at arrival (`begin`): the
OpenTelemetry SDK's `TraceIdRatioBased` rule decides for a new trace, and a client's W3C
`traceparent` makes its trace the parent and its sampled flag the decision (the SDK's `ParentBased`
default), both applied inline so that every OpenTelemetry service samples the same traces. While the
request runs, spans are plain tuples appended to a list: no span objects, no context variables, no
locks. At the end (`end`) the request's spans are encoded to OTLP protobuf on the spot and queued as
bytes for `OtlpBatcher`, which POSTs batches from a task on the same event loop
(gateway/observability/otlp.py: why not a thread). An unsampled request records nothing but
still sends the engine a `traceparent` with the sampled flag off, so the engine does not start a
sampled trace of its own for it.

The stages are spanned by wrappers (`Tracing.wrap`) that exist only when tracing is on; the upstream
wing records its attempts and the relay through `gateway.core.trace.RequestTrace`.

Prompt text is never recorded unless `tracing.include_prompts` is true (then `gen_ai.input.messages`
holds the request's messages, or its prompt, as JSON, cut at 32,768 characters). Completions' text is
never recorded.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import orjson
from opentelemetry.trace import SpanContext, SpanKind, TraceState, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from engines.base import INPUT_ONLY
from engines.errors import ApiError
from gateway.core.context import RequestContext
from gateway.core.responses import Response
from gateway.observability.otlp import (
    EXPORT_INTERVAL_S,
    MAX_QUEUED,
    ChildSpan,
    OtlpBatcher,
    Scope,
    request_fields,
)
from gateway.observability.settings import TracingSettings

log = logging.getLogger("gateway.tracing")

_OPERATION = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings"}
#: request fields copied onto the request span (GenAI semantic conventions), when numbers
_REQUEST_PARAMS = (
    ("max_tokens", "gen_ai.request.max_tokens"),
    ("max_completion_tokens", "gen_ai.request.max_tokens"),
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
)
_MAX_PROMPT_CHARS = 32_768
_NO_STATE = TraceState()
#: the low 64 bits of a trace id, which `TraceIdRatioBased` compares with its bound
_TRACE_ID_LOW = (1 << 64) - 1
#: the stages that get a span, and the span's name
_STAGE_SPANS = {"authenticate": "gateway.auth", "admit": "gateway.admit", "route": "gateway.route"}
#: the engine's HTTP status for the error kinds the proxy reports that do not name it (the others:
#: `status_503`, `engine_400`; none at all for `connect`, `timeout`, a client gone before the answer)
_KIND_STATUS = {
    "misconfigured": 404,
    "engine_error": 200,  # an error event in a 200 stream
    "engine_bad_response": 200,
    "upstream_broken": 200,  # a stream cut after its first event
    "idle_timeout": 200,
}


class Stage(Protocol):
    """A pipeline stage (gateway/pipeline.py `Stage`)."""

    name: str

    async def __call__(self, ctx: RequestContext) -> Response | None: ...


def _engine_status(kind: str | None) -> int | None:
    if kind is None:
        return 200
    if kind.startswith(("status_", "engine_")) and kind[7:].isdigit():
        return int(kind[7:])
    return _KIND_STATUS.get(kind)


class Unsampled:
    """The trace of a request the sampler left out: records nothing, propagates `traceparent` (00)."""

    __slots__ = ("_headers",)
    recording = False

    def __init__(self, headers: dict[str, str]) -> None:
        self._headers = headers

    def attempt_start(self, pool: str, backend: str, dialect: str) -> Mapping[str, str]:
        return self._headers

    def attempt_end(self, error_kind: str | None) -> None:
        pass

    def relay_span(self, start_ns: int, end_ns: int, error_kind: str | None) -> None:
        pass

    def finished(self, reasons: Sequence[str]) -> None:
        pass


class Trace:
    """A sampled request's spans, recorded as tuples until `Tracing.end`."""

    __slots__ = (
        "_attempt",
        "_prefix",
        "parent",
        "reasons",
        "span_id",
        "spans",
        "start_ns",
        "state",
        "trace_id",
    )
    recording = True

    def __init__(self, trace_id: int, span_id: int, parent: SpanContext | None, state: str | None) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent = parent
        self.start_ns = time.time_ns()
        self.spans: list[ChildSpan] = []
        self.reasons: tuple[str, ...] = ()
        self._prefix = f"00-{trace_id:032x}-"
        #: the client's `tracestate`, passed on to the engine unchanged
        self.state = state
        self._attempt: tuple[int, int, dict[str, Any]] | None = None

    def span(
        self, name: str, start_ns: int, end_ns: int, attributes: dict[str, Any] | None, error: str | None
    ) -> None:
        """A finished child of the request span."""
        sid = random.getrandbits(64) or 1
        self.spans.append((name, sid, SpanKind.INTERNAL, start_ns, end_ns, attributes, error is not None))

    def attempt_start(self, pool: str, backend: str, dialect: str) -> Mapping[str, str]:
        self.attempt_end("abandoned")
        sid = random.getrandbits(64) or 1
        attributes = {"gateway.pool": pool, "gateway.backend": backend}
        self._attempt = (sid, time.time_ns(), attributes)
        headers = {"traceparent": f"{self._prefix}{sid:016x}-01"}
        if self.state:
            headers["tracestate"] = self.state
        return headers

    def attempt_end(self, error_kind: str | None) -> None:
        if self._attempt is None:
            return
        sid, start, attributes = self._attempt
        self._attempt = None
        status = _engine_status(error_kind)
        if status is not None:
            attributes["http.response.status_code"] = status
        if error_kind is not None:
            attributes["error.type"] = error_kind
        end = time.time_ns()
        self.spans.append(
            ("gateway.upstream", sid, SpanKind.CLIENT, start, end, attributes, error_kind is not None)
        )

    def relay_span(self, start_ns: int, end_ns: int, error_kind: str | None) -> None:
        attributes = {"error.type": error_kind} if error_kind else None
        self.span("gateway.relay", start_ns, end_ns, attributes, error_kind)

    def finished(self, reasons: Sequence[str]) -> None:
        self.reasons = tuple(reasons)


class _Spanned:
    """A stage with a span around it, for sampled requests."""

    __slots__ = ("_attributes", "_span", "_stage", "name")

    def __init__(
        self, stage: Stage, span: str, attributes: Callable[[RequestContext], dict[str, Any]] | None
    ) -> None:
        self.name = stage.name
        self._stage = stage
        self._span = span
        self._attributes = attributes

    async def __call__(self, ctx: RequestContext) -> Response | None:
        trace = ctx.trace
        if type(trace) is not Trace:
            return await self._stage(ctx)
        start = time.time_ns()
        try:
            response = await self._stage(ctx)
        except ApiError as err:
            kind = ctx.error_kind or f"status_{err.status}"
            trace.span(self._span, start, time.time_ns(), {"error.type": kind}, kind)
            raise
        attributes = self._attributes(ctx) if self._attributes is not None else None
        error = None if response is None or response.status < 400 else f"status_{response.status}"
        if error is not None:
            attributes = {**(attributes or {}), "error.type": error}
        trace.span(self._span, start, time.time_ns(), attributes, error)
        return response


def _route_attributes(ctx: RequestContext) -> dict[str, Any]:
    return {
        "gateway.pool": ctx.pool.name if ctx.pool is not None else "",
        "gateway.route": ctx.route_reason,
        "gateway.affinity": ctx.affinity,
    }


class Tracing:
    """The tracer of one gateway process: sampling at arrival, spans at the end, export in batches."""

    def __init__(
        self,
        settings: TracingSettings,
        version: str,
        *,
        max_queued: int = MAX_QUEUED,
        interval_s: float = EXPORT_INTERVAL_S,
    ) -> None:
        self.settings = settings
        self._max_queued = max_queued
        self._interval_s = interval_s
        #: a new trace is sampled when the low 64 bits of its id are below this (TraceIdRatioBased)
        self._bound = round(settings.sample_ratio * (_TRACE_ID_LOW + 1))
        self._propagator = TraceContextTextMapPropagator()
        self._resource = {
            "service.name": settings.service_name,
            "service.version": version,
            "telemetry.sdk.language": "python",
            "telemetry.sdk.name": "opentelemetry",
        }
        self._scope = Scope("llm-gateway", version)
        self._include_prompts = settings.include_prompts
        #: the export, or None before `start`
        self._batcher: OtlpBatcher | None = None

    # -- lifecycle (the gateway's start-up and shutdown, in the worker process's event loop) --------
    def start(self) -> None:
        """Start exporting; call inside the running event loop."""
        s = self.settings
        self._batcher = OtlpBatcher(
            s.endpoint,
            s.headers,
            resource=self._resource,
            scope=self._scope,
            interval_s=self._interval_s,
            max_queued=self._max_queued,
            batch=min(512, self._max_queued),
        )
        self._batcher.start()
        log.info(
            "tracing on: OTLP/HTTP to %s, sampling %g of requests without a sampled parent (pid %d)",
            s.endpoint,
            s.sample_ratio,
            os.getpid(),
        )

    async def aclose(self) -> None:
        """Export what is queued (each export bounded by `timeout_s`), then stop."""
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            await batcher.aclose()

    async def flush(self) -> None:
        """Export everything queued now."""
        if self._batcher is not None:
            await self._batcher.flush()

    @property
    def batcher(self) -> OtlpBatcher | None:
        """The exporter (its counters), once started."""
        return self._batcher

    # -- the request path -------------------------------------------------------------------------
    def wrap(self, stages: Sequence[Stage]) -> list[Stage]:
        """`stages` with a span around those the trace shows (auth, admit, route)."""
        out: list[Stage] = []
        for stage in stages:
            span = _STAGE_SPANS.get(stage.name)
            if span is None or isinstance(stage, _Spanned):
                out.append(stage)
            else:
                out.append(_Spanned(stage, span, _route_attributes if stage.name == "route" else None))
        return out

    def begin(self, headers: Mapping[bytes, bytes]) -> Trace | Unsampled:
        """The trace of a request that just arrived (`headers`: its request headers, lower-case)."""
        parent: SpanContext | None = None
        raw = headers.get(b"traceparent")
        state: str | None = None
        if raw is not None:
            carrier = {"traceparent": raw.decode("latin-1")}
            raw_state = headers.get(b"tracestate")
            if raw_state is not None:
                carrier["tracestate"] = state = raw_state.decode("latin-1")
            found = get_current_span(self._propagator.extract(carrier)).get_span_context()
            if found.is_valid:
                parent = found
            else:
                state = None
        if parent is not None:  # parent-based: the client's sampled flag decides
            trace_id = parent.trace_id
            sampled = parent.trace_flags.sampled
        else:
            trace_id = random.getrandbits(128) or 1
            sampled = trace_id & _TRACE_ID_LOW < self._bound
        span_id = random.getrandbits(64) or 1
        if sampled:
            return Trace(trace_id, span_id, parent, state)
        out = {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-00"}
        if state:
            out["tracestate"] = state
        return Unsampled(out)

    def end(self, ctx: RequestContext, method: str, path: str) -> None:
        """The request is over (answer sent or abandoned, finalizers run): queue its spans for export."""
        trace = ctx.trace
        if type(trace) is not Trace:
            return
        trace.attempt_end(ctx.error_kind or "abandoned")
        state = TraceState.from_header([trace.state]) if trace.state else _NO_STATE
        attributes = self._request_attributes(ctx, trace, method, path)
        batcher = self._batcher
        if batcher is None:
            return
        spans = trace.spans
        fields = request_fields(
            f"{method} {path}",
            trace.trace_id,
            trace.span_id,
            trace.parent,
            state,
            trace.start_ns,
            time.time_ns(),
            attributes,
            ctx.status >= 500,
            spans,
        )
        batcher.add(fields, 1 + len(spans))

    def _request_attributes(
        self, ctx: RequestContext, trace: Trace, method: str, path: str
    ) -> dict[str, Any]:
        body = ctx.body
        model = ctx.model.name if ctx.model is not None else body.get("model")
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "url.path": path,
            "http.response.status_code": ctx.status,
            "gateway.request_id": ctx.request_id,
            "gen_ai.operation.name": _OPERATION.get(ctx.endpoint, ctx.endpoint),
        }
        if isinstance(model, str):
            attributes["gen_ai.request.model"] = model
        for field, name in _REQUEST_PARAMS:
            value = body.get(field)
            if isinstance(value, int | float) and not isinstance(value, bool):
                attributes[name] = value
        pool = ctx.pool  # its name and the routing reason are on gateway.route, the attempts' on theirs
        if pool is not None:
            attributes["gen_ai.system"] = pool.dialect.name
        if ctx.stream:
            attributes["gateway.stream"] = True
        usage = ctx.usage
        if usage is not None and ctx.status == 200:
            if isinstance(model, str):
                attributes["gen_ai.response.model"] = model
            attributes["gen_ai.usage.input_tokens"] = usage.prompt_tokens
            if ctx.endpoint not in INPUT_ONLY:  # an embedding or a score has no output tokens
                attributes["gen_ai.usage.output_tokens"] = usage.completion_tokens
            if usage.cached_tokens is not None:
                attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cached_tokens
        if trace.reasons:
            attributes["gen_ai.response.finish_reasons"] = trace.reasons
        if ctx.error_kind is not None:
            attributes["error.type"] = ctx.error_kind
        if self._include_prompts:
            prompt = body.get("messages", body.get("prompt", body.get("input")))
            if prompt is not None:
                text = orjson.dumps(prompt).decode()
                attributes["gen_ai.input.messages"] = text[:_MAX_PROMPT_CHARS]
        return attributes
