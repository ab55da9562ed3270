"""An OTLP/HTTP trace receiver for the tests: a small loopback server decoding the official protobuf.

No OpenTelemetry collector is installable here, so the tests run this instead: `POST /v1/traces` with
an `ExportTraceServiceRequest` (`application/x-protobuf`, gzip accepted), decoded with the official
`opentelemetry-proto` messages; every span is kept as a `ReceivedSpan`. The gateway and the real vLLM
server export to the same receiver, so a test sees both sides of a trace.

    with OtlpReceiver() as receiver:
        ...  # point `tracing.endpoint` (and vLLM's --otlp-traces-endpoint) at receiver.url
        spans = receiver.wait_for(lambda s: s.name == "gateway.upstream", timeout=10)

`fail_with` makes it answer every export with that status instead (an unhealthy collector); `stop()`
closes the socket (a collector that is down). `GET /count` answers `{"spans": N, "requests": M}`; as a
process of its own (`python -m tests.otlp_receiver --port P`, what bench/tracing.py runs, so decoding
costs the benchmark's client nothing) it keeps only counts.
"""

from __future__ import annotations

import argparse
import gzip
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

__all__ = ["OtlpReceiver", "ReceivedSpan", "value_of"]

KINDS = {
    Span.SPAN_KIND_INTERNAL: "internal",
    Span.SPAN_KIND_SERVER: "server",
    Span.SPAN_KIND_CLIENT: "client",
    Span.SPAN_KIND_PRODUCER: "producer",
    Span.SPAN_KIND_CONSUMER: "consumer",
    Span.SPAN_KIND_UNSPECIFIED: "unspecified",
}


def value_of(v: AnyValue) -> Any:
    """An `AnyValue` as a Python value (arrays as tuples)."""
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return tuple(value_of(x) for x in v.array_value.values)
    if which == "kvlist_value":
        return {kv.key: value_of(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which)


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root span
    name: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    resource: dict[str, Any]
    scope: str
    flags: int
    trace_state: str = ""
    raw: Span = field(repr=False, compare=False, default_factory=Span)

    @property
    def service(self) -> str:
        return str(self.resource.get("service.name", ""))


class OtlpReceiver:
    """`POST /v1/traces` on 127.0.0.1 (a free port); thread-safe lists of what arrived."""

    def __init__(self, max_spans: int = 100_000, port: int = 0) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._spans: list[ReceivedSpan] = []
        self._max_spans = max_spans
        self.requests = 0
        self.content_types: set[str] = set()
        #: answer every export with this status instead of 200 (None: accept)
        self.fail_with: int | None = None
        #: every span received, kept or not
        self.total_spans = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                status = receiver._receive(self.path, self.headers.get("content-type", ""), body)
                payload = ExportTraceServiceResponse().SerializeToString() if status == 200 else b""
                self.send_response(status)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                with receiver._lock:
                    counts = {"spans": receiver.total_spans, "requests": receiver.requests}
                payload = json.dumps(counts).encode()
                self.send_response(200 if self.path == "/count" else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The traces endpoint, as `tracing.endpoint` and vLLM's `--otlp-traces-endpoint` take it."""
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def start(self) -> OtlpReceiver:
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _receive(self, path: str, content_type: str, body: bytes) -> int:
        if path != "/v1/traces":
            return 404
        request = ExportTraceServiceRequest.FromString(body)  # raises on bytes that are not the message
        spans = []
        for rs in request.resource_spans:
            resource = {kv.key: value_of(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(
                        ReceivedSpan(
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            name=s.name,
                            kind=KINDS[s.kind],
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            attributes={kv.key: value_of(kv.value) for kv in s.attributes},
                            status_code=s.status.code,
                            resource=resource,
                            scope=ss.scope.name,
                            flags=s.flags,
                            trace_state=s.trace_state,
                            raw=s,
                        )
                    )
        with self._changed:
            self.requests += 1
            self.content_types.add(content_type)
            if self.fail_with is not None:
                return self.fail_with
            self.total_spans += len(spans)
            self._spans.extend(spans)
            del self._spans[: max(0, len(self._spans) - self._max_spans)]
            self._changed.notify_all()
        return 200

    def spans(self, trace_id: str | None = None) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 10.0, what: str = "spans"
    ) -> list[ReceivedSpan]:
        """Wait until `predicate(all spans so far)` holds; AssertionError naming what came otherwise."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(list(self._spans)):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted({f"{s.service}:{s.name}" for s in self._spans})
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}; received {names}")
                self._changed.wait(left)
            return list(self._spans)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.otlp_receiver", description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args(argv)
    receiver = OtlpReceiver(max_spans=0, port=a.port)
    receiver._server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
