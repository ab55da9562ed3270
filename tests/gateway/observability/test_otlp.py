"""The compact OTLP encoder against the OpenTelemetry SDK's: both outputs decoded with the official
`opentelemetry-proto` messages must be equal, field for field, for any request the gateway can trace."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from gateway.observability.otlp import ChildSpan, Scope, envelope, request_fields
from tests.support import examples

RESOURCES = [
    {"service.name": "llm-gateway", "service.version": "0.1.0"},
    {"service.name": "other", "k": 3},
]
SCOPES = [Scope("llm-gateway", "0.1.0"), Scope("bare")]
SAMPLED = TraceFlags(TraceFlags.SAMPLED)

int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
scalar = st.one_of(
    st.text(max_size=40),
    st.booleans(),
    int64,
    st.floats(allow_nan=False),
    st.binary(max_size=20),
)
homogeneous = st.one_of(
    st.lists(st.text(max_size=10), max_size=4).map(tuple),
    st.lists(int64, max_size=4).map(tuple),
    st.lists(st.booleans(), max_size=4).map(tuple),
    st.lists(st.floats(allow_nan=False), max_size=4).map(tuple),
)
attributes = st.dictionaries(st.text(min_size=1, max_size=30), st.one_of(scalar, homogeneous), max_size=8)
ids64 = st.integers(min_value=1, max_value=2**64 - 1)
ids128 = st.integers(min_value=1, max_value=2**128 - 1)
times = st.integers(min_value=0, max_value=2**64 - 1)


@dataclass
class Request:
    """What `request_fields` takes: a request's span and its children."""

    name: str
    trace_id: int
    span_id: int
    parent: SpanContext | None
    state: TraceState
    start: int
    end: int
    attributes: dict[str, Any]
    failed: bool
    children: list[ChildSpan]

    def fields(self) -> bytes:
        return request_fields(
            self.name,
            self.trace_id,
            self.span_id,
            self.parent,
            self.state,
            self.start,
            self.end,
            self.attributes,
            self.failed,
            self.children,
        )

    def sdk_spans(self, resource: Resource, scope: InstrumentationScope) -> list[ReadableSpan]:
        """The same spans as the SDK's `ReadableSpan`s."""
        context = SpanContext(self.trace_id, self.span_id, False, SAMPLED, self.state)
        out = [
            ReadableSpan(
                self.name,
                context,
                self.parent,
                resource,
                self.attributes,
                kind=SpanKind.SERVER,
                status=Status(StatusCode.ERROR if self.failed else StatusCode.UNSET),
                start_time=self.start,
                end_time=self.end,
                instrumentation_scope=scope,
            )
        ]
        for name, sid, kind, start, end, child_attributes, failed in self.children:
            out.append(
                ReadableSpan(
                    name,
                    SpanContext(self.trace_id, sid, False, SAMPLED, self.state),
                    context,
                    resource,
                    child_attributes,
                    kind=kind,
                    status=Status(StatusCode.ERROR if failed else StatusCode.UNSET),
                    start_time=start,
                    end_time=end,
                    instrumentation_scope=scope,
                )
            )
        return out


@st.composite
def requests(draw: Any) -> Request:
    """A request's span as the gateway records it: its children are tuples."""
    trace_id = draw(ids128)
    parent = draw(
        st.one_of(
            st.none(),
            st.builds(lambda sid, remote: SpanContext(trace_id, sid, remote, SAMPLED), ids64, st.booleans()),
        )
    )
    start = draw(times)
    child = st.tuples(
        st.sampled_from(["gateway.auth", "gateway.route", "gateway.upstream", "gateway.relay"]),
        ids64,
        st.sampled_from([SpanKind.INTERNAL, SpanKind.CLIENT]),
        times,
        times,
        st.one_of(st.none(), attributes),
        st.booleans(),
    )
    return Request(
        draw(st.text(max_size=40)),
        trace_id,
        draw(ids64),
        parent,
        draw(st.sampled_from([TraceState(), TraceState([("vendor", "abc"), ("k", "v")])])),
        start,
        draw(st.integers(min_value=start, max_value=2**64 - 1)),
        draw(attributes),
        draw(st.booleans()),
        draw(st.lists(child, max_size=6)),
    )


def decoded(data: bytes) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString(data)


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(requests(), min_size=1, max_size=5), st.sampled_from(RESOURCES), st.sampled_from(SCOPES))
def test_requests_encoded_at_their_end_are_what_the_sdk_encodes(
    batch: list[Request], resource: dict[str, Any], scope: Scope
) -> None:
    """The export path: each request's `request_fields`, many wrapped in one `envelope`."""
    ours = envelope(resource, scope, [r.fields() for r in batch])
    sdk_resource = Resource(resource)
    sdk_scope = InstrumentationScope(scope.name, scope.version or None)
    spans = [s for r in batch for s in r.sdk_spans(sdk_resource, sdk_scope)]
    assert decoded(ours) == sdk_encode_spans(spans)


def test_a_gateway_request_round_trips() -> None:
    trace_id = 0x0AF7651916CD43DD8448EB211C80319C
    parent = SpanContext(trace_id, 0x00F067AA0BA902B7, True, SAMPLED)
    fields = request_fields(
        "POST /v1/chat/completions",
        trace_id,
        0xB7AD6B7169203331,
        parent,
        None,
        1_700_000_000_000_000_000,
        1_700_000_000_250_000_000,
        {
            "gen_ai.usage.output_tokens": 20,
            "gen_ai.response.finish_reasons": ("stop",),
            "gateway.stream": True,
        },
        False,
        [
            (
                "gateway.route",
                7,
                SpanKind.INTERNAL,
                1_700_000_000_000_000_001,
                1_700_000_000_000_000_002,
                None,
                False,
            )
        ],
    )
    message = decoded(envelope(RESOURCES[0], SCOPES[0], [fields]))
    (scope_spans,) = message.resource_spans[0].scope_spans
    assert scope_spans.scope.name == "llm-gateway" and scope_spans.scope.version == "0.1.0"
    out, child = scope_spans.spans
    assert out.trace_id.hex() == "0af7651916cd43dd8448eb211c80319c"
    assert out.parent_span_id.hex() == "00f067aa0ba902b7"
    assert out.kind == out.SPAN_KIND_SERVER and out.flags == 0x300  # has-is-remote, is-remote
    assert out.end_time_unix_nano - out.start_time_unix_nano == 250_000_000
    attrs = {kv.key: kv.value for kv in out.attributes}
    assert attrs["gen_ai.usage.output_tokens"].int_value == 20
    assert attrs["gen_ai.response.finish_reasons"].array_value.values[0].string_value == "stop"
    assert attrs["gateway.stream"].bool_value is True
    assert child.parent_span_id == out.span_id and child.kind == child.SPAN_KIND_INTERNAL
    assert child.flags == 0x100  # has-is-remote, local parent
