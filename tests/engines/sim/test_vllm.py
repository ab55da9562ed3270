"""vLLM dialect: every row of shared/ENGINES.md, against a real simulator process."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from engines.sim.launcher import start_all, stop_all
from tests.engines.sim.helpers import TIME_TOOL, USER, WEATHER_TOOL, metric, post, sim, stream
from tests.support import HTTP

pytestmark = pytest.mark.processes

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def _sims() -> Iterator[dict[str, str]]:
    """The module's simulators, started in parallel."""
    procs = {
        "vl": sim(
            "vllm",
            "--model",
            "org/sim-7b",
            "--served-model-name",
            "served",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--enable-prompt-tokens-details",
            "--engine-version",
            "0.11.2",
        ),
        "plain": sim("vllm"),
        "reasoner": sim(
            "vllm",
            "--reasoning-parser",
            "qwen3",
            "--enable-force-include-usage",
            "--exclude-tools-when-tool-choice-none",
            "--tool-call-parser",
            "hermes",
        ),
    }
    start_all(list(procs.values()))
    try:
        yield {k: p.base_url for k, p in procs.items()}
    finally:
        stop_all(list(procs.values()))


@pytest.fixture(scope="module")
def vl(_sims: dict[str, str]) -> str:
    """Tools enabled (hermes), prompt-token details on."""
    return _sims["vl"]


@pytest.fixture(scope="module")
def plain(_sims: dict[str, str]) -> str:
    """No tool flags, no prompt-token details."""
    return _sims["plain"]


@pytest.fixture(scope="module")
def reasoner(_sims: dict[str, str]) -> str:
    """Reasoning parser, forced usage, tools excluded when tool_choice is none."""
    return _sims["reasoner"]


def chat(base: str, **body: Any) -> httpx.Response:
    return post(base, CHAT, {"messages": USER, **body})


def assert_error(
    r: httpx.Response, status: int, message: str, param: str | None = None, err_type: str = "BadRequestError"
) -> None:
    assert r.status_code == status, r.text
    if status == 400 and param and "(parameter=" not in message:  # vLLM 0.32 names it at the end
        message += f" (parameter={param})"
    assert r.json() == {"error": {"message": message, "type": err_type, "param": param, "code": status}}


# ---- endpoints -----------------------------------------------------------------------------------
def test_health_is_empty_200(vl: str) -> None:
    r = HTTP.get(vl + "/health")
    assert r.status_code == 200
    assert r.content == b""


def test_version_load_and_models(vl: str) -> None:
    assert HTTP.get(vl + "/version").json() == {"version": "0.11.2"}
    assert HTTP.get(vl + "/load").json() == {"server_load": 0}
    models = HTTP.get(vl + "/v1/models").json()
    assert models["object"] == "list"
    card = models["data"][0]
    assert (card["id"], card["object"], card["owned_by"], card["root"]) == (
        "served",
        "model",
        "vllm",
        "org/sim-7b",
    )
    assert card["max_model_len"] == 4096
    # vLLM has no /v1/models/{id}, /get_load, /v1/tokenize, /generate
    for path in ("/v1/models/served", "/get_load", "/get_server_info", "/health_generate"):
        assert HTTP.get(vl + path).status_code == 404
    assert HTTP.post(vl + "/generate", json={"text": "x"}).status_code == 404


def test_tokenize_detokenize(vl: str) -> None:
    r = HTTP.post(vl + "/tokenize", json={"prompt": "Hello, world!"}).json()
    assert r["count"] == 4 and len(r["tokens"]) == 4 and r["max_model_len"] == 4096
    assert HTTP.post(vl + "/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": "Hello, world!"}
    msgs = HTTP.post(vl + "/tokenize", json={"messages": USER}).json()
    assert msgs["count"] > 4


def test_metrics_names_and_labels(vl: str) -> None:
    chat(vl, max_tokens=5)
    text = HTTP.get(vl + "/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "vllm:cache_config_info",
    ):
        metric(text, name)
    assert 'vllm:num_requests_running{engine="0",model_name="served"}' in text
    # the batching engine's default KV cache: Llama-3.1-8B on one H100 (docs/simulators.md)
    assert re.search(r'vllm:cache_config_info\{block_size="16",.*num_gpu_blocks="27000"', text)
    assert metric(text, "vllm:generation_tokens_total") >= 5


# ---- non-streaming bodies ------------------------------------------------------------------------
def test_non_stream_dumps_every_field_with_served_name(vl: str) -> None:
    r = chat(vl, model="served", max_tokens=7)
    body = r.json()
    assert list(body) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "prompt_logprobs",
        "prompt_token_ids",
        "prompt_text",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    ]
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == "served"
    assert re.fullmatch(r"vllm-[0-9.]+-[0-9a-f]{8}", body["system_fingerprint"])
    choice = body["choices"][0]
    assert list(choice) == [
        "index",
        "message",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "routed_experts",
    ]
    assert choice["message"] == {
        "role": "assistant",
        "content": choice["message"]["content"],
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }
    assert choice["finish_reason"] == "length" and choice["stop_reason"] is None
    usage = body["usage"]
    assert usage["completion_tokens"] == 7
    assert usage["total_tokens"] == usage["prompt_tokens"] + 7
    details = usage["prompt_tokens_details"]
    assert details == {
        "cached_tokens": details["cached_tokens"],
        "created_cache_tokens": details["created_cache_tokens"],
        "multimodal_tokens": None,
    }
    assert usage["completion_tokens_details"] is None


def test_model_omitted_is_fine_and_prompt_tokens_details_null_by_default(plain: str) -> None:
    body = chat(plain, max_tokens=3).json()
    assert body["model"] == "sim-model"
    assert body["usage"]["prompt_tokens_details"] is None


def test_unknown_model_is_404(vl: str) -> None:
    assert_error(
        chat(vl, model="foo"),
        404,
        "The model `foo` does not exist. Valid aliases: served.",
        "model",
        "NotFoundError",
    )


def test_deterministic_and_seeded(vl: str) -> None:
    a = chat(vl, max_tokens=20).json()["choices"][0]["message"]["content"]
    b = chat(vl, max_tokens=20).json()["choices"][0]["message"]["content"]
    c = chat(vl, max_tokens=20, temperature=0.3).json()["choices"][0]["message"]["content"]
    assert a == b and a != c
    s1 = chat(vl, max_tokens=20, seed=7).json()["choices"][0]["message"]["content"]
    s2 = post(
        vl, CHAT, {"messages": [{"role": "user", "content": "other"}], "max_tokens": 20, "seed": 7}
    ).json()
    assert s1 == s2["choices"][0]["message"]["content"]


def test_stream_and_non_stream_give_the_same_text(vl: str) -> None:
    text = chat(vl, max_tokens=12).json()["choices"][0]["message"]["content"]
    evs = stream(vl, CHAT, {"messages": USER, "max_tokens": 12})
    streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in evs[:-1] if e["choices"])
    assert streamed == text


def test_sampling_fields_have_effect(vl: str) -> None:
    body = chat(vl, max_tokens=200, ignore_eos=True).json()
    assert body["usage"]["completion_tokens"] == 200 and body["choices"][0]["finish_reason"] == "length"
    body = chat(vl, min_tokens=100).json()
    assert body["usage"]["completion_tokens"] >= 100 and body["choices"][0]["finish_reason"] == "stop"
    natural = chat(vl, seed=11).json()
    assert natural["choices"][0]["finish_reason"] == "stop" and natural["choices"][0]["stop_reason"] is None
    words = natural["choices"][0]["message"]["content"].split()
    stop = words[3].strip(".,")
    stopped = chat(vl, seed=11, stop=[stop]).json()["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == stop
    assert stop not in stopped["message"]["content"]
    many = chat(vl, n=3, max_tokens=10).json()
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    assert len({c["message"]["content"] for c in many["choices"]}) == 3
    assert many["usage"]["completion_tokens"] == 30


def test_logprobs(vl: str) -> None:
    choice = chat(vl, max_tokens=4, logprobs=True, top_logprobs=2).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == 4
    assert "".join(c["token"] for c in content) == choice["message"]["content"]
    assert all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 for c in content)


def test_explicit_nulls_are_accepted(vl: str) -> None:
    r = chat(
        vl, n=None, frequency_penalty=None, presence_penalty=None, logprobs=None, stream=None, max_tokens=3
    )
    assert r.status_code == 200


def test_wrong_types_are_400(vl: str) -> None:
    r = chat(vl, n="three")
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "Bad Request" and err["code"] == 400 and "1 validation error" in err["message"]
    bad = HTTP.post(vl + CHAT, content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == 400


def test_unknown_and_engine_only_fields_are_ignored(vl: str) -> None:
    fields = {
        "top_k": 5,
        "min_p": 0.1,
        "repetition_penalty": 1.1,
        "stop_token_ids": [1],
        "skip_special_tokens": True,
        "chat_template_kwargs": {},
        "cache_salt": "x",
        "priority": 0,
        "reasoning_effort": "low",
        "use_beam_search": False,
        "length_penalty": 1.0,
        "bad_words": [],
        "allowed_token_ids": None,
        "prompt_logprobs": None,
        "truncate_prompt_tokens": None,
        "add_special_tokens": False,
        "kv_transfer_params": None,
        "regex": "a+",
        "ebnf": "x",
        "lora_path": "y",
        "totally_unknown": 1,
    }
    assert chat(vl, max_tokens=3, **fields).status_code == 200


def test_context_length_400(vl: str) -> None:
    """vLLM 0.32: a prompt past the context is refused (its tokenizer stops one past the limit: "at
    least 4097"); a max_tokens that does not fit is cut to what does (200, finish "length")."""
    long = [{"role": "user", "content": "word " * 5000}]
    r = post(vl, CHAT, {"messages": long, "max_tokens": 100})
    assert_error(
        r,
        400,
        "This model's maximum context length is 4096 tokens. However, your prompt contains at least 4097 "
        "input tokens, which exceeds this limit even without any output tokens. Please reduce the length "
        "of the input prompt. (parameter=input_tokens, value=4097)",
        "input_tokens",
    )
    near = [{"role": "user", "content": "word " * 4000}]
    cut = post(vl, CHAT, {"messages": near, "max_tokens": 100, "ignore_eos": True})
    assert cut.status_code == 200, cut.text
    usage = cut.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 4096
    assert cut.json()["choices"][0]["finish_reason"] == "length"


# ---- streaming ------------------------------------------------------------------------------------
def test_stream_shapes(vl: str) -> None:
    evs = stream(vl, CHAT, {"messages": USER, "max_tokens": 3})
    assert evs[-1] == "[DONE]"
    chunks = evs[:-1]
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    first = chunks[0]
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert "prompt_token_ids" in first and first["prompt_token_ids"] is None
    middle = chunks[1]["choices"][0]
    assert list(middle) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
    assert list(middle["delta"]) == ["content"]
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "length" and last["delta"]["content"]  # last text + finish together
    assert "stop_reason" in last and last["stop_reason"] is None
    assert all("usage" not in c for c in chunks)  # no stream_options → no usage


@pytest.mark.parametrize(
    ("options", "expect_usage"),
    [({}, False), ({"include_usage": True}, True), ({"include_usage": False}, False)],
)
def test_usage_only_when_include_usage_is_true(vl: str, options: dict[str, Any], expect_usage: bool) -> None:
    evs = stream(vl, CHAT, {"messages": USER, "max_tokens": 4, "stream_options": options})
    usage_chunks = [e for e in evs[:-1] if e["choices"] == []]
    assert bool(usage_chunks) is expect_usage
    if expect_usage:
        usage = usage_chunks[0]["usage"]
        assert list(usage) == ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"]
        assert list(usage["prompt_tokens_details"]) == ["cached_tokens", "created_cache_tokens"]
        assert usage["completion_tokens"] == 4 and evs[-2] is usage_chunks[0]
        assert re.fullmatch(r"vllm-[0-9.]+-[0-9a-f]{8}", usage_chunks[0]["system_fingerprint"])
    else:  # the fingerprint rides on the last chunk instead
        assert evs[-2]["choices"][0]["finish_reason"] and "system_fingerprint" in evs[-2]


def test_usage_chunk_drops_nulls(plain: str) -> None:
    evs = stream(plain, CHAT, {"messages": USER, "max_tokens": 5, "stream_options": {"include_usage": True}})
    usage = evs[-2]["usage"]
    assert usage == {
        "prompt_tokens": usage["prompt_tokens"],
        "total_tokens": usage["prompt_tokens"] + 5,
        "completion_tokens": 5,
    }


def test_force_include_usage(reasoner: str) -> None:
    evs = stream(reasoner, CHAT, {"messages": USER, "max_tokens": 20})
    assert evs[-2]["choices"] == [] and evs[-2]["usage"]["completion_tokens"] == 20


def test_continuous_usage_stats_only_with_include_usage(plain: str) -> None:
    evs = stream(
        plain,
        CHAT,
        {
            "messages": USER,
            "max_tokens": 3,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    assert all("usage" in e for e in evs[:-1])
    assert [e["usage"]["completion_tokens"] for e in evs[:-2]] == [0, 1, 2, 3]
    evs = stream(
        plain,
        CHAT,
        {
            "messages": USER,
            "max_tokens": 3,
            "stream_options": {"include_usage": False, "continuous_usage_stats": True},
        },
    )
    assert all("usage" not in e for e in evs[:-1])


def test_stream_options_without_stream(vl: str) -> None:
    r = chat(vl, stream_options={"include_usage": True})
    assert_error(r, 400, "Stream options can only be defined when `stream=True`.", "stream_options")
    assert chat(vl, stream_options={}, max_tokens=2).status_code == 200  # `{}` is falsy in vLLM's check


def test_n_streams_interleave(vl: str) -> None:
    evs = stream(vl, CHAT, {"messages": USER, "max_tokens": 3, "n": 2})
    indexes = [e["choices"][0]["index"] for e in evs[:-1]]
    assert indexes[:2] == [0, 1] and indexes.count(0) == indexes.count(1) == 4


# ---- tools ---------------------------------------------------------------------------------------
def test_auto_tools_need_both_flags(plain: str) -> None:
    r = chat(plain, tools=[WEATHER_TOOL])
    assert_error(
        r, 400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
    )
    assert_error(
        chat(plain, tools=[WEATHER_TOOL], tool_choice="required"),
        400,
        'tool_choice="required" requires --tool-call-parser to be set',
    )
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert_error(
        chat(plain, tools=[WEATHER_TOOL], tool_choice=named),
        400,
        'tool_choice=function "get_weather" requires --tool-call-parser to be set',
    )
    assert chat(plain, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=2).status_code == 200


def test_tool_choice_validation(vl: str) -> None:
    assert_error(
        chat(vl, tool_choice="auto"), 400, "When using `tool_choice`, `tools` must be set.", "tool_choice"
    )
    named = {"type": "function", "function": {"name": "foo"}}
    assert_error(
        chat(vl, tools=[WEATHER_TOOL], tool_choice=named),
        400,
        "The tool specified in `tool_choice` does not match any of the specified `tools`",
        "tool_choice",
    )


def check_weather_args(arguments: str) -> None:
    args = json.loads(arguments)
    assert isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit")
    assert 1 <= args["days"] <= 7 and isinstance(args["where"]["lat"], float | int)


def test_auto_tool_call(vl: str) -> None:
    body = chat(vl, tools=[WEATHER_TOOL, TIME_TOOL]).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["content"] is None
    (call,) = msg["tool_calls"]
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{32}", call["id"]) and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    check_weather_args(call["function"]["arguments"])
    # the rule: tools named in the last user message are called; "no tools" → text; after a tool result → text
    named = post(
        vl,
        CHAT,
        {
            "messages": [{"role": "user", "content": "use get_time please"}],
            "tools": [WEATHER_TOOL, TIME_TOOL],
        },
    ).json()
    assert [c["function"]["name"] for c in named["choices"][0]["message"]["tool_calls"]] == ["get_time"]
    both = post(
        vl,
        CHAT,
        {
            "messages": [{"role": "user", "content": "get_time and get_weather"}],
            "tools": [WEATHER_TOOL, TIME_TOOL],
        },
    ).json()
    assert len(both["choices"][0]["message"]["tool_calls"]) == 2
    text = post(
        vl, CHAT, {"messages": [{"role": "user", "content": "no tools, just talk"}], "tools": [WEATHER_TOOL]}
    ).json()["choices"][0]
    assert text["finish_reason"] == "stop" and "tool_calls" not in text["message"]
    after = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"},
    ]
    done = post(vl, CHAT, {"messages": after, "tools": [WEATHER_TOOL]}).json()["choices"][0]
    assert done["finish_reason"] == "stop" and done["message"]["content"]


def test_named_and_required_tool_calls(vl: str) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    choice = chat(vl, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice=named).json()["choices"][0]
    assert choice["finish_reason"] == "stop"  # vLLM: named function finishes with "stop"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_time"
    req = chat(
        vl, tools=[WEATHER_TOOL], tool_choice="required", messages=[{"role": "user", "content": "no tools"}]
    ).json()["choices"][0]
    assert req["finish_reason"] == "tool_calls" and req["message"]["tool_calls"]


def test_streamed_tool_call_deltas(vl: str) -> None:
    evs = stream(vl, CHAT, {"messages": USER, "tools": [WEATHER_TOOL]})
    deltas = [e["choices"][0]["delta"] for e in evs[1:-1]]
    first = deltas[0]["tool_calls"][0]
    assert list(first) == ["index", "id", "type", "function"] and first["function"] == {"name": "get_weather"}
    assert first["id"].startswith("chatcmpl-tool-")
    rest = [d["tool_calls"][0] for d in deltas[1:]]
    assert all(r.keys() == {"index", "function"} and r["function"].keys() == {"arguments"} for r in rest)
    check_weather_args("".join(r["function"]["arguments"] for r in rest))
    assert evs[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_choice_none_still_renders_tools(vl: str, reasoner: str) -> None:
    with_tools = chat(vl, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=1).json()["usage"][
        "prompt_tokens"
    ]
    without = chat(vl, max_tokens=1).json()["usage"]["prompt_tokens"]
    assert with_tools > without + 20
    excluded = chat(reasoner, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=1).json()["usage"]
    assert excluded["prompt_tokens"] == without


# ---- structured output -----------------------------------------------------------------------------
def test_response_format(vl: str) -> None:
    obj = chat(vl, response_format={"type": "json_object"}).json()["choices"][0]["message"]["content"]
    assert isinstance(json.loads(obj), dict)
    schema = WEATHER_TOOL["function"]["parameters"]  # type: ignore[index]
    rf = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}
    check_weather_args(chat(vl, response_format=rf).json()["choices"][0]["message"]["content"])


def test_structured_outputs_and_removed_guided_fields(vl: str) -> None:
    regex = chat(vl, structured_outputs={"regex": r"\d{3}-[a-z]{2}"}).json()["choices"][0]["message"][
        "content"
    ]
    assert re.fullmatch(r"\d{3}-[a-z]{2}", regex)
    choice = chat(vl, structured_outputs={"choice": ["yes", "no"]}).json()["choices"][0]["message"]["content"]
    assert choice in ("yes", "no")
    ignored = chat(vl, guided_json={"type": "object"}, guided_choice=["a"], max_tokens=10)
    assert ignored.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(ignored.json()["choices"][0]["message"]["content"])


# ---- reasoning ---------------------------------------------------------------------------------------
def test_reasoning_field(reasoner: str) -> None:
    msg = chat(reasoner).json()["choices"][0]["message"]
    assert msg["reasoning"] and msg["content"] and "reasoning_content" not in msg
    off = chat(reasoner, chat_template_kwargs={"enable_thinking": False}).json()["choices"][0]["message"]
    assert off["reasoning"] is None
    evs = stream(reasoner, CHAT, {"messages": USER})
    kinds = [next(iter(e["choices"][0]["delta"])) for e in evs[1:-2]]
    assert kinds[0] == "reasoning" and kinds[-1] == "content"


# ---- legacy completions ----------------------------------------------------------------------------
def test_completions(vl: str) -> None:
    body = post(vl, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 5, "logprobs": 2}).json()
    assert (
        body["id"].startswith("cmpl-") and body["object"] == "text_completion" and body["model"] == "served"
    )
    choice = body["choices"][0]
    assert list(choice) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "prompt_logprobs",
        "prompt_token_ids",
        "routed_experts",
    ]
    assert len(choice["logprobs"]["tokens"]) == 5 and body["usage"]["prompt_tokens"] == 4
    echo = post(vl, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 5, "echo": True}).json()
    assert echo["choices"][0]["text"].startswith("Once upon a time")
    evs = stream(
        vl,
        "/v1/completions",
        {"prompt": "Once upon a time", "max_tokens": 3, "stream_options": {"include_usage": True}},
    )
    assert [e["choices"][0]["text"] != "" for e in evs[:3]] == [True] * 3
    assert evs[2]["choices"][0]["finish_reason"] == "length" and evs[3]["usage"]["completion_tokens"] == 3


# ---- the real SDK --------------------------------------------------------------------------------
def test_openai_sdk(vl: str) -> None:
    client = openai.OpenAI(base_url=vl + "/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(model="served", messages=USER, max_tokens=6)  # type: ignore[arg-type]
    assert (
        out.choices[0].finish_reason == "length"
        and out.usage is not None
        and out.usage.completion_tokens == 6
    )
    chunks = list(
        client.chat.completions.create(
            model="served",
            messages=USER,
            max_tokens=6,
            stream=True,  # type: ignore[call-overload]
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == 6
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == out.choices[0].message.content
    tool = client.chat.completions.create(model="served", messages=USER, tools=[WEATHER_TOOL])  # type: ignore[arg-type, list-item]
    assert tool.choices[0].message.tool_calls[0].function.name == "get_weather"  # type: ignore[index, union-attr]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=USER)  # type: ignore[arg-type]
    comp = client.completions.create(model="served", prompt="Say hi", max_tokens=3)
    assert comp.choices[0].text and comp.usage is not None and comp.usage.completion_tokens == 3


def test_include_reasoning_false_and_token_ids(reasoner: str, vl: str) -> None:
    hidden = chat(reasoner, include_reasoning=False).json()["choices"][0]["message"]
    assert hidden["reasoning"] is None and hidden["content"]
    evs = stream(reasoner, CHAT, {"messages": USER, "include_reasoning": False})
    assert all("reasoning" not in e["choices"][0]["delta"] for e in evs[:-2] if e["choices"])
    body = chat(vl, max_tokens=4, return_token_ids=True).json()
    assert len(body["choices"][0]["token_ids"]) == 4 and body["prompt_token_ids"]
    assert len(body["prompt_token_ids"]) == body["usage"]["prompt_tokens"]
