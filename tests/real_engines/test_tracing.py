"""One trace across the gateway and a real vLLM server.

The gateway (tracing on, every request sampled) and the real vLLM 0.32 server
(`--otlp-traces-endpoint`, OTLP/HTTP protobuf) export to the same receiver on loopback
(tests/otlp_receiver.py, decoding with the official `opentelemetry-proto`). vLLM honours the
`traceparent` the gateway sends on each attempt: its `llm_request` span must have the gateway's trace
id and the gateway's `gateway.upstream` span as its parent.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.real_engines.rig import chat, real_pool_config
from tests.real_engines.servers import VllmServer
from tests.support import HTTP, GatewayProcess

pytestmark = pytest.mark.processes

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
UNSAMPLED_TRACE = "5bf92f3577b34da6a3ce929d0e0e4737"


@pytest.fixture(scope="module")
def gateway(real_vllm: VllmServer, vllm_traces: OtlpReceiver) -> Iterator[GatewayProcess]:
    tracing = {"enabled": True, "endpoint": vllm_traces.url, "sample_ratio": 1.0}
    config = real_pool_config("vllm", [real_vllm.base_url], real_vllm.served_model_name, tracing=tracing)
    with GatewayProcess(config) as gw:
        yield gw


def _request_span(receiver: OtlpReceiver, request_id: str) -> ReceivedSpan:
    spans = receiver.wait_for(
        lambda ss: any(s.attributes.get("gateway.request_id") == request_id for s in ss),
        timeout=15,
        what=f"the gateway's span of {request_id}",
    )
    return next(s for s in spans if s.attributes.get("gateway.request_id") == request_id)


def _vllm_span(receiver: OtlpReceiver, trace_id: str) -> ReceivedSpan:
    spans = receiver.wait_for(
        lambda ss: any(s.trace_id == trace_id and s.service == "vllm" for s in ss),
        timeout=15,
        what=f"vLLM's span in trace {trace_id}",
    )
    return next(s for s in spans if s.trace_id == trace_id and s.service == "vllm")


@pytest.mark.parametrize("stream", [False, True], ids=["non-streamed", "streamed"])
def test_vllms_span_is_a_child_of_the_gateways_upstream_span(
    gateway: GatewayProcess, vllm_traces: OtlpReceiver, stream: bool
) -> None:
    body = chat("Say something about tracing.", max_tokens=12, stream=stream)
    r = HTTP.post(gateway.base_url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    root = _request_span(vllm_traces, r.headers["x-request-id"])
    engine = _vllm_span(vllm_traces, root.trace_id)
    trace = vllm_traces.spans(root.trace_id)
    upstream = [s for s in trace if s.name == "gateway.upstream"]
    assert len(upstream) == 1, [s.name for s in trace]
    # the engine's span hangs under the gateway's attempt, which hangs under the request
    assert engine.name == "llm_request" and engine.kind == "server"
    assert engine.parent_span_id == upstream[0].span_id
    assert upstream[0].parent_span_id == root.span_id and root.parent_span_id == ""
    assert upstream[0].attributes["gateway.backend"] == "vllm-0"
    assert root.attributes["gen_ai.system"] == "vllm"
    # the engine worked inside the gateway's attempt (same clock: one machine)
    assert upstream[0].start_ns <= engine.start_ns and engine.end_ns <= upstream[0].end_ns
    # both sides saw the same request: the engine's token counts are the gateway's usage
    usage = r.json()["usage"] if not stream else None
    assert (
        engine.attributes["gen_ai.usage.completion_tokens"] == root.attributes["gen_ai.usage.output_tokens"]
    )
    assert engine.attributes["gen_ai.usage.prompt_tokens"] == root.attributes["gen_ai.usage.input_tokens"]
    if usage is not None:
        assert root.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert engine.attributes["gen_ai.request.max_tokens"] == 12
    if stream:
        assert [s.name for s in trace].count("gateway.relay") == 1


def test_a_clients_traceparent_spans_client_gateway_and_engine(
    gateway: GatewayProcess, vllm_traces: OtlpReceiver
) -> None:
    headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
    r = HTTP.post(gateway.base_url + "/v1/chat/completions", json=chat("hello"), headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    root = _request_span(vllm_traces, r.headers["x-request-id"])
    assert root.trace_id == CLIENT_TRACE and root.parent_span_id == CLIENT_SPAN
    engine = _vllm_span(vllm_traces, CLIENT_TRACE)
    upstream = next(s for s in vllm_traces.spans(CLIENT_TRACE) if s.name == "gateway.upstream")
    assert engine.parent_span_id == upstream.span_id


def test_an_unsampled_traceparent_is_honoured_by_gateway_and_engine(
    gateway: GatewayProcess, vllm_traces: OtlpReceiver
) -> None:
    headers = {"traceparent": f"00-{UNSAMPLED_TRACE}-{CLIENT_SPAN}-00"}
    r = HTTP.post(gateway.base_url + "/v1/chat/completions", json=chat("quiet"), headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    # A sampled request after it: once its engine span is in, the unsampled one's would be too.
    later = HTTP.post(gateway.base_url + "/v1/chat/completions", json=chat("loud"), timeout=120)
    assert later.status_code == 200
    _vllm_span(vllm_traces, _request_span(vllm_traces, later.headers["x-request-id"]).trace_id)
    assert vllm_traces.spans(UNSAMPLED_TRACE) == []
