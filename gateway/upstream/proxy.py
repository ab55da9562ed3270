"""The proxy stage: adapt the request, call the engine, adapt the answer — with failover.

Failover happens only before the first byte reaches the client: a refused or reset connection, a
timeout before the engine's first event, or an engine status that says "try elsewhere" (429, 502,
503, 504, and 404: the backend does not know its configured served-model name) sends the request to
another backend — of the same pool while it has one left, then of the next eligible pool serving the
model (`RouteStage.reroute`; the request is rebuilt for that pool's dialect and served name) — up to
`retries.max_attempts` attempts and within the retry budget. For a stream, the client's `200` is sent
only once the engine's first event is in, so a backend that accepts and then stalls is also failed
over.

Passive health: a refused or reset connection takes the backend out of routing at once (`healthy`
False, as a failed probe would); the active prober brings it back when it answers again. An engine's
404 for the served name is the operator's misconfiguration, not the client's unknown model: 502
`server_error` (no backend detail) to the client, a log line naming the backend and the served name,
and `gateway_upstream_misconfigured_total{pool,backend}`.

The answer is written in the client's API: OpenAI's chat or completions by `engines.openai`, any
other API by the `ctx.answer` its intake stage set (gateway/core/answer.py); errors in the shape
`ctx.render_error` writes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from engines.base import StreamDecoder, StreamWriter
from engines.errors import ApiError, overloaded, upstream_timeout
from engines.openai import StreamEncoder, encode_completion, new_completion_id
from gateway.core.context import RequestContext
from gateway.core.disconnect import ClientWatch
from gateway.core.fleet import Backend
from gateway.core.responses import JSON, BytesResponse, Response, error_response
from gateway.upstream.lease import Lease, LeaseWatch, OnFailure
from gateway.upstream.relay import SSESplitter, StreamRelay
from gateway.upstream.retry import RetryBudget
from gateway.upstream.settings import UpstreamSettings
from gateway.upstream.transport import JSON_HEADERS, Transport, UpstreamError, UpstreamResponse

log = logging.getLogger("gateway.upstream")

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
#: attempt failures that mean the backend itself is gone (refused, reset or closed before answering)
_GONE = frozenset({"connect", "error"})
#: seconds between two log lines about one misconfigured backend
_MISCONFIGURED_LOG_S = 30.0
_BACKEND_FAULTS_MID_STREAM = frozenset({"upstream_broken", "idle_timeout"})
UpstreamHeaders = dict[str, str]

#: picks another backend for a retry, never one in `exclude`; raises ApiError when none is left
Reroute = Callable[[RequestContext, set[str]], None]
#: switches the request to its model's next fallback model and a backend of it; False when none is left
Fallback = Callable[[RequestContext], bool]


class _Retry(Exception):
    """This attempt failed in a way another backend may not."""

    def __init__(self, kind: str, error: ApiError) -> None:
        self.kind = kind
        self.error = error


class ProxyStage:
    name = "proxy"

    def __init__(
        self,
        transport: Transport,
        settings: UpstreamSettings,
        reroute: Reroute,
        on_upstream_error: OnFailure,
        fallback: Fallback | None = None,
        lease_watch: LeaseWatch | None = None,
    ) -> None:
        self._fallback = fallback
        #: hears of every attempt's opening, first token and end (the flow queue), or None
        self._lease_watch = lease_watch
        self._transport = transport
        self._timeouts = settings.timeouts
        self._max_attempts = settings.retries.max_attempts
        self._budget = RetryBudget()
        self._reroute = reroute
        self._on_upstream_error = on_upstream_error
        self._misconfigured_logged: dict[str, float] = {}

    async def __call__(self, ctx: RequestContext) -> Response | None:
        # Until the answer starts, nothing reads the client's connection: a watcher cancels the
        # upstream wait when the client goes away, so the engine's request is dropped at once (a
        # non-streamed generation or a stream still waiting for its first token), not run to its end.
        task = asyncio.current_task()
        assert task is not None
        watch = _DisconnectWatch(ctx, task)
        try:
            return await self._attempts(ctx)
        except asyncio.CancelledError:
            if not watch.fired:
                raise
            task.uncancel()
            ctx.error_kind = "client_disconnect"
            return error_response(_client_gone(), ctx.response_headers, ctx.render_error)
        finally:
            watch.stop()

    async def _attempts(self, ctx: RequestContext) -> Response:
        assert ctx.pool is not None and ctx.backend is not None and ctx.model is not None
        tried: set[str] = set()
        self._budget.on_request(time.monotonic())
        last_error: ApiError = overloaded()
        first = 0  # attempts made before the current model's (a fallback model starts afresh)
        built_for = None
        upstream_body = b""
        path = ""
        while True:
            pool = ctx.pool
            if pool is not built_for:  # the first attempt, or a failover to another pool
                upstream_body = pool.dialect.build_request(
                    ctx.endpoint, ctx.body, pool.models[ctx.model.name]
                )
                path = pool.dialect.paths[ctx.endpoint]
                built_for = pool
            backend = ctx.backend
            tried.add(backend.name)
            if not backend.circuit.allow(time.monotonic()):
                # Half-open and its one trial request is already out: take another backend.
                try:
                    self._reroute(ctx, tried)
                except ApiError:
                    ctx.error_kind = "no_backend"
                    raise last_error from None
                continue
            ctx.attempts += 1
            lease = Lease(backend, ctx.prefill, self._on_upstream_error, self._lease_watch)
            headers = None
            if ctx.upstream_type is not None:  # not JSON: a multipart audio upload
                headers = {**JSON_HEADERS, "content-type": ctx.upstream_type}
            if ctx.trace is not None:  # tracing on: this attempt's span, its traceparent to the engine
                headers = {
                    **(headers or JSON_HEADERS),
                    **ctx.trace.attempt_start(pool.name, backend.name, pool.dialect.name),
                }
            try:
                if ctx.stream:
                    return await self._stream(ctx, lease, backend.url + path, upstream_body, headers)
                return await self._complete(ctx, lease, backend.url + path, upstream_body, headers)
            except _Retry as retry:
                if ctx.trace is not None:
                    ctx.trace.attempt_end(retry.kind)
                lease.failed(retry.kind)
                lease.release()
                if retry.kind in _GONE:
                    _mark_gone(backend, retry.kind)
                last_error = retry.error
            except BaseException:
                lease.release()
                raise
            exhausted = ctx.attempts - first >= self._max_attempts or not self._budget.try_spend(
                time.monotonic()
            )
            if not exhausted:
                try:
                    self._reroute(ctx, tried)
                    continue
                except ApiError:
                    pass
            # this model's backends are spent: its fallback model, with attempts of its own
            if self._fallback is None or not self._fallback(ctx):
                ctx.error_kind = "upstream_exhausted"
                raise last_error
            tried.clear()
            first = ctx.attempts
            built_for = None

    # -- non-streamed -----------------------------------------------------------------------------
    async def _complete(
        self, ctx: RequestContext, lease: Lease, url: str, body: bytes, headers: UpstreamHeaders | None
    ) -> Response:
        assert ctx.pool is not None and ctx.model is not None
        try:
            async with asyncio.timeout(self._timeouts.total_s):
                resp = await self._transport.request("POST", url, body, headers)
                try:
                    data = await resp.read()
                finally:
                    resp.close()
        except TimeoutError:
            # The engine may have generated for a long time: not retried.
            lease.failed("timeout")
            ctx.error_kind = "upstream_timeout"
            await self._end(ctx, lease, False)
            return error_response(upstream_timeout(), ctx.response_headers, ctx.render_error)
        except UpstreamError as exc:
            raise _Retry(exc.kind, overloaded()) from None
        if resp.status != 200:
            return await self._engine_error(ctx, lease, resp.status, data)
        dialect = ctx.pool.dialect
        lease.succeeded()
        answer = ctx.answer
        try:
            if answer is not None:
                out, ctx.usage = answer.body(dialect, data)
                if ctx.trace is not None:
                    ctx.trace.finished(answer.finish_reasons)
            else:
                completion = dialect.decode_response(ctx.endpoint, data)
                ctx.usage = completion.usage
                if ctx.trace is not None:
                    ctx.trace.finished([c.finish_reason for c in completion.choices if c.finish_reason])
                out = encode_completion(
                    completion,
                    endpoint=ctx.endpoint,
                    id=new_completion_id(ctx.endpoint),
                    created=int(time.time()),
                    model=ctx.model.name,
                    tool_choice_named=_named_tool_choice(ctx),
                )
        except ApiError as err:
            ctx.error_kind = "engine_bad_response"
            await self._end(ctx, lease, False)
            return error_response(err, ctx.response_headers, ctx.render_error)
        content_type = JSON
        if answer is not None:
            await answer.complete()
            content_type = answer.content_type
        await self._end(ctx, lease, True)
        return BytesResponse(200, out, ctx.response_headers, content_type)

    # -- streamed ---------------------------------------------------------------------------------
    async def _stream(
        self, ctx: RequestContext, lease: Lease, url: str, body: bytes, headers: UpstreamHeaders | None
    ) -> Response:
        assert ctx.pool is not None and ctx.model is not None
        dialect = ctx.pool.dialect
        answer = ctx.answer
        encoder: StreamWriter
        if answer is not None:
            encoder = answer.stream()
        else:
            encoder = StreamEncoder(
                endpoint=ctx.endpoint,
                id=new_completion_id(ctx.endpoint),
                created=int(time.time()),
                model=ctx.model.name,
                include_usage=ctx.include_usage,
                tool_choice_named=_named_tool_choice(ctx),
                continuous_usage=ctx.include_usage and _continuous_usage(ctx),
            )
        decoder = dialect.stream_decoder(ctx.endpoint)
        splitter = SSESplitter()
        resp: UpstreamResponse | None = None
        try:
            async with asyncio.timeout(self._timeouts.first_byte_s):
                resp = await self._transport.request("POST", url, body, headers)
                if resp.status != 200:
                    data = await resp.read()
                    resp.close()
                    return await self._engine_error(ctx, lease, resp.status, data)
                chunks = resp.chunks()
                first = await self._first_events(chunks, splitter, decoder, encoder)
        except TimeoutError:
            if resp is not None:
                resp.close()
            raise _Retry("timeout", upstream_timeout()) from None
        except UpstreamError as exc:
            if resp is not None:
                resp.close()
            raise _Retry(exc.kind, overloaded()) from None
        except ApiError as err:
            # The engine's first event was an error: nothing went out yet, so answer it plainly.
            assert resp is not None
            resp.close()
            lease.succeeded()
            ctx.error_kind = "engine_error"
            await self._end(ctx, lease, False)
            return error_response(err, ctx.response_headers, ctx.render_error)
        # The backend's verdict comes when the stream ends (`_end`): a stream cut midway is a failure.
        ctx.first_token_at = time.perf_counter()
        lease.prefilled()
        return StreamRelay(
            ctx,
            lease=lease,
            upstream=resp,
            chunks=chunks,
            splitter=splitter,
            decoder=decoder,
            encoder=encoder,
            first=first,
            idle_s=self._timeouts.idle_s,
            headers=ctx.response_headers,
            on_end=self._end,
            on_complete=answer.complete if answer is not None else None,
        )

    async def _first_events(
        self,
        chunks: AsyncIterator[bytes],
        splitter: SSESplitter,
        decoder: StreamDecoder,
        encoder: StreamWriter,
    ) -> bytes:
        """Read until the engine's first event has produced output bytes (raises ApiError on an error event)."""
        feed = decoder.feed
        async for chunk in chunks:
            out = b""
            for payload in splitter.feed(chunk):
                events = feed(payload)
                for ev in events:
                    if isinstance(ev, ApiError):
                        raise ev
                out += encoder.encode(events)
            if out or splitter.done:
                return out
        raise UpstreamError("upstream closed before its first event")

    async def _engine_error(self, ctx: RequestContext, lease: Lease, status: int, data: bytes) -> Response:
        """The engine answered an error before any byte went out: fail over, or answer it re-shaped."""
        assert ctx.pool is not None and ctx.model is not None
        if status == 404:
            served = ctx.pool.models[ctx.model.name]
            self._log_misconfigured(
                lease.backend,
                f"answered 404 for its configured served model name {served!r}: the engine serves it under "
                "another name, or the backend URL is wrong (pools[].models, --served-model-name)",
            )
            raise _Retry("misconfigured", misconfigured())
        if status in (401, 403):
            self._log_misconfigured(
                lease.backend,
                f"answered {status}: it refuses the gateway's key (pools[].api_key_env or api_key_file must hold "
                "the key the engine was started with, --api-key)",
            )
            raise _Retry("engine_auth", engine_auth_refused())
        err = ctx.pool.dialect.decode_error(status, data, ctx.endpoint)
        if status in RETRYABLE_STATUS:
            raise _Retry(f"status_{status}", err)
        if status >= 500:
            lease.failed(f"status_{status}")
        else:
            lease.succeeded()  # a 4xx is the request's fault, not the backend's
        ctx.error_kind = f"engine_{status}"
        await self._end(ctx, lease, False)
        return error_response(err, ctx.response_headers, ctx.render_error)

    def _log_misconfigured(self, backend: Backend, what: str) -> None:
        """A line for the operator about a backend the config does not match (rate-limited)."""
        now = time.monotonic()
        if now - self._misconfigured_logged.get(backend.name, -_MISCONFIGURED_LOG_S) < _MISCONFIGURED_LOG_S:
            return
        self._misconfigured_logged[backend.name] = now
        log.error("backend %s (pool %s) %s; clients get 502", backend.name, backend.pool, what)

    async def _end(self, ctx: RequestContext, lease: Lease, ok: bool) -> None:
        """The engine's part of the request is over, answered in full (`ok`) or not: the attempt's
        span ends and its lease is released, with the circuit's verdict if it has none yet."""
        if ctx.trace is not None:
            ctx.trace.attempt_end(ctx.error_kind)
        if ok:
            lease.succeeded()
        elif ctx.error_kind in _BACKEND_FAULTS_MID_STREAM:
            # A stream the engine broke or abandoned after its first byte counts against it too, or
            # a backend that cuts every stream would keep drawing its share of traffic.
            lease.failed(ctx.error_kind or "upstream_broken")
        lease.release()


class _DisconnectWatch(ClientWatch):
    """Cancels `task` once, when the client disconnects, while `stop()` has not been called."""

    __slots__ = ("_active", "_target", "fired")

    def __init__(self, ctx: RequestContext, task: asyncio.Task[object]) -> None:
        self._target = task
        self._active = True
        self.fired = False
        super().__init__(ctx, self._fire)

    def _fire(self) -> None:
        if self._active:
            self.fired = True
            self._target.cancel()

    def stop(self) -> None:
        self._active = False
        super().stop()


def _mark_gone(backend: Backend, kind: str) -> None:
    """Passive health: a backend that refused or reset the connection is out of routing at once."""
    if backend.healthy is not False:
        backend.healthy = False
        log.warning(
            "backend %s (pool %s) is now unhealthy: %s; the health probe brings it back",
            backend.name,
            backend.pool,
            "connection refused or closed before answering" if kind == "connect" else "connection reset",
        )


def misconfigured() -> ApiError:
    """The client's answer when the engine does not know its configured model name (the operator's
    config is wrong, not the client's request): a 502 naming no backend."""
    return ApiError(
        502,
        "The gateway's upstream server is misconfigured for this model. Please contact the gateway's operator.",
        type="server_error",
    )


def engine_auth_refused() -> ApiError:
    """The client's answer when the engine refuses the gateway's key (the operator's error)."""
    return ApiError(
        502,
        "The gateway's upstream server refused the gateway's credentials. Please contact the gateway's operator.",
        type="server_error",
        code="upstream_auth",
    )


def _client_gone() -> ApiError:
    # Never seen by the client (it has gone); 499 is the status access logs use for this case.
    return ApiError(499, "The client closed the connection before the answer started.")


def _continuous_usage(ctx: RequestContext) -> bool:
    options = ctx.body.get("stream_options")
    return isinstance(options, dict) and options.get("continuous_usage_stats") is True


def _named_tool_choice(ctx: RequestContext) -> bool:
    return isinstance(ctx.body.get("tool_choice"), dict)
