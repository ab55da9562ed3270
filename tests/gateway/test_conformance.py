"""Conformance through the gateway with the real `openai` SDK, parametrised over engine pools.

The `pool` fixture says what the gateway fronts. Here: two vLLM-dialect simulators, or two
SGLang-dialect simulators (`vllm-sim`, `sglang-sim`). `tests/real_engines/test_conformance.py` runs
these same functions (imported, not copied) with `pool` a real vLLM 0.32 or SGLang 0.5.23 server
(`vllm-real`, `sglang-real`). The client-visible result must be the same for all four, and OpenAI's.

The real servers serve a tiny model with random weights, so for them a test cannot assert what the
model writes: that the text is non-empty (the first token may end the turn), that a `required` tool
call is complete (the model does not finish the JSON array within `max_tokens`: no call comes back),
that a named call's arguments are a finished JSON object (the grammar starts the object, the model
keeps writing the string until `max_tokens`), or that a JSON-mode answer closes its object. Where a
test meets one of these, it asserts for the real pools what stays true — status, shape, the forced
tool *name*, the finish_reason rule (`length` exactly when the output was cut) — and says so.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.real_engines.rig import real_pool_config
from tests.support import GatewayProcess

pytestmark = pytest.mark.processes

ENGINE_EXTRAS = (
    "matched_stop",
    "metadata",
    "weight_versions",
    "stop_reason",
    "token_ids",
    "prompt_token_ids",
    "prompt_text",
    "kv_transfer_params",
    "ec_transfer_params",
    "routed_experts",
    "metrics",
    "prompt_logprobs",
    "reasoning",  # vLLM's name; the gateway's is reasoning_content (docs/engines.md)
    "audio",
    "function_call",
    "created_cache_tokens",
    "multimodal_tokens",
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


@dataclass(frozen=True)
class Pool:
    """What a conformance gateway fronts: two simulators of `dialect`, or one real engine server."""

    dialect: str
    real_url: str | None = None  # a real engine server's base URL; None: simulators
    served: str | None = None  # the real server's model name

    @property
    def real(self) -> bool:
        return self.real_url is not None

    @property
    def name(self) -> str:
        return f"{self.dialect}-{'real' if self.real else 'sim'}"


@pytest.fixture(scope="module", params=["vllm", "sglang"], ids=["vllm-sim", "sglang-sim"])
def pool(request: pytest.FixtureRequest) -> Pool:
    return Pool(str(request.param))


@pytest.fixture(scope="module")
def pool_gateway(pool: Pool) -> Iterator[GatewayProcess]:
    """One gateway in front of `pool` (module-scoped, per pool)."""
    with contextlib.ExitStack() as stack:
        if pool.real_url is None:
            sims = [stack.enter_context(fast_sim(pool.dialect)) for _ in range(2)]
            config = single_pool_config(pool.dialect, [s.base_url for s in sims])
        else:
            assert pool.served is not None
            config = real_pool_config(pool.dialect, [pool.real_url], pool.served)
        yield stack.enter_context(GatewayProcess(config))


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
def test_chat_completion_shape(http: httpx.Client, pool: Pool) -> None:
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 12})
    assert r.status_code == 200, r.text
    body = r.json()
    assert re.fullmatch(r"chatcmpl-[A-Za-z0-9]{29}", body["id"])
    assert body["object"] == "chat.completion"
    assert body["model"] == MODEL
    choice = body["choices"][0]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    if not pool.real:  # random weights: the first token may end the turn, leaving no text
        assert choice["message"]["content"]
    assert choice["message"]["refusal"] is None
    assert choice["message"]["annotations"] == []
    assert "tool_calls" not in choice["message"] and "reasoning_content" not in choice["message"]
    assert choice["logprobs"] is None
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 0 < usage["completion_tokens"] <= 12
    assert (choice["finish_reason"] == "length") == (usage["completion_tokens"] == 12)
    assert set(usage["prompt_tokens_details"]) == {"cached_tokens", "audio_tokens"}
    assert set(usage["completion_tokens_details"]) == {
        "reasoning_tokens",
        "audio_tokens",
        "accepted_prediction_tokens",
        "rejected_prediction_tokens",
    }
    assert body["system_fingerprint"] is None and body["service_tier"] is None  # vLLM sends a string
    assert set(body) == {
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "service_tier",
        "system_fingerprint",
    }
    _no_extras(body)
    assert re.fullmatch(r"req_[0-9a-f]{32}", r.headers["x-request-id"])
    assert r.headers["x-gateway-pool"] == pool.dialect
    assert r.headers["x-gateway-route"]


def test_sdk_non_stream(client: openai.OpenAI, pool: Pool) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8)
    content = completion.choices[0].message.content
    assert isinstance(content, str)
    if not pool.real:  # random weights may end the turn at once
        assert content
    assert completion.usage is not None and completion.usage.completion_tokens <= 8


def test_no_backend_address_in_headers_or_body(http: httpx.Client, pool_gateway: GatewayProcess) -> None:
    urls = [b["url"] for p in pool_gateway.config["pools"] for b in p["backends"]]
    ports = [u.rsplit(":", 1)[1] for u in urls]
    for payload in (
        {"model": MODEL, "messages": MESSAGES, "max_tokens": 8},
        {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "stream": True},
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


def test_legacy_completions_stream(http: httpx.Client, pool: Pool) -> None:
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
    text = "".join(c["choices"][0]["text"] for c in chunks[:-1] if c["choices"])
    assert text or pool.real  # random weights may end at once
    finishes = [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"]]
    assert finishes[-1] in ("stop", "length") and not any(finishes[:-1])
    for c in chunks:
        _no_extras(c)


BATCH = ["Once upon a time", "The quick brown fox jumps over the lazy dog"]


def _prompt_tokens(client: openai.OpenAI, prompt: str) -> int:
    usage = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1).usage
    assert usage is not None
    return usage.prompt_tokens


@pytest.mark.parametrize("n", [1, 2])
def test_sdk_prompt_list(client: openai.OpenAI, n: int) -> None:
    """A list prompt: one choice per prompt and sample (index = prompt * n + sample), usage over all
    prompts, on every pool alike (`ignore_eos`: the random real model writes exactly max_tokens)."""
    completion = client.completions.create(
        model=MODEL, prompt=BATCH, max_tokens=3, n=n, echo=True, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in completion.choices] == list(range(2 * n))
    for c in completion.choices:
        assert c.text.startswith(BATCH[c.index // n])
        assert c.finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 3 * 2 * n
    assert completion.usage.prompt_tokens == sum(_prompt_tokens(client, p) for p in BATCH)
    _no_extras(completion.model_dump())


def test_sdk_prompt_list_stream(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model=MODEL,
        prompt=BATCH,
        max_tokens=3,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    texts: dict[int, str] = {}
    finishes: dict[int, list[str | None]] = {}
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            finishes.setdefault(c.index, []).append(c.finish_reason)
    assert sorted(texts) == [0, 1, 2, 3]
    assert all(f[-1] == "length" and not any(f[:-1]) for f in finishes.values())
    assert usage is not None and usage.completion_tokens == 12
    assert usage.prompt_tokens == sum(_prompt_tokens(client, p) for p in BATCH)


@pytest.mark.parametrize(
    ("prompt", "param"),
    [([], "prompt"), (["Hello", ""], "prompt[1]"), ([[1, 2], []], "prompt[1]"), ([[3, -1]], "prompt[0][1]")],
)
def test_bad_prompt_lists_alike(http: httpx.Client, prompt: Any, param: str) -> None:
    """Refused by the gateway for every pool (SGLang would serve an empty prompt of a batch, and its
    scheduler died on an empty or negative token array: docs/engines.md)."""
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


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
    assert first["delta"] == {"role": "assistant", "content": "", "refusal": None}
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


def test_sdk_stream_text_matches_non_stream_length(client: openai.OpenAI, pool: Pool) -> None:
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
    assert text or pool.real  # random weights may end the turn at once
    assert usage is not None and 0 < usage.completion_tokens <= 9


# -- tools ----------------------------------------------------------------------------------------
TOOL_MAX_TOKENS = 60  # a simulator's call fits; it bounds a real random model's run
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _cut_short(choice: Any, completion_tokens: int) -> None:
    """A real engine under `required` with random weights: the model did not finish the JSON array of
    calls the engine constrains it to within max_tokens. Whole, no call is parsed (content is text);
    streamed, vLLM may have sent the call's first deltas. Either way the turn was cut."""
    assert choice.finish_reason == "length"
    assert completion_tokens == TOOL_MAX_TOKENS
    for call in choice.message.tool_calls or []:
        assert call.function.name == "get_weather"
    if not choice.message.tool_calls:
        assert isinstance(choice.message.content, str)


def test_tool_call_non_stream(client: openai.OpenAI, pool: Pool) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=TOOL_MAX_TOKENS,
    )
    choice = completion.choices[0]
    calls = choice.message.tool_calls
    assert completion.usage is not None
    if pool.real and choice.finish_reason == "length":
        return _cut_short(choice, completion.usage.completion_tokens)
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert calls and re.fullmatch(r"call_[A-Za-z0-9]{24}", calls[0].id)
    assert calls[0].type == "function" and calls[0].function.name == "get_weather"
    if not pool.real:  # a real random model's arguments need not be valid JSON
        assert "city" in orjson.loads(calls[0].function.arguments)


def test_tool_call_stream_assembles(client: openai.OpenAI, pool: Pool) -> None:
    with client.chat.completions.stream(
        model=MODEL,
        messages=MESSAGES,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=TOOL_MAX_TOKENS,
        stream_options={"include_usage": True},
    ) as stream:
        for _ in stream:  # the SDK's own accumulator assembles the deltas
            pass
        # (get_final_completion() refuses a "length" finish, which a real random model may give)
        final = stream.current_completion_snapshot
    choice = final.choices[0]
    calls = choice.message.tool_calls
    assert final.usage is not None
    if pool.real and choice.finish_reason == "length":
        return _cut_short(choice, final.usage.completion_tokens)
    assert calls and re.fullmatch(r"call_[A-Za-z0-9]{24}", calls[0].id), calls
    assert calls[0].function.name == "get_weather"
    if not pool.real:
        assert "city" in orjson.loads(calls[0].function.arguments)
    assert choice.finish_reason == "tool_calls"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_named_tool_choice_finish_reason(client: openai.OpenAI, pool: Pool, stream: bool) -> None:
    """A forced function finishes with "stop" (OpenAI's documented value), or "length" when cut.

    Real engines with random weights: vLLM constrains the output to the tool's parameters (with the
    servers' `disable_any_whitespace` structured-output setting the arguments open as an object), so
    the forced call always comes back, but the model may write the string value until max_tokens;
    SGLang 0.5.23 forces the name and holds the arguments to *a* JSON value, not the tool's object
    (sampled requests straight to it are cut at max_tokens, the arguments numbers, booleans,
    arrays, strings, or `""` and then the end of the turn: "stop"), and returns a call only when it
    parses. So for them: the name is the forced one
    whenever a call comes, vLLM always sends one, and "length" comes exactly when the output was
    cut — otherwise "stop" and arguments that are JSON (an object but from real SGLang)."""
    # greedy: a real engine's random weights then write the same call every run
    kwargs: dict[str, Any] = {"max_tokens": TOOL_MAX_TOKENS, "temperature": 0.0}
    if stream:
        with client.chat.completions.stream(
            model=MODEL,
            messages=MESSAGES,
            tools=[WEATHER_TOOL],
            tool_choice=NAMED,
            stream_options={"include_usage": True},
            **kwargs,
        ) as events:
            for _ in events:
                pass
            completion = events.current_completion_snapshot
    else:
        completion = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, tools=[WEATHER_TOOL], tool_choice=NAMED, **kwargs
        )
    choice = completion.choices[0]
    calls = choice.message.tool_calls
    assert completion.usage is not None
    if not pool.real or pool.dialect == "vllm":
        assert calls
    for call in calls or []:
        assert call.function.name == "get_weather"
        assert re.fullmatch(r"call_[A-Za-z0-9]{24}", call.id)
    if choice.finish_reason == "length":
        assert pool.real and completion.usage.completion_tokens == TOOL_MAX_TOKENS
        if calls and pool.dialect == "vllm":
            assert calls[0].function.arguments.startswith("{")  # the grammar opened the object
    else:
        assert choice.finish_reason == "stop"
        assert calls
        arguments = _model_json(calls[0].function.arguments)  # JSON, whichever engine
        if not (pool.real and pool.dialect == "sglang"):
            assert isinstance(arguments, dict)


def test_json_object_response_format(client: openai.OpenAI, pool: Pool) -> None:
    completion = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, response_format={"type": "json_object"}, max_tokens=200
    )
    choice = completion.choices[0]
    content = choice.message.content
    assert content is not None
    if choice.finish_reason == "length":
        # random weights: the grammar opens the object, the model may not close it in 200 tokens
        assert pool.real and content.startswith("{")
        assert completion.usage is not None and completion.usage.completion_tokens == 200
    else:
        assert isinstance(_model_json(content), dict)


def _model_json(text: str) -> Any:
    """JSON a model wrote under a grammar. The standard library's parser, not orjson: JSON numbers have
    no size limit (RFC 8259), and a random-weight model under SGLang's grammar wrote `1e400`, which
    orjson refuses ("number is infinity when parsed as double") though the text is valid JSON."""
    return json.loads(text)


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
