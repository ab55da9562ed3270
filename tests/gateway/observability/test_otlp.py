"""The compact OTLP encoder against the SDK's: both outputs decoded with the official
`opentelemetry-proto` messages must be equal, field for field, for any span the gateway can make."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from gateway.observability.otlp import RequestSpans, encode_spans, envelope, expand

RESOURCES = [
    Resource({"service.name": "llm-gateway", "service.version": "0.1.0"}),
    Resource({"service.name": "other", "k": 3}, schema_url="https://opentelemetry.io/schemas/1.21.0"),
]
SCOPES = [
    InstrumentationScope("llm-gateway", "0.1.0"),
    InstrumentationScope("bare"),
    InstrumentationScope("attrs", "2", "https://example.invalid/schema", {"a": "b"}),
]

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


@st.composite
def spans(draw: Any) -> ReadableSpan:
    trace_id = draw(ids128)
    state = draw(st.sampled_from([TraceState(), TraceState([("vendor", "abc"), ("k", "v")])]))
    context = SpanContext(trace_id, draw(ids64), False, TraceFlags(1), state)
    parent = draw(
        st.one_of(
            st.none(),
            st.builds(
                lambda sid, remote: SpanContext(trace_id, sid, remote, TraceFlags(1)), ids64, st.booleans()
            ),
        )
    )
    status = draw(
        st.sampled_from(
            [Status(StatusCode.UNSET), Status(StatusCode.OK), Status(StatusCode.ERROR, "status_503")]
        )
    )
    start = draw(times)
    return ReadableSpan(
        draw(st.text(max_size=40)),
        context,
        parent,
        draw(st.sampled_from(RESOURCES)),
        draw(st.one_of(st.none(), attributes)),
        kind=draw(st.sampled_from(list(SpanKind))),
        status=status,
        start_time=start,
        end_time=draw(st.integers(min_value=start, max_value=2**64 - 1)),
        instrumentation_scope=draw(st.sampled_from(SCOPES)),
    )


def decoded(data: bytes) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString(data)


@settings(max_examples=150, deadline=None)
@given(st.lists(spans(), min_size=1, max_size=6))
def test_the_compact_encoding_decodes_to_the_sdks_message(batch: list[ReadableSpan]) -> None:
    ours = decoded(encode_spans(batch))
    assert ours == sdk_encode_spans(batch)


def test_a_gateway_span_round_trips() -> None:
    ctx = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, False, TraceFlags(1))
    parent = SpanContext(ctx.trace_id, 0x00F067AA0BA902B7, True, TraceFlags(1))
    span = ReadableSpan(
        "POST /v1/chat/completions",
        ctx,
        parent,
        RESOURCES[0],
        {
            "gen_ai.usage.output_tokens": 20,
            "gen_ai.response.finish_reasons": ("stop",),
            "gateway.stream": True,
        },
        kind=SpanKind.SERVER,
        start_time=1_700_000_000_000_000_000,
        end_time=1_700_000_000_250_000_000,
        instrumentation_scope=SCOPES[0],
    )
    message = decoded(encode_spans([span]))
    (out,) = message.resource_spans[0].scope_spans[0].spans
    assert out.trace_id.hex() == "0af7651916cd43dd8448eb211c80319c"
    assert out.parent_span_id.hex() == "00f067aa0ba902b7"
    assert out.kind == out.SPAN_KIND_SERVER and out.flags == 0x300  # has-is-remote, is-remote
    assert out.end_time_unix_nano - out.start_time_unix_nano == 250_000_000
    attrs = {kv.key: kv.value for kv in out.attributes}
    assert attrs["gen_ai.usage.output_tokens"].int_value == 20
    assert attrs["gen_ai.response.finish_reasons"].array_value.values[0].string_value == "stop"
    assert attrs["gateway.stream"].bool_value is True


def test_a_batch_with_events_goes_to_the_sdks_encoder() -> None:
    ctx = SpanContext(1, 2, False, TraceFlags(1))
    span = ReadableSpan("with-event", ctx, None, RESOURCES[0], events=[Event("e", {"x": 1}, timestamp=5)])
    assert decoded(encode_spans([span])) == sdk_encode_spans([span])
    assert decoded(encode_spans([span])).resource_spans[0].scope_spans[0].spans[0].events[0].name == "e"


@st.composite
def requests(draw: Any) -> RequestSpans:
    """A request's span as the gateway queues it: its children ride along as tuples."""
    trace_id = draw(ids128)
    state = draw(st.sampled_from([TraceState(), TraceState([("vendor", "abc")])]))
    context = SpanContext(trace_id, draw(ids64), False, TraceFlags(1), state)
    parent = draw(
        st.one_of(st.none(), st.builds(lambda sid: SpanContext(trace_id, sid, True, TraceFlags(1)), ids64))
    )
    start = draw(times)
    kinds = st.sampled_from([SpanKind.INTERNAL, SpanKind.CLIENT])
    child = st.tuples(
        st.sampled_from(["gateway.auth", "gateway.route", "gateway.upstream", "gateway.relay"]),
        ids64,
        kinds,
        times,
        times,
        st.one_of(st.none(), attributes),
        st.booleans(),
    )
    return RequestSpans(
        "POST /v1/chat/completions",
        context,
        parent,
        RESOURCES[0],
        draw(attributes),
        status=draw(st.sampled_from([Status(StatusCode.UNSET), Status(StatusCode.ERROR)])),
        start_time=start,
        end_time=draw(st.integers(min_value=start, max_value=2**64 - 1)),
        scope=SCOPES[0],
        children=draw(st.lists(child, max_size=6)),
    )


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(requests(), spans()), min_size=1, max_size=5))
def test_a_requests_children_encode_as_the_sdk_encodes_them_expanded(batch: list[ReadableSpan]) -> None:
    assert decoded(encode_spans(batch)) == sdk_encode_spans(expand(batch))
    assert len(expand(batch)) == sum(1 + len(getattr(s, "children", ())) for s in batch)


@settings(max_examples=100, deadline=None)
@given(st.lists(requests(), min_size=1, max_size=5))
def test_a_request_encoded_at_its_end_is_what_the_sdk_encodes(batch: list[RequestSpans]) -> None:
    """The default export path: each request's `request_fields`, many wrapped in one `envelope`."""
    fields = [span.fields() for span in batch]  # what `request_fields` makes of each
    assert decoded(envelope(RESOURCES[0], SCOPES[0], fields)) == sdk_encode_spans(expand(batch))
