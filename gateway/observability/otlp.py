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
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind

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


def _varint(n: int) -> bytes:
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


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
    """Repeated `KeyValue` under field `tag`."""
    if not attributes:
        return b""
    out = []
    for key, value in attributes.items():
        kv = _field(b"\x0a", key.encode()) + _field(b"\x12", _any_value(value))
        out.append(_field(tag, kv))
    return b"".join(out)


def _span(span: ReadableSpan) -> bytes:
    ctx = span.context
    assert ctx is not None and span.start_time is not None and span.end_time is not None
    parent = span.parent
    parts = [b"\x0a\x10", ctx.trace_id.to_bytes(16, "big"), b"\x12\x08", ctx.span_id.to_bytes(8, "big")]
    if ctx.trace_state:
        parts.append(_field(b"\x1a", ",".join(f"{k}={v}" for k, v in ctx.trace_state.items()).encode()))
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


def encode_spans(spans: Sequence[ReadableSpan]) -> bytes:
    """The `ExportTraceServiceRequest` for `spans`, grouped by resource, then instrumentation scope."""
    if any(s.events or s.links for s in spans):
        return bytes(sdk_encode_spans(spans).SerializePartialToString())
    groups: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope
        scopes = groups.setdefault(id(resource), (resource, {}))[1]
        scopes.setdefault(id(scope), (scope, []))[1].append(_field(b"\x12", _span(span)))
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
        #: spans this exporter failed to deliver (also the gateway_trace_spans_dropped_total metric)
        self.failed_spans = 0
        self.exported_spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            data = encode_spans(spans)
            response = self._session.post(self._endpoint, data=data, timeout=self._timeout)
        except (requests.RequestException, OSError, TypeError, ValueError) as exc:
            return self._failed(len(spans), f"{type(exc).__name__}: {exc}")
        if response.status_code // 100 != 2:
            return self._failed(len(spans), f"HTTP {response.status_code}")
        self.exported_spans += len(spans)
        return SpanExportResult.SUCCESS

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
