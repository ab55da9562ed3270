"""Conformance through the gateway with the real `openai` SDK, parametrised over both engine pools.

Every test runs once against a gateway in front of vLLM-dialect simulators and once in front of
SGLang-dialect simulators; the client-visible result must be the same, and OpenAI's.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.conftest import MODEL
from tests.support import GatewayProcess

ENGINE_EXTRAS = (
    "matched_stop",
    "metadata",
    "stop_reason",
    "token_ids",
    "prompt_token_ids",
    "kv_transfer_params",
    "prompt_logprobs",
    "reasoning",
)
MESSAGES: list[Any] = [{"role": "user", "content": "Tell me about the sea."}]
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def client(pool_gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=pool_gateway.base_url + "/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def http(pool_gateway: GatewayProcess) -> httpx.Client:
    return httpx.Client(base_url=pool_gateway.base_url, timeout=30)


def _sse(text: str) -> list[Any]:
    events = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [orjson.loads(e) for e in events[:-1]]


def _no_extras(obj: Any) -> None:
    if isinstance(obj, dict):
        for key in ENGINE_EXTRAS:
            assert key not in obj, f"engine field {key!r} leaked: {obj}"
        for value in obj.values():
            _no_extras(value)
    elif isinstance(obj, list):
        for value in obj:
            _no_extras(value)


# -- non-streamed ---------------------------------------------------------------------------------
def test_chat_completion_shape(http: httpx.Client, engine: str) -> None:
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 12})
    assert r.status_code == 200, r.text
    body = r.json()
    assert re.fullmatch(r"chatcmpl-[A-Za-z0-9]{29}", body["id"])
    assert body["object"] == "chat.completion"
    assert body["model"] == MODEL
    choice = body["choices"][0]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    assert choice["message"]["refusal"] is None
    assert choice["logprobs"] is None
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 0 < usage["completion_tokens"] <= 12
    assert "cached_tokens" in usage["prompt_tokens_details"]
    assert "reasoning_tokens" in usage["completion_tokens_details"]
    _no_extras(body)
    assert re.fullmatch(r"req_[0-9a-f]{32}", r.headers["x-request-id"])
    assert r.headers["x-gateway-pool"] == engine
    assert r.headers["x-gateway-route"]


def test_sdk_non_stream(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8)
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens <= 8


def test_no_backend_address_in_headers_or_body(http: httpx.Client, pool_gateway: GatewayProcess) -> None:
    urls = [b["url"] for p in pool_gateway.config["pools"] for b in p["backends"]]
    ports = [u.rsplit(":", 1)[1] for u in urls]
    for payload in (
        {"model": MODEL, "messages": MESSAGES},
        {"model": MODEL, "messages": MESSAGES, "stream": True},
        {"model": "nope", "messages": MESSAGES},
        {"model": MODEL, "messages": MESSAGES, "tool_choice": "required"},
    ):
        r = http.post("/v1/chat/completions", json=payload)
        blob = r.text + " ".join(f"{k}: {v}" for k, v in r.headers.items())
        assert "127.0.0.1" not in blob
        for port in ports:
            assert f":{port}" not in blob


def test_legacy_completions(http: httpx.Client) -> None:
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("cmpl-")
    assert body["object"] == "text_completion"
    assert isinstance(body["choices"][0]["text"], str)
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    _no_extras(body)


def test_legacy_completions_stream(http: httpx.Client) -> None:
    r = http.post(
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": "Once",
            "max_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    chunks = _sse(r.text)
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1] if c["choices"])


# -- streamed -------------------------------------------------------------------------------------
def test_stream_shape_without_usage(http: httpx.Client) -> None:
    r = http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 10, "stream": True}
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks = _sse(r.text)
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in chunks)
    assert all("usage" not in c or c["usage"] is None for c in chunks), "usage only when asked"
    first = chunks[0]["choices"][0]
    assert first["delta"]["role"] == "assistant" and first["delta"]["content"] == ""
    last = chunks[-1]["choices"][0]
    assert last["delta"] == {} and last["finish_reason"] in ("stop", "length")
    for c in chunks[:-1]:
        assert c["choices"][0]["finish_reason"] is None
    for c in chunks:
        _no_extras(c)


def test_stream_usage_exactly_when_asked(http: httpx.Client) -> None:
    r = http.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": MESSAGES,
            "max_tokens": 10,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    chunks = _sse(r.text)
    assert chunks[-1]["choices"] == []
    usage = chunks[-1]["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert all(c["usage"] is None for c in chunks[:-1])
    r = http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "max_tokens": 10, "stream": True, "stream_options": {}},
    )
    assert all(c.get("usage") is None for c in _sse(r.text)), "stream_options {} does not ask for usage"


def test_sdk_stream_text_matches_non_stream_length(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=9, stream=True, stream_options={"include_usage": True}
    )
    text = ""
    usage = None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage
    assert text
    assert usage is not None and 0 < usage.completion_tokens <= 9


# -- tools ----------------------------------------------------------------------------------------
def test_tool_call_non_stream(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=[WEATHER_TOOL], tool_choice="required"
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls and re.fullmatch(r"call_[A-Za-z0-9]{24}", calls[0].id)
    assert calls[0].type == "function" and calls[0].function.name == "get_weather"
    assert "city" in orjson.loads(calls[0].function.arguments)


def test_tool_call_stream_assembles(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model=MODEL, messages=MESSAGES, tools=[WEATHER_TOOL], tool_choice="required"
    ) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert calls and re.fullmatch(r"call_[A-Za-z0-9]{24}", calls[0].id), calls
    assert calls[0].function.name == "get_weather"
    assert "city" in orjson.loads(calls[0].function.arguments)
    assert final.choices[0].finish_reason == "tool_calls"


def test_named_tool_choice_finish_reason(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = completion.choices[0]
    assert choice.message.tool_calls and choice.message.tool_calls[0].function.name == "get_weather"
    assert choice.finish_reason == "stop"  # OpenAI's documented value for a forced function


def test_json_object_response_format(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, response_format={"type": "json_object"}, max_tokens=200
    )
    content = completion.choices[0].message.content
    assert content is not None
    assert isinstance(orjson.loads(content), dict)


# -- errors ---------------------------------------------------------------------------------------
def _error(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    err = _error(info.value)
    assert err["code"] == "model_not_found" and err["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": []}, "tools"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"top_logprobs": 3}, "top_logprobs"),
    ],
)
def test_validation_errors_alike(http: httpx.Client, extra: dict[str, Any], param: str) -> None:
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"


def test_context_length_exceeded(client: openai.OpenAI) -> None:
    long_text = "word " * 40000
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long_text}])
    assert _error(info.value)["code"] == "context_length_exceeded"


def test_bad_json_is_400(http: httpx.Client) -> None:
    r = http.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_models_endpoints(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_health_endpoints(http: httpx.Client) -> None:
    assert http.get("/healthz").status_code == 200
    # what vLLM and SGLang serve, and what their load generators (guidellm) probe before a run
    health = http.get("/health")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert http.head("/health").status_code == 200
    assert http.post("/health").status_code == 404
    assert http.get("/readyz").status_code == 200
    metrics = http.get("/metrics")
    assert metrics.status_code == 200 and "gateway_requests_total" in metrics.text


def test_invalid_utf8_is_a_clear_400(http: httpx.Client) -> None:
    body = b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "caf\xe9"}]}'
    r = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert "UTF-8" in r.json()["error"]["message"]
