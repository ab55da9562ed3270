"""Relaying an engine's SSE stream to the client, touching nothing it need not touch.

`SSESplitter` cuts the engine's byte stream into event payloads. `StreamRelay` is the ASGI response
that sends them on: each payload goes through the dialect's decoder and the client API's stream
writer (`engines.openai.StreamEncoder` for chat and completions), and the bytes go out as soon as
they are ready.

Ending a stream, in every case exactly once:
- the engine finished           → finish chunks, usage chunk if asked, `[DONE]` (the writer's
  closing events; `on_complete` runs first, e.g. to store a Responses answer);
- the engine failed or went idle → the writer's error events (OpenAI: one error event, `[DONE]`);
- the client went away          → the upstream response is closed at once (the engine sees the
  connection drop and stops generating); nothing more is sent.
Then the context's finalizers run (accounting), whatever happened.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from engines.base import StreamDecoder, StreamWriter, Usage
from engines.errors import ApiError
from gateway.core.context import RequestContext
from gateway.core.disconnect import ClientWatch
from gateway.core.responses import COALESCE, SSE, Headers, Receive, Send
from gateway.upstream.lease import Lease
from gateway.upstream.transport import UpstreamError, UpstreamResponse

_DONE = b"[DONE]"
_SILENT = "The model went silent mid-stream. You can retry your request."


class SSESplitter:
    """Splits a byte stream into the payloads of its `data:` events (`[DONE]` sets `done`)."""

    __slots__ = ("_buf", "done")

    def __init__(self) -> None:
        self._buf = b""
        self.done = False

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        out: list[bytes] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            event = buf[start:end]
            start = end + 2
            for line in event.split(b"\n") if b"\n" in event else (event,):
                if line.startswith(b"data:"):
                    payload = line[5:].strip()
                    if payload == _DONE:
                        self.done = True
                    elif payload:
                        out.append(payload)
        self._buf = buf[start:]
        return out


def mid_stream_error(
    message: str = "The model stopped answering mid-stream. You can retry your request.",
) -> ApiError:
    return ApiError(502, message, type="server_error")


class StreamRelay:
    """The streamed answer: sends `first` at once, then relays the rest of the engine's stream. When
    it ends, however it ends, `on_end` gets the context, the attempt's `lease` and whether the
    answer went out whole."""

    __slots__ = (
        "_chunks",
        "_complete",
        "_decoder",
        "_disconnected",
        "_encoder",
        "_events",
        "_first",
        "_idle_s",
        "_last",
        "_lease",
        "_on_complete",
        "_on_end",
        "_splitter",
        "_timed_out",
        "_timer",
        "_upstream",
        "ctx",
        "headers",
        "status",
    )

    def __init__(
        self,
        ctx: RequestContext,
        *,
        lease: Lease,
        upstream: UpstreamResponse,
        chunks: AsyncIterator[bytes],
        splitter: SSESplitter,
        decoder: StreamDecoder,
        encoder: StreamWriter,
        first: bytes,
        idle_s: float,
        headers: Headers,
        on_end: Callable[[RequestContext, Lease, bool], Awaitable[None]],
        on_complete: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.status = 200
        self.headers = headers
        headers.append((b"content-type", SSE))
        headers.append((b"cache-control", b"no-cache"))
        self._upstream = upstream
        self._chunks = chunks
        self._splitter = splitter
        self._decoder = decoder
        self._encoder = encoder
        self._first = first
        self._idle_s = idle_s
        self._lease = lease
        self._on_end = on_end
        self._on_complete = on_complete
        self._last = 0.0
        self._timed_out = False
        self._disconnected = False
        self._complete = False
        #: events relayed (the engines stream a token an event): what a cut stream is billed
        self._events = 0

    async def __call__(self, send: Send, receive: Receive) -> None:
        # Neither a client disconnect nor the idle watchdog cancels this task: both close the
        # upstream response, which wakes the pending read with an error at once and drops the
        # engine's connection (so it stops generating). The flags tell the relay why.
        loop = asyncio.get_running_loop()
        started_ns = time.time_ns() if self.ctx.trace is not None else 0
        watch = ClientWatch(self.ctx, self._client_left)
        self._last = loop.time()
        self._timer = loop.call_at(self._last + self._idle_s, self._check_idle, loop)
        ok = False
        try:
            await send(
                {"type": "http.response.start", "status": 200, "headers": self.headers, COALESCE: True}
            )
            if self._splitter.done:  # the whole answer came with the first read: one write
                ok = await self._finish(send, self._first)
            else:
                await send({"type": "http.response.body", "body": self._first, "more_body": True})
                ok = await self._relay(send, loop)
        except OSError:  # the client's socket is gone
            self._disconnected = True
        finally:
            if self._disconnected:
                self.ctx.error_kind = "client_disconnect"
            self._timer.cancel()
            watch.stop()
            self._upstream.close()
            if self.ctx.trace is not None:
                self._traced(started_ns)
            await self._on_end(self.ctx, self._lease, ok)

    async def _relay(self, send: Send, loop: asyncio.AbstractEventLoop) -> bool:
        splitter, decoder, encoder = self._splitter, self._decoder, self._encoder
        last = b""  # the events that came with `[DONE]` go out with the end of the stream
        try:
            async for chunk in self._chunks:
                self._last = loop.time()
                out = b""
                for payload in splitter.feed(chunk):
                    events = decoder.feed(payload)
                    self._events += len(events)
                    for ev in events:
                        if isinstance(ev, ApiError):
                            self.ctx.error_kind = "engine_error"
                            await self._end_with_error(send, ev, prefix=out)
                            return False
                    out += encoder.encode(events)
                if splitter.done:
                    last = out
                    break
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
        except UpstreamError:
            if self._disconnected:
                return False
            if self._timed_out:
                self.ctx.error_kind = "idle_timeout"
                await self._end_with_error(send, mid_stream_error(_SILENT))
            else:
                self.ctx.error_kind = "upstream_broken"
                await self._end_with_error(send, mid_stream_error())
            return False
        if self._disconnected:
            return False
        if not splitter.done:
            self.ctx.error_kind = "upstream_broken"
            await self._end_with_error(send, mid_stream_error())
            return False
        return await self._finish(send, last)

    async def _finish(self, send: Send, last: bytes) -> bool:
        """`last` (events not sent yet), the usage chunk if asked and `[DONE]`, in one body message."""
        self.ctx.usage = self._encoder.usage
        # uvicorn reports `http.disconnect` once a response is complete: from here on it is no
        # longer a client leaving.
        self._complete = True
        tail = last + self._encoder.finish()
        if self._on_complete is not None:
            await self._on_complete()
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        await self._drain_tail()
        return True

    async def _drain_tail(self) -> None:
        """Read the engine's last bytes after `[DONE]` (the chunked-body terminator usually follows in
        the next segment), so the connection goes back to the pool instead of being dropped. The client
        has its whole answer already; this only delays the accounting by a moment, at most 50 ms."""
        try:
            async with asyncio.timeout(0.05):
                async for _ in self._chunks:
                    pass
        except (TimeoutError, UpstreamError):
            pass

    async def _end_with_error(self, send: Send, err: ApiError, prefix: bytes = b"") -> None:
        """The engine failed, went silent or was cut mid-stream: the error events. Without the
        engine's usage, the request is billed its prompt estimate and the tokens relayed."""
        usage = self._encoder.usage
        if usage is None:
            features = self.ctx.extras.get("features")
            prompt = features.prompt_tokens if features is not None else 0
            usage = Usage(prompt_tokens=prompt, completion_tokens=self._events)
        self.ctx.usage = usage
        await send(
            {"type": "http.response.body", "body": prefix + self._encoder.error(err), "more_body": False}
        )

    def _traced(self, started_ns: int) -> None:
        trace = self.ctx.trace
        assert trace is not None
        trace.relay_span(started_ns, time.time_ns(), self.ctx.error_kind)
        trace.finished(self._encoder.finish_reasons)

    def _check_idle(self, loop: asyncio.AbstractEventLoop) -> None:
        due = self._last + self._idle_s
        if loop.time() < due:
            self._timer = loop.call_at(due, self._check_idle, loop)
            return
        self._timed_out = True
        self._upstream.close()

    def _client_left(self) -> None:
        if self._complete:
            return
        self._disconnected = True
        self._upstream.close()
