"""Tracing end to end: real gateway processes in front of real simulators, exporting to a real
OTLP/HTTP receiver on loopback (tests/otlp_receiver.py, decoding with the official protobuf messages).

The span tree and its attributes, prompts kept out unless asked, a client's `traceparent` continued
and its sampled flag followed, the engine's `traceparent` naming the attempt's span, failover as two
attempts, refusals, sampling 0, prompts recorded when asked, an exporter that is down or failing
(requests unaffected), and tracing off (no `traceparent` reaches the engine).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from engines.sim.launcher import SimProcess, free_port
from gateway.admission.tokens import mint_token
from gateway.observability.otlp import EXPORT_INTERVAL_S
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.gateway.apis.conftest import EMBED_MODEL, EMBED_SERVED, embed_sim
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.support import HTTP, GatewayProcess, wait_until

pytestmark = pytest.mark.processes

SECRET = "tracing-secret-" + "t" * 48
USER = {"authorization": "Bearer " + mint_token(SECRET, "alice")}
PROMPT = "The secret prompt text zq-7781 must not be in any span."
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
CHILDREN = {"gateway.auth", "gateway.admit", "gateway.route", "gateway.upstream"}


def traced_config(urls: list[str], endpoint: str, **tracing: Any) -> dict[str, Any]:
    """One vLLM-dialect pool, JWT auth and a per-user limit (so auth and admit run), tracing on."""
    return single_pool_config(
        "vllm",
        urls,
        auth={"jwt": {"secret": SECRET}},
        limits={"tiers": {"default": {"requests_per_minute": 100_000}}},
        tracing={"enabled": True, "endpoint": endpoint, **tracing},
    )


def chat(content: str = PROMPT, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 6, **extra}


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(fast_sim("vllm")) for _ in range(2)]


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as rx:
        yield rx


@pytest.fixture(scope="module")
def gateway(sims: list[SimProcess], receiver: OtlpReceiver) -> Iterator[GatewayProcess]:
    config = traced_config([s.base_url for s in sims], receiver.url)
    with embed_sim("vllm") as embedder:  # and an embedding pool, for /v1/embeddings
        config["models"].append({"name": EMBED_MODEL, "task": "embed", "context_length": 512})
        config["pools"].append(
            {
                "name": "vllm-embed",
                "dialect": "vllm",
                "models": {EMBED_MODEL: EMBED_SERVED},
                "backends": [{"name": "vllm-embed-0", "url": embedder.base_url}],
            }
        )
        with GatewayProcess(config) as gw:
            yield gw


def post(gw: GatewayProcess, body: dict[str, Any], **headers: str) -> httpx.Response:
    return HTTP.post(gw.base_url + "/v1/chat/completions", json=body, headers={**USER, **headers})


def trace_of(receiver: OtlpReceiver, request_id: str, spans: int) -> list[ReceivedSpan]:
    """The spans of the trace whose request span has `request_id`, once `spans` of them are in."""

    def ready(all_spans: list[ReceivedSpan]) -> bool:
        root = next((s for s in all_spans if s.attributes.get("gateway.request_id") == request_id), None)
        return root is not None and sum(s.trace_id == root.trace_id for s in all_spans) >= spans

    found = receiver.wait_for(ready, timeout=10, what=f"{spans} spans of {request_id}")
    root = next(s for s in found if s.attributes.get("gateway.request_id") == request_id)
    return [s for s in found if s.trace_id == root.trace_id]


def engine_headers(sims: list[SimProcess], marker: str) -> dict[str, str]:
    """The request headers the simulator received for the request whose body holds `marker`."""
    for sim in sims:
        for r in HTTP.get(sim.base_url + "/sim/requests", timeout=5).json()["requests"]:
            if marker in str(r.get("body", "")):
                return dict(r["headers"])
    raise AssertionError(f"no simulator saw a request with {marker!r}")


def by_name(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {s.name: s for s in spans}


def test_a_request_is_one_trace_a_span_per_stage(
    gateway: GatewayProcess, receiver: OtlpReceiver, sims: list[SimProcess]
) -> None:
    r = post(gateway, chat(PROMPT + " one"))
    assert r.status_code == 200, r.text
    spans = by_name(trace_of(receiver, r.headers["x-request-id"], 5))
    root = spans.pop("POST /v1/chat/completions")
    assert set(spans) == CHILDREN
    assert root.kind == "server" and root.parent_span_id == ""
    assert all(s.parent_span_id == root.span_id for s in spans.values())
    assert spans["gateway.upstream"].kind == "client"
    assert {s.kind for n, s in spans.items() if n != "gateway.upstream"} == {"internal"}
    for s in spans.values():  # children lie inside the request's span
        assert root.start_ns <= s.start_ns <= s.end_ns <= root.end_ns
    assert spans["gateway.auth"].end_ns <= spans["gateway.admit"].start_ns
    assert spans["gateway.route"].end_ns <= spans["gateway.upstream"].start_ns
    a = root.attributes
    usage = r.json()["usage"]
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == MODEL
    assert a["gen_ai.system"] == "vllm"
    assert a["gen_ai.request.max_tokens"] == 6
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert a["gen_ai.response.finish_reasons"] == (r.json()["choices"][0]["finish_reason"],)
    assert a["http.response.status_code"] == 200 and a["http.request.method"] == "POST"
    assert root.status_code == 0 and root.service == "llm-gateway" and root.scope == "llm-gateway"
    route = spans["gateway.route"].attributes
    assert route["gateway.pool"] == r.headers["x-gateway-pool"] == "vllm"
    assert route["gateway.route"] == r.headers["x-gateway-route"]
    assert route["gateway.affinity"] in ("hit", "miss", "spill", "none")
    upstream = spans["gateway.upstream"]
    assert upstream.attributes["http.response.status_code"] == 200
    assert upstream.attributes["gateway.backend"] in ("vllm-0", "vllm-1")
    # the engine was sent this attempt's span as its parent, sampled
    sent = engine_headers(sims, "one")
    assert sent["traceparent"] == f"00-{root.trace_id}-{upstream.span_id}-01"


def test_a_stream_adds_the_relay_span(gateway: GatewayProcess, receiver: OtlpReceiver) -> None:
    r = post(gateway, chat(PROMPT + " two", stream=True, stream_options={"include_usage": True}))
    assert r.status_code == 200 and "[DONE]" in r.text
    spans = by_name(trace_of(receiver, r.headers["x-request-id"], 6))
    root = spans["POST /v1/chat/completions"]
    relay, upstream = spans["gateway.relay"], spans["gateway.upstream"]
    assert relay.parent_span_id == root.span_id
    # the relay runs from the engine's first event to the end; the attempt covers the whole exchange
    assert upstream.start_ns < relay.start_ns <= relay.end_ns <= upstream.end_ns + 5_000_000
    assert root.attributes["gateway.stream"] is True
    assert root.attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert root.attributes["gen_ai.usage.output_tokens"] == 6


OTHER_APIS = {
    "responses": ("/v1/responses", {"model": MODEL, "input": PROMPT, "max_output_tokens": 16}),
    "messages": (
        "/v1/messages",
        {"model": MODEL, "max_tokens": 6, "messages": [{"role": "user", "content": PROMPT}]},
    ),
}


@pytest.mark.parametrize("stream", [False, True], ids=["non-streamed", "streamed"])
@pytest.mark.parametrize("api", sorted(OTHER_APIS))
def test_the_responses_and_messages_apis_are_traced_alike(
    gateway: GatewayProcess, receiver: OtlpReceiver, api: str, stream: bool
) -> None:
    path, body = OTHER_APIS[api]
    r = HTTP.post(gateway.base_url + path, json={**body, "stream": stream}, headers=USER)
    assert r.status_code == 200, r.text
    spans = by_name(trace_of(receiver, r.headers["x-request-id"], 6 if stream else 5))
    root = spans.pop(f"POST {path}")
    assert set(spans) == CHILDREN | ({"gateway.relay"} if stream else set())
    a = root.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == MODEL
    assert (
        a["gen_ai.usage.input_tokens"] > 0
        and a["gen_ai.usage.output_tokens"] == a["gen_ai.request.max_tokens"]
    )
    # the engine's finish reason (the client saw `incomplete` / `max_tokens`, its API's words for it)
    assert a["gen_ai.response.finish_reasons"] == ("length",)
    assert "zq-7781" not in repr([s.attributes for s in (root, *spans.values())])


def test_embeddings_are_traced(gateway: GatewayProcess, receiver: OtlpReceiver) -> None:
    body = {"model": EMBED_MODEL, "input": ["the sea", "zq-7781"]}
    r = HTTP.post(gateway.base_url + "/v1/embeddings", json=body, headers=USER)
    assert r.status_code == 200, r.text
    spans = by_name(trace_of(receiver, r.headers["x-request-id"], 5))
    root = spans.pop("POST /v1/embeddings")
    assert set(spans) == CHILDREN
    assert spans["gateway.upstream"].attributes["gateway.backend"] == "vllm-embed-0"
    a = root.attributes
    assert a["gen_ai.operation.name"] == "embeddings" and a["gen_ai.request.model"] == EMBED_MODEL
    assert a["gen_ai.usage.input_tokens"] == r.json()["usage"]["prompt_tokens"]
    assert "gen_ai.usage.output_tokens" not in a and "gen_ai.response.finish_reasons" not in a
    assert "zq-7781" not in repr([s.attributes for s in (root, *spans.values())])


def test_no_prompt_text_in_any_span(gateway: GatewayProcess, receiver: OtlpReceiver) -> None:
    r = post(gateway, chat(PROMPT + " three"))
    spans = trace_of(receiver, r.headers["x-request-id"], 5)
    assert "zq-7781" not in repr([s.attributes for s in spans]) + repr([s.resource for s in spans])
    assert not any("gen_ai.input.messages" in s.attributes for s in spans)


def test_a_clients_traceparent_continues_its_trace(
    gateway: GatewayProcess, receiver: OtlpReceiver, sims: list[SimProcess]
) -> None:
    tp = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    r = post(gateway, chat(PROMPT + " four"), traceparent=tp, tracestate="vendor=abc")
    assert r.status_code == 200
    spans = by_name(trace_of(receiver, r.headers["x-request-id"], 5))
    root = spans["POST /v1/chat/completions"]
    assert root.trace_id == CLIENT_TRACE and root.parent_span_id == CLIENT_SPAN
    sent = engine_headers(sims, "four")
    assert sent["traceparent"] == f"00-{CLIENT_TRACE}-{spans['gateway.upstream'].span_id}-01"
    assert sent["tracestate"] == "vendor=abc"


def test_an_unsampled_traceparent_records_nothing_and_says_so_to_the_engine(
    gateway: GatewayProcess, receiver: OtlpReceiver, sims: list[SimProcess]
) -> None:
    trace = "1af7651916cd43dd8448eb211c80319d"
    r = post(gateway, chat(PROMPT + " five"), traceparent=f"00-{trace}-{CLIENT_SPAN}-00")
    assert r.status_code == 200
    later = post(gateway, chat(PROMPT + " six"))
    trace_of(receiver, later.headers["x-request-id"], 5)  # exported after the unsampled one would be
    assert receiver.spans(trace) == []
    sent = engine_headers(sims, "five")["traceparent"]
    assert sent.startswith(f"00-{trace}-") and sent.endswith("-00") and CLIENT_SPAN not in sent


def test_a_malformed_traceparent_starts_a_new_trace(gateway: GatewayProcess, receiver: OtlpReceiver) -> None:
    r = post(gateway, chat(PROMPT + " seven"), traceparent="00-zz-not-a-trace-01")
    assert r.status_code == 200
    root = by_name(trace_of(receiver, r.headers["x-request-id"], 5))["POST /v1/chat/completions"]
    assert root.parent_span_id == "" and len(root.trace_id) == 32


def test_a_refused_request_ends_at_its_stage(gateway: GatewayProcess, receiver: OtlpReceiver) -> None:
    r = HTTP.post(gateway.base_url + "/v1/chat/completions", json=chat(), timeout=10)  # no token
    assert r.status_code == 401
    spans = by_name(trace_of(receiver, r.headers["x-request-id"], 2))
    assert set(spans) == {"POST /v1/chat/completions", "gateway.auth"}
    auth = spans["gateway.auth"]
    assert auth.status_code == 2 and auth.attributes["error.type"] == "status_401"
    root = spans["POST /v1/chat/completions"]
    assert root.attributes["http.response.status_code"] == 401
    assert root.status_code == 0  # a 4xx is the client's: the server span's status stays unset


def test_failover_is_two_upstream_spans(
    gateway: GatewayProcess, receiver: OtlpReceiver, sims: list[SimProcess]
) -> None:
    faulty = sims[0]
    HTTP.post(faulty.base_url + "/sim/faults", json={"fault_rate": 1.0, "fault_kind": "503"}, timeout=5)
    try:
        for i in range(20):  # until routing picks the faulty backend first (affinity spreads prompts)
            r = post(gateway, chat(f"{PROMPT} failover {i}"))
            assert r.status_code == 200, r.text
            spans = trace_of(receiver, r.headers["x-request-id"], 5)
            attempts = sorted((s for s in spans if s.name == "gateway.upstream"), key=lambda s: s.start_ns)
            if len(attempts) == 2:
                break
        else:
            raise AssertionError("no request was tried on the faulty backend first")
    finally:
        HTTP.post(faulty.base_url + "/sim/faults", json={"reset": True}, timeout=5)
    spans = trace_of(receiver, r.headers["x-request-id"], 6)
    first, second = sorted((s for s in spans if s.name == "gateway.upstream"), key=lambda s: s.start_ns)
    assert (
        first.attributes["gateway.backend"] == "vllm-0" and second.attributes["gateway.backend"] == "vllm-1"
    )
    assert first.status_code == 2 and first.attributes["error.type"] == "status_503"
    assert first.attributes["http.response.status_code"] == 503
    assert second.status_code == 0 and second.attributes["http.response.status_code"] == 200
    assert first.end_ns <= second.start_ns
    assert by_name(spans)["POST /v1/chat/completions"].attributes["http.response.status_code"] == 200


def test_a_5xx_marks_the_request_span_an_error(
    gateway: GatewayProcess, receiver: OtlpReceiver, sims: list[SimProcess]
) -> None:
    """Every backend failing (last of the module gateway's tests: its circuits may open)."""
    for sim in sims:
        HTTP.post(sim.base_url + "/sim/faults", json={"fault_rate": 1.0, "fault_kind": "503"}, timeout=5)
    try:
        r = post(gateway, chat(PROMPT + " all down"))
    finally:
        for sim in sims:
            HTTP.post(sim.base_url + "/sim/faults", json={"reset": True}, timeout=5)
    assert r.status_code >= 500, r.text
    spans = trace_of(receiver, r.headers["x-request-id"], 6)
    root = by_name(spans)["POST /v1/chat/completions"]
    assert root.status_code == 2 and root.attributes["http.response.status_code"] == r.status_code
    assert root.attributes["error.type"] == "upstream_exhausted"
    attempts = [s for s in spans if s.name == "gateway.upstream"]
    assert len(attempts) >= 2 and all(a.status_code == 2 for a in attempts)
    assert "gen_ai.usage.output_tokens" not in root.attributes


@dataclass
class Variant:
    """A gateway with other tracing settings in front of `sims[1]`, and its receiver (None: none)."""

    gw: GatewayProcess
    rx: OtlpReceiver | None


@pytest.fixture(scope="module")
def variants(sims: list[SimProcess]) -> Iterator[dict[str, Variant]]:
    """The gateways the tests below need, started and stopped side by side (each start costs a
    second or more of CPU; one after the other they took most of this module's time)."""
    url = [sims[1].base_url]
    with contextlib.ExitStack() as stack:
        rx = {name: stack.enter_context(OtlpReceiver()) for name in ("prompts", "zero", "503")}
        rx["503"].fail_with = 503
        down = f"http://127.0.0.1:{free_port()}/v1/traces"
        configs = {
            "prompts": traced_config(url, rx["prompts"].url, include_prompts=True),
            "zero": traced_config(url, rx["zero"].url, sample_ratio=0.0),
            "down": traced_config(url, down),
            "503": traced_config(url, rx["503"].url),
            "off": single_pool_config("vllm", url),
        }
        gateways = {name: GatewayProcess(config) for name, config in configs.items()}
        pool = stack.enter_context(ThreadPoolExecutor(len(gateways)))
        stack.callback(lambda: list(pool.map(GatewayProcess.stop, gateways.values())))
        list(pool.map(GatewayProcess.start, gateways.values()))
        yield {name: Variant(gw, rx.get(name)) for name, gw in gateways.items()}


def test_include_prompts_puts_the_messages_on_the_request_span_only(variants: dict[str, Variant]) -> None:
    v = variants["prompts"]  # tracing.include_prompts true
    assert v.rx is not None
    r = post(v.gw, chat(PROMPT + " prompts", stream=True))
    spans = by_name(trace_of(v.rx, r.headers["x-request-id"], 6))
    assert set(spans) == {*CHILDREN, "gateway.relay", "POST /v1/chat/completions"}
    assert spans["gateway.upstream"].attributes["gateway.backend"] == "vllm-0"  # the one backend
    root = spans["POST /v1/chat/completions"].attributes
    assert root["gen_ai.response.finish_reasons"] == ("length",)
    assert PROMPT + " prompts" in root["gen_ai.input.messages"]
    assert all(
        "gen_ai.input.messages" not in s.attributes for n, s in spans.items() if n.startswith("gateway.")
    )


def test_sampling_zero_exports_nothing_but_still_propagates(
    variants: dict[str, Variant], sims: list[SimProcess]
) -> None:
    v = variants["zero"]
    assert v.rx is not None
    for i in range(5):
        assert post(v.gw, chat(f"{PROMPT} zero {i}")).status_code == 200
    v.gw.stop()  # the gateway stopped: it has exported everything it held
    assert v.rx.spans() == [] and v.rx.requests == 0
    sent = engine_headers(sims, "zero 0")["traceparent"]
    assert sent.startswith("00-") and sent.endswith("-00")


@pytest.mark.parametrize("failure", ["down", "503"])
def test_an_exporter_that_is_down_or_failing_never_affects_requests(
    variants: dict[str, Variant], failure: str
) -> None:
    v = variants[failure]
    for i in range(12):
        r = post(v.gw, chat(f"{PROMPT} {failure} {i}", stream=i % 2 == 1))
        assert r.status_code == 200 and r.content
    wait_until(lambda: "trace export to" in v.gw.log(), timeout=5, what="the export failure's log line")
    for i in range(4):  # after the failure too
        assert post(v.gw, chat(f"{PROMPT} {failure} after {i}")).status_code == 200
    time.sleep(2.5 * EXPORT_INTERVAL_S)  # two more export rounds, which fail too
    log = v.gw.log()
    assert log.count("trace export to") == 1, log  # logged once, not per batch
    assert ("connection failed" in log) if failure == "down" else ("HTTP 503" in log)
    if failure == "503":
        assert v.rx is not None and v.rx.requests >= 2


def test_tracing_off_sends_the_engine_no_traceparent(
    variants: dict[str, Variant], sims: list[SimProcess]
) -> None:
    gw = variants["off"].gw
    tp = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    r = HTTP.post(
        gw.base_url + "/v1/chat/completions", json=chat(PROMPT + " off"), headers={"traceparent": tp}
    )
    assert r.status_code == 200
    assert "traceparent" not in engine_headers(sims, "off")
