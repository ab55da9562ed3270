"""OTLP/HTTP span export: the gateway's compact protobuf encoder and the exporter that POSTs it.

`encode_spans(spans)` writes an `ExportTraceServiceRequest` (opentelemetry-proto's
`opentelemetry/proto/collector/trace/v1/trace_service.proto`) straight to protobuf wire bytes from the
SDK's `ReadableSpan`s. The SDK's own encoder builds a tree of protobuf message objects first and
costs about 14 µs per span on this project's machine; this one costs 1-4 µs, which matters because a
traced request makes six spans and the export runs in the gateway's process (`python -m
bench.tracing`). It encodes what the gateway's spans hold — names, kinds, ids, times, attributes of
str, bool, int, float, bytes and sequences of them, status, flags — and hands a batch holding events
or links (the gateway makes none) to the SDK's encoder instead. The tests decode its output with the
official `opentelemetry-proto` messages and compare it with the SDK encoder's, field for field.

What the gateway queues is one `RequestSpans` per sampled request: the request's span (an SDK
`ReadableSpan`, which the SDK's `BatchSpanProcessor` queues and batches like any other) carrying its
children as plain tuples, so the event loop pays for one span object per request and the children are
encoded straight from the tuples. `expand()` makes SDK spans of them for the SDK's own exporter
(`SdkExporter`).

`OtlpHttpExporter` is an SDK `SpanExporter` for the `BatchSpanProcessor`: it runs on the processor's
worker thread, never on the event loop. A failed export (collector down, refused, slow, an error
status) drops that batch — requests are never affected — and is logged at most once a minute.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any

import requests
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

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
#: a failed export is logged at most this often
_LOG_EVERY_S = 60.0
#: requests encoded between two hand-overs of the GIL (~0.5 ms of work)
_SLICE = 32
_STATUS_UNSET = b"\x7a\x00"
_STATUS_ERROR = b"\x7a\x02\x18\x02"
_LOCAL_PARENT_FLAGS = b"\x85\x01" + _FIXED32.pack(_HAS_IS_REMOTE)
_UNSET = Status(StatusCode.UNSET)
_ERROR = Status(StatusCode.ERROR)
_NAMES: dict[str, bytes] = {}
#: attribute keys' encoded `KeyValue.key` fields (the gateway uses a few dozen keys; bounded anyway)
_KEYS: dict[str, bytes] = {}
_MAX_KEYS = 4096

#: a child span of a request: (name, span id, kind, start ns, end ns, attributes, failed)
ChildSpan = tuple[str, int, SpanKind, int, int, dict[str, Any] | None, bool]


class RequestSpans(ReadableSpan):
    """A request's span, with its children (`ChildSpan`s) riding along to the exporter."""

    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        resource: Resource,
        attributes: dict[str, Any],
        *,
        status: Status,
        start_time: int,
        end_time: int,
        scope: InstrumentationScope,
        children: list[ChildSpan],
    ) -> None:
        super().__init__(
            name,
            context,
            parent,
            resource,
            attributes,
            kind=SpanKind.SERVER,
            status=status,
            start_time=start_time,
            end_time=end_time,
            instrumentation_scope=scope,
        )
        self.children = children

    def expand(self) -> list[ReadableSpan]:
        """This span and its children as SDK spans."""
        ctx = self.context
        assert ctx is not None
        flags = TraceFlags(TraceFlags.SAMPLED)
        out: list[ReadableSpan] = [self]
        for name, sid, kind, start, end, attributes, failed in self.children:
            out.append(
                ReadableSpan(
                    name,
                    SpanContext(ctx.trace_id, sid, False, flags, ctx.trace_state),
                    ctx,
                    self.resource,
                    attributes,
                    kind=kind,
                    status=_ERROR if failed else _UNSET,
                    start_time=start,
                    end_time=end,
                    instrumentation_scope=self.instrumentation_scope,
                )
            )
        return out


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


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """Repeated `KeyValue` under field `tag` (the common value types inline: this is the hot loop)."""
    if not attributes:
        return b""
    out = []
    keys, varints = _KEYS, _VARINTS
    for key, value in attributes.items():
        k = keys.get(key)
        if k is None:
            k = _field(b"\x0a", key.encode())
            if len(keys) < _MAX_KEYS:
                keys[key] = k
        kind = type(value)
        if kind is str:
            raw = value.encode()
            n = len(raw)
            v = b"\x0a" + (varints[n] if n < 2048 else _long_varint(n)) + raw
        elif kind is int and 0 <= value < 2048:
            v = b"\x18" + varints[value]
        else:
            v = _any_value(value)
        kv = k + b"\x12" + varints[len(v)] + v if len(v) < 2048 else k + b"\x12" + _varint(len(v)) + v
        out.append(tag + varints[len(kv)] + kv if len(kv) < 2048 else tag + _varint(len(kv)) + kv)
    return b"".join(out)


def _trace_state(span: ReadableSpan) -> bytes:
    ctx = span.context
    if ctx is None or not ctx.trace_state:
        return b""
    return _field(b"\x1a", ",".join(f"{k}={v}" for k, v in ctx.trace_state.items()).encode())


def _children(root: RequestSpans) -> list[bytes]:
    """The children's `Span` messages (each already a ScopeSpans.spans field)."""
    ctx = root.context
    assert ctx is not None
    trace_id, parent = ctx.trace_id.to_bytes(16, "big"), ctx.span_id.to_bytes(8, "big")
    state = _trace_state(root)
    out = []
    for name, sid, kind, start, end, attributes, failed in root.children:
        encoded_name = _NAMES.get(name)
        if encoded_name is None:
            encoded_name = _NAMES[name] = _field(b"\x2a", name.encode())
        body = b"".join(
            (
                b"\x0a\x10",
                trace_id,
                b"\x12\x08",
                sid.to_bytes(8, "big"),
                state,
                b"\x22\x08",
                parent,
                encoded_name,
                b"\x30",
                _SMALL[_KIND[kind]],
                b"\x39",
                _FIXED64.pack(start),
                b"\x41",
                _FIXED64.pack(end),
                _attributes(b"\x4a", attributes),
                _STATUS_ERROR if failed else _STATUS_UNSET,
                _LOCAL_PARENT_FLAGS,
            )
        )
        out.append(_field(b"\x12", body))
    return out


def _span(span: ReadableSpan) -> bytes:
    ctx = span.context
    assert ctx is not None and span.start_time is not None and span.end_time is not None
    parent = span.parent
    parts = [b"\x0a\x10", ctx.trace_id.to_bytes(16, "big"), b"\x12\x08", ctx.span_id.to_bytes(8, "big")]
    parts.append(_trace_state(span))
    if parent is not None:
        parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
    parts += (
        _field(b"\x2a", span.name.encode()),
        b"\x30",
        _SMALL[_KIND[span.kind]],
        b"\x39",
        _FIXED64.pack(span.start_time),
        b"\x41",
        _FIXED64.pack(span.end_time),
        _attributes(b"\x4a", span.attributes),
    )
    for tag, count in ((b"\x50", span.dropped_attributes), (b"\x60", span.dropped_events)):
        if count:
            parts += (tag, _varint(count))
    if span.dropped_links:
        parts += (b"\x70", _varint(span.dropped_links))
    status = span.status
    body = b""
    if status.description:
        body += _field(b"\x12", status.description.encode())
    if status.status_code.value:
        body += b"\x18" + _SMALL[status.status_code.value]
    parts.append(_field(b"\x7a", body))
    flags = _HAS_IS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote else 0)
    parts += (b"\x85\x01", _FIXED32.pack(flags))
    return b"".join(parts)


def expand(spans: Sequence[ReadableSpan]) -> list[ReadableSpan]:
    """`spans` with every `RequestSpans`' children as SDK spans beside it."""
    return [s for span in spans for s in (span.expand() if isinstance(span, RequestSpans) else (span,))]


def encode_spans(spans: Sequence[ReadableSpan]) -> bytes:
    """The `ExportTraceServiceRequest` for `spans` (and the children of each `RequestSpans`), grouped
    by resource, then instrumentation scope (by identity: the gateway has one of each)."""
    if any(s.events or s.links for s in spans):
        return bytes(sdk_encode_spans(expand(spans)).SerializePartialToString())
    groups: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope
        scopes = groups.setdefault(id(resource), (resource, {}))[1]
        encoded = scopes.setdefault(id(scope), (scope, []))[1]
        encoded.append(_field(b"\x12", _span(span)))
        if isinstance(span, RequestSpans):
            encoded.extend(_children(span))
    out = []
    for resource, scopes in groups.values():
        body = _field(b"\x0a", _attributes(b"\x0a", resource.attributes))
        for scope, encoded in scopes.values():
            head = b""
            if scope is not None:
                head = _field(b"\x0a", scope.name.encode())
                if scope.version:
                    head += _field(b"\x12", scope.version.encode())
                head += _attributes(b"\x1a", scope.attributes)
            scope_spans = _field(b"\x0a", head) + b"".join(encoded)
            if scope is not None and scope.schema_url:
                scope_spans += _field(b"\x1a", scope.schema_url.encode())
            body += _field(b"\x12", scope_spans)
        if resource.schema_url:
            body += _field(b"\x1a", resource.schema_url.encode())
        out.append(_field(b"\x0a", body))
    return b"".join(out)


class OtlpHttpExporter(SpanExporter):
    """POSTs `encode_spans` batches to an OTLP/HTTP endpoint (`application/x-protobuf`)."""

    def __init__(self, endpoint: str, headers: Mapping[str, str], timeout_s: float) -> None:
        self._endpoint = endpoint
        self._timeout = timeout_s
        self._session = requests.Session()
        self._session.trust_env = False  # a collector is reached directly, never through a proxy
        self._session.headers.update({"Content-Type": "application/x-protobuf", **headers})
        self._last_log = -_LOG_EVERY_S
        #: spans this exporter failed to deliver (a request's children counted)
        self.failed_spans = 0
        self.exported_spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        count = sum(1 + len(s.children) if isinstance(s, RequestSpans) else 1 for s in spans)
        try:
            data = self._encode(spans)
            response = self._session.post(self._endpoint, data=data, timeout=self._timeout)
        except (requests.RequestException, OSError, TypeError, ValueError) as exc:
            return self._failed(count, f"{type(exc).__name__}: {exc}")
        if response.status_code // 100 != 2:
            return self._failed(count, f"HTTP {response.status_code}")
        self.exported_spans += count
        return SpanExportResult.SUCCESS

    @staticmethod
    def _encode(spans: Sequence[ReadableSpan]) -> bytes:
        """`encode_spans` in slices, letting the event loop's thread run between them: a batch takes
        milliseconds to encode, and holding the GIL that long would stall every stream meanwhile.
        Serialized messages concatenate into one (protobuf merges repeated fields)."""
        parts = []
        for i in range(0, len(spans), _SLICE):
            parts.append(encode_spans(spans[i : i + _SLICE]))
            time.sleep(0)  # hands the GIL over
        return b"".join(parts)

    def _failed(self, count: int, why: str) -> SpanExportResult:
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
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._session.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class SdkExporter(SpanExporter):
    """The OpenTelemetry SDK's `OTLPSpanExporter`, handed every span (children expanded)."""

    def __init__(self, exporter: SpanExporter) -> None:
        self._exporter = exporter

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result: SpanExportResult = self._exporter.export(expand(spans))
        return result

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self._exporter.force_flush(timeout_millis))
