"""OTLP/HTTP span export: the gateway's compact protobuf encoder and the batcher that POSTs it.

`request_fields(...)` writes a request's span and its children (plain tuples, `ChildSpan`) straight
to protobuf wire bytes, and `envelope` wraps the fields of many requests into one
`ExportTraceServiceRequest` (opentelemetry-proto's
`opentelemetry/proto/collector/trace/v1/trace_service.proto`). The OpenTelemetry SDK's encoder builds
a tree of protobuf message objects first and costs about 14 µs per span on this project's machine;
this one costs 1-3 µs, which matters because a traced request makes five or six spans and all of it
runs in the gateway's process (`python -m bench.tracing`). It encodes what the gateway's spans hold —
names, kinds, ids, times, attributes of str, bool, int, float, bytes and sequences of them, status,
flags — and nothing else (no events, no links: the gateway makes none). The tests decode its output
with the official `opentelemetry-proto` messages and compare it with the SDK encoder's, field for
field.

A sampled request's spans are encoded at its end, on the event loop, and `OtlpBatcher` POSTs them in
batches with httpx from a task on the same loop: no thread, no span objects, nothing but bytes kept
between a request's end and its export.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import httpx
from opentelemetry.trace import SpanContext, SpanKind, TraceState

log = logging.getLogger("gateway.tracing")

#: protobuf's SpanKind numbers (the SDK's enum starts at INTERNAL = 0)
_KIND = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
_HAS_IS_REMOTE = 0x100  # SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = 0x200  # SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_FIXED64 = struct.Struct("<Q")
_FIXED32 = struct.Struct("<I")
_DOUBLE = struct.Struct("<d")
_SMALL = [bytes([i]) for i in range(128)]
#: seconds between exports (sooner once 512 requests wait): spans reach the collector within a
#: second, at one request to it a second per process
EXPORT_INTERVAL_S = 1.0
#: an export's timeout: a collector that has not taken a batch in 5 s is down or overloaded, and the
#: batch is dropped (requests are never affected)
EXPORT_TIMEOUT_S = 5.0
#: sampled requests whose spans wait for export at most (4-6 spans each): seconds of a busy
#: process's sampled traffic; past it the oldest are dropped, never blocking a request
MAX_QUEUED = 4096
#: a failed export is logged at most this often
_LOG_EVERY_S = 60.0
_STATUS_UNSET = b"\x7a\x00"
_STATUS_ERROR = b"\x7a\x02\x18\x02"
_LOCAL_PARENT_FLAGS = b"\x85\x01" + _FIXED32.pack(_HAS_IS_REMOTE)
_NAMES: dict[str, bytes] = {}
#: attribute keys' encoded `KeyValue.key` fields (the gateway uses a few dozen keys; bounded anyway)
_KEYS: dict[str, bytes] = {}
_MAX_KEYS = 4096
#: (tag, key, value) -> an attribute's encoded field, for string and tuple values (bounded)
_PAIRS: dict[tuple[bytes, str, Any], bytes] = {}
_MAX_PAIRS = 4096
#: attributes whose every value is new: never kept encoded
_UNCACHED = frozenset({"gateway.request_id", "gen_ai.input.messages"})

#: a child span of a request: (name, span id, kind, start ns, end ns, attributes, failed)
ChildSpan = tuple[str, int, SpanKind, int, int, dict[str, Any] | None, bool]


class Scope(NamedTuple):
    """The instrumentation scope the spans are reported under (OTLP's `InstrumentationScope`)."""

    name: str
    version: str = ""


def _long_varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


#: the varints of 0..2047 (lengths and small numbers: nearly every varint a span holds)
_VARINTS = [_long_varint(i) for i in range(2048)]


def _varint(n: int) -> bytes:
    return _VARINTS[n] if n < 2048 else _long_varint(n)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field (`tag` already holds the field number and wire type 2)."""
    return tag + _varint(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    """An `AnyValue` message's bytes."""
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        values = b"".join(_field(b"\x0a", _any_value(v)) for v in value)
        return _field(b"\x2a", values)
    raise TypeError(f"a span attribute of type {type(value).__name__} cannot be encoded")


def _pair(tag: bytes, key: str, value: Any) -> bytes:
    """One attribute: a `KeyValue` field under `tag`."""
    k = _KEYS.get(key)
    if k is None:
        k = _field(b"\x0a", key.encode())
        if len(_KEYS) < _MAX_KEYS:
            _KEYS[key] = k
    v: bytes
    if type(value) is str:
        raw = value.encode()
        v = b"\x0a" + _varint(len(raw)) + raw
    else:
        v = _any_value(value)
    kv = k + b"\x12" + _varint(len(v)) + v
    return tag + _varint(len(kv)) + kv


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """Repeated `KeyValue` under field `tag`. This is the encoder's hot loop: the fields of string
    and string-tuple values (pool, backend, route, model, finish reasons…: a few dozen on a gateway)
    are kept encoded, up to `_MAX_PAIRS`, except for the keys whose values are all different."""
    if not attributes:
        return b""
    out = []
    pairs, keys = _PAIRS, _KEYS
    for key, value in attributes.items():
        kind = type(value)
        if (
            kind is str or (kind is tuple and all(type(v) is str for v in value))
        ) and key not in _UNCACHED:  # (only strings: 1 == True and 0.0 == -0.0 as dict keys)
            cache_key = (tag, key, value)
            field = pairs.get(cache_key)
            if field is None:
                field = _pair(tag, key, value)
                if len(pairs) < _MAX_PAIRS:
                    pairs[cache_key] = field
            out.append(field)
        elif kind is int and 0 <= value < 128 and key in keys:
            kv = keys[key] + b"\x12\x02\x18" + _SMALL[value]
            out.append(tag + _varint(len(kv)) + kv)
        else:
            out.append(_pair(tag, key, value))
    return b"".join(out)


def _trace_state(state: TraceState | None) -> bytes:
    """`Span.trace_state` (field 3), or nothing."""
    if not state:
        return b""
    return _field(b"\x1a", ",".join(f"{k}={v}" for k, v in state.items()).encode())


def _name(name: str) -> bytes:
    """`Span.name` (field 5); the gateway's few span names are kept encoded (bounded anyway)."""
    encoded = _NAMES.get(name)
    if encoded is None:
        encoded = _field(b"\x2a", name.encode())
        if len(_NAMES) < _MAX_KEYS:
            _NAMES[name] = encoded
    return encoded


def request_fields(
    name: str,
    trace_id: int,
    span_id: int,
    parent: SpanContext | None,
    state: TraceState | None,
    start: int,
    end: int,
    attributes: Mapping[str, Any] | None,
    failed: bool,
    children: Sequence[ChildSpan],
) -> bytes:
    """A request's `SERVER` span and its children, each a `ScopeSpans.spans` field (`envelope` wraps
    the fields of many requests into one export request)."""
    tid, sid = trace_id.to_bytes(16, "big"), span_id.to_bytes(8, "big")
    encoded_state = _trace_state(state)
    flags = _HAS_IS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote else 0)
    body = b"".join(
        (
            b"\x0a\x10",
            tid,
            b"\x12\x08",
            sid,
            encoded_state,
            b"\x22\x08" + parent.span_id.to_bytes(8, "big") if parent is not None else b"",
            _name(name),
            b"\x30\x02",  # SPAN_KIND_SERVER
            b"\x39",
            _FIXED64.pack(start),
            b"\x41",
            _FIXED64.pack(end),
            _attributes(b"\x4a", attributes),
            _STATUS_ERROR if failed else _STATUS_UNSET,
            b"\x85\x01",
            _FIXED32.pack(flags),
        )
    )
    out = [_field(b"\x12", body)]
    for child_name, child_id, kind, child_start, child_end, child_attributes, child_failed in children:
        child = b"".join(
            (
                b"\x0a\x10",
                tid,
                b"\x12\x08",
                child_id.to_bytes(8, "big"),
                encoded_state,
                b"\x22\x08",
                sid,
                _name(child_name),
                b"\x30",
                _SMALL[_KIND[kind]],
                b"\x39",
                _FIXED64.pack(child_start),
                b"\x41",
                _FIXED64.pack(child_end),
                _attributes(b"\x4a", child_attributes),
                _STATUS_ERROR if child_failed else _STATUS_UNSET,
                _LOCAL_PARENT_FLAGS,
            )
        )
        out.append(_field(b"\x12", child))
    return b"".join(out)


def envelope(resource: Mapping[str, Any], scope: Scope, fields: Sequence[bytes]) -> bytes:
    """The `ExportTraceServiceRequest` holding `fields` (`request_fields` of many requests): one
    `ResourceSpans` of `resource` (its attributes) with one `ScopeSpans` of `scope`."""
    head = _field(b"\x0a", scope.name.encode())
    if scope.version:
        head += _field(b"\x12", scope.version.encode())
    scope_spans = _field(b"\x0a", head) + b"".join(fields)
    body = _field(b"\x0a", _attributes(b"\x0a", resource)) + _field(b"\x12", scope_spans)
    return _field(b"\x0a", body)


class OtlpBatcher:
    """The export: requests' encoded spans batched and POSTed from the event loop.

    `add` (at the end of each sampled request) appends the request's `request_fields` to a bounded
    queue; a task of its own POSTs them as one `ExportTraceServiceRequest` every `interval_s`, or
    sooner once `batch` requests wait, one export at a time, through a pooled httpx client. No
    thread: an export thread contends for the GIL with the event loop, and that contention costs
    the loop more CPU than the encoding itself (bench/tracing.py). Past `max_queued` waiting
    requests the oldest are dropped. A failed export (collector
    down, refused, slow, an error status) drops that batch — requests are never affected — and is
    logged at most once a minute. Create and `start` inside the running event loop.
    """

    def __init__(
        self,
        endpoint: str,
        headers: Mapping[str, str],
        timeout_s: float = EXPORT_TIMEOUT_S,
        *,
        resource: Mapping[str, Any],
        scope: Scope,
        interval_s: float,
        max_queued: int = MAX_QUEUED,
        batch: int = 512,
    ) -> None:
        self._endpoint = endpoint
        self._headers = {"Content-Type": "application/x-protobuf", **headers}
        self._timeout_s = timeout_s
        self._resource, self._scope = resource, scope
        self._interval = interval_s
        self._batch = batch
        #: (a request's encoded spans, how many spans) in arrival order
        self._queue: deque[tuple[bytes, int]] = deque(maxlen=max_queued)
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._last_log = -_LOG_EVERY_S
        self._last_drop_log = -_LOG_EVERY_S
        #: spans this exporter failed to deliver, and spans dropped from a full queue
        self.failed_spans = 0
        self.dropped_spans = 0
        self.exported_spans = 0

    def start(self) -> None:
        # a collector is reached directly (no proxy from the environment)
        self._client = httpx.AsyncClient(trust_env=False, timeout=self._timeout_s)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="otlp-export")

    def add(self, fields: bytes, spans: int) -> None:
        """Queue one request's encoded spans (`spans` of them). Never blocks, never raises."""
        queue = self._queue
        if len(queue) == queue.maxlen:
            self.dropped_spans += queue[0][1]  # the deque drops the oldest on append
            self._log_drop()
        queue.append((fields, spans))
        if len(queue) >= self._batch and not self._wake.is_set():
            self._wake.set()

    async def flush(self) -> None:
        """Export everything queued now (each POST bounded by the timeout)."""
        while self._queue:
            await self._export()

    async def aclose(self) -> None:
        """Let an export in flight finish, export what is queued, then stop."""
        task, self._task = self._task, None
        if task is not None:
            self._closing = True
            self._wake.set()
            await task
        await self.flush()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            # a timer, not `asyncio.wait_for` (which in Python 3.11 can swallow a cancellation), and
            # no cancellation at all: a batch taken off the queue is always sent or counted failed
            timer = loop.call_later(self._interval, self._wake.set)
            try:
                await self._wake.wait()
            finally:
                timer.cancel()
            self._wake.clear()
            if self._closing:
                return
            await self._export()
            while len(self._queue) >= self._batch and not self._closing:
                await self._export()

    async def _export(self) -> None:
        async with self._lock:
            queue = self._queue
            n = min(len(queue), self._batch)
            if not n or self._client is None:
                return
            items = [queue.popleft() for _ in range(n)]
            count = sum(spans for _, spans in items)
            data = envelope(self._resource, self._scope, [fields for fields, _ in items])
            try:
                async with asyncio.timeout(self._timeout_s):  # the whole export, not each phase
                    response = await self._client.post(self._endpoint, content=data, headers=self._headers)
                status = response.status_code
            except (httpx.HTTPError, OSError, TimeoutError) as exc:
                kind = "connection failed" if isinstance(exc, httpx.ConnectError | OSError) else "failed"
                self._failed(count, f"{kind}: {type(exc).__name__}: {exc}")
                return
            if status // 100 != 2:
                self._failed(count, f"HTTP {status}")
                return
            self.exported_spans += count

    def _failed(self, count: int, why: str) -> None:
        self.failed_spans += count
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY_S:
            self._last_log = now
            log.warning(
                "trace export to %s failed (%s): %d spans dropped so far; requests are not affected",
                self._endpoint,
                why,
                self.failed_spans,
            )

    def _log_drop(self) -> None:
        now = time.monotonic()
        if now - self._last_drop_log >= _LOG_EVERY_S:
            self._last_drop_log = now
            log.warning(
                "trace export queue full: the oldest waiting requests' "
                "spans are dropped, %d so far; requests are not affected",
                self.dropped_spans,
            )
