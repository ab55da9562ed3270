"""The tracer's own parts, in one process: its sampling decision against the SDK's sampler, and the
exporter (`OtlpBatcher`) against the loopback OTLP receiver — batches, a full queue, a receiver that
is down."""

from __future__ import annotations

import asyncio
import random

from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

from gateway.observability.otlp import OtlpBatcher, Scope, request_fields
from gateway.observability.settings import TracingSettings
from gateway.observability.tracing import Trace, Tracing
from tests.otlp_receiver import OtlpReceiver
from tests.support import until

RESOURCE = {"service.name": "test"}
SCOPE = Scope("llm-gateway", "0")


def _sampled(result: object) -> tuple[bool, int]:
    """(sampled, trace id) of what `Tracing.begin` returned."""
    if isinstance(result, Trace):
        return True, result.trace_id
    headers = result._headers  # type: ignore[attr-defined]
    return False, int(headers["traceparent"].split("-")[1], 16)


def test_sampling_decides_as_the_sdks_parent_based_ratio_sampler() -> None:
    for ratio in (0.0, 0.1, 0.5, 1.0):
        tracing = Tracing(TracingSettings(enabled=True, sample_ratio=ratio), "0")
        sdk = ParentBased(TraceIdRatioBased(ratio))
        decisions = set()
        for _ in range(2000):  # new traces: by the trace id's low 64 bits
            sampled, trace_id = _sampled(tracing.begin({}))
            expected = sdk.should_sample(Context(), trace_id, "request").decision
            assert sampled == (expected is Decision.RECORD_AND_SAMPLE), (ratio, trace_id)
            decisions.add(sampled)
        assert decisions == ({False} if ratio == 0 else {True} if ratio == 1 else {False, True})
        for flags in ("00", "01"):  # a client's traceparent: its sampled flag, whatever the ratio
            trace_id, span_id = random.getrandbits(128) | 1, random.getrandbits(64) | 1
            header = f"00-{trace_id:032x}-{span_id:016x}-{flags}".encode()
            sampled, seen = _sampled(tracing.begin({b"traceparent": header}))
            parent = SpanContext(trace_id, span_id, True, TraceFlags(int(flags, 16)))
            context = set_span_in_context(NonRecordingSpan(parent))
            expected = sdk.should_sample(context, trace_id, "request").decision
            assert seen == trace_id
            assert sampled == (expected is Decision.RECORD_AND_SAMPLE) == (flags == "01")


def _request(i: int) -> bytes:
    return request_fields("POST /v1/chat/completions", i + 1, i + 1, None, None, 1, 2, {"n": i}, False, [])


async def test_the_batcher_exports_in_batches_and_drops_the_oldest_when_full() -> None:
    with OtlpReceiver() as receiver:
        batcher = OtlpBatcher(
            receiver.url, {"x-key": "k"}, 5.0, resource=RESOURCE, scope=SCOPE,
            interval_s=30.0, max_queued=40, batch=16,
        )  # fmt: skip
        batcher.start()
        for i in range(50):  # 10 more than the queue holds: the 10 oldest go
            batcher.add(_request(i), 1)
        assert batcher.dropped_spans == 10
        await batcher.aclose()  # exports what is left, 16 at a time
        assert batcher.exported_spans == 40 and batcher.failed_spans == 0
        spans = receiver.spans()
        assert sorted(int(s.span_id, 16) for s in spans) == list(range(11, 51))
        assert receiver.requests == 3  # 16 + 16 + 8
        assert {s.service for s in spans} == {"test"}


async def test_a_full_batch_is_sent_before_the_interval() -> None:
    with OtlpReceiver() as receiver:
        batcher = OtlpBatcher(
            receiver.url, {}, 5.0, resource=RESOURCE, scope=SCOPE, interval_s=30.0, max_queued=100, batch=8
        )
        batcher.start()
        for i in range(8):
            batcher.add(_request(i), 1)
        await until(lambda: batcher.exported_spans == 8, what="a full batch sent")
        assert len(receiver.spans()) == 8
        await batcher.aclose()


async def test_a_receiver_that_is_down_costs_the_batch_only() -> None:
    receiver = OtlpReceiver().start()
    url = receiver.url
    receiver.stop()
    batcher = OtlpBatcher(
        url, {}, 1.0, resource=RESOURCE, scope=SCOPE, interval_s=30.0, max_queued=100, batch=8
    )
    batcher.start()
    for i in range(5):
        batcher.add(_request(i), 2)
    await batcher.aclose()
    assert batcher.failed_spans == 10 and batcher.exported_spans == 0


async def test_closing_never_hangs_whatever_the_timer_is_doing() -> None:
    """`aclose` while the export timer fires (every 1 ms here): the task stops every time."""
    with OtlpReceiver() as receiver:
        for i in range(150):
            batcher = OtlpBatcher(
                receiver.url, {}, 5.0, resource=RESOURCE, scope=SCOPE, interval_s=0.001, max_queued=16
            )
            batcher.start()
            batcher.add(_request(i), 1)
            await asyncio.sleep(0.001 * (i % 4))  # the close meets the 1 ms timer at another point each time
            async with asyncio.timeout(5):
                await batcher.aclose()
            assert batcher.exported_spans == 1
