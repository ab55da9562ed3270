"""SGLang dialect: every row of shared/ENGINES.md, against a real simulator process."""

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
NULL_DELTA = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}


@pytest.fixture(scope="module")
def _sims() -> Iterator[dict[str, str]]:
    """The module's simulators, started in parallel."""
    procs = {
        "sg": sim(
            "sglang",
            "--model",
            "org/sim-7b",
            "--served-model-name",
            "served",
            "--enable-metrics",
            "--tool-call-parser",
            "qwen25",
            "--enable-cache-report",
        ),
        "plain": sim("sglang"),
        "reasoner": sim("sglang", "--reasoning-parser", "qwen3", "--stream-response-default-include-usage"),
    }
    start_all(list(procs.values()))
    try:
        yield {k: p.base_url for k, p in procs.items()}
    finally:
        stop_all(list(procs.values()))


@pytest.fixture(scope="module")
def sg(_sims: dict[str, str]) -> str:
    """Metrics, a tool parser and the cache report on."""
    return _sims["sg"]


@pytest.fixture(scope="module")
def plain(_sims: dict[str, str]) -> str:
    """No optional flags."""
    return _sims["plain"]


@pytest.fixture(scope="module")
def reasoner(_sims: dict[str, str]) -> str:
    """Reasoning parser and usage on by default in streams."""
    return _sims["reasoner"]


def chat(base: str, **body: Any) -> httpx.Response:
    return post(base, CHAT, {"messages": USER, **body})


def assert_error(r: httpx.Response, status: int, message: str, err_type: str = "BadRequestError") -> None:
    assert r.status_code == status, r.text
    assert r.json() == {
        "object": "error",
        "message": message,
        "type": err_type,
        "param": None,
        "code": status,
    }


# ---- endpoints -----------------------------------------------------------------------------------
def test_health_and_health_generate(sg: str) -> None:
    for path in ("/health", "/health_generate"):
        r = HTTP.get(sg + path)
        assert r.status_code == 200 and r.content == b""


def test_server_info_load_models(sg: str) -> None:
    assert HTTP.get(sg + "/version").status_code == 404
    assert HTTP.get(sg + "/load").status_code == 404
    for path in ("/get_server_info", "/server_info"):
        info = HTTP.get(sg + path).json()
        assert re.fullmatch(r"\d+\.\d+\.\d+", info["version"]) and info["model_path"] == "org/sim-7b"
    load = HTTP.get(sg + "/get_load").json()
    assert load[0]["num_reqs"] == 0
    models = HTTP.get(sg + "/v1/models").json()
    assert models["data"][0]["id"] == "served" and models["data"][0]["owned_by"] == "sglang"
    assert HTTP.get(sg + "/v1/models/served").json()["id"] == "served"
    assert HTTP.get(sg + "/v1/models/other").status_code == 404


def test_tokenize_paths(sg: str) -> None:
    for path in ("/tokenize", "/v1/tokenize"):
        r = HTTP.post(sg + path, json={"prompt": "Hello, world!"}).json()
        assert r["count"] == 4 and len(r["tokens"]) == 4
    ids = HTTP.post(sg + "/tokenize", json={"prompt": "Hello, world!"}).json()["tokens"]
    assert HTTP.post(sg + "/detokenize", json={"tokens": ids}).json() == {"text": "Hello, world!"}
    chat = HTTP.post(sg + "/v1/tokenize", json={"messages": [{"role": "user", "content": "Hello, world!"}]})
    assert chat.json()["count"] > 4  # rendered with the chat template, as for a chat completion


def test_native_generate(sg: str) -> None:
    r = HTTP.post(
        sg + "/generate", json={"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4}}
    )
    body = r.json()
    assert body["meta_info"]["completion_tokens"] == 4 and body["meta_info"]["prompt_tokens"] == 5
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 4} and body["text"]


def test_metrics_only_with_flag(sg: str, plain: str) -> None:
    assert HTTP.get(plain + "/metrics").status_code == 404
    chat(sg, max_tokens=4)
    text = HTTP.get(sg + "/metrics").text
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:cached_tokens_total",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:time_to_first_token_seconds_count",
        "sglang:inter_token_latency_seconds_count",
        "sglang:e2e_request_latency_seconds_count",
        "sglang:queue_time_seconds_count",
        "sglang:cache_config_info",
        "sglang:max_total_num_tokens",
    ):
        metric(text, name)
    assert re.search(
        r'sglang:num_running_reqs\{engine_type="unified",model_name="served",pp_rank="0",tp_rank="0"\}', text
    )
    assert 'sglang:cache_config_info{page_size="16"}' in text


# ---- non-streaming bodies ------------------------------------------------------------------------
def test_non_stream_shape(sg: str) -> None:
    body = chat(sg, model="whatever-i-like", max_tokens=6).json()
    assert list(body) == ["id", "object", "created", "model", "choices", "usage", "metadata"]
    assert re.fullmatch(r"[0-9a-f]{32}", body["id"])
    assert body["model"] == "whatever-i-like"  # unknown model: 200, name echoed
    assert body["metadata"] == {
        "weight_version": "default",
        "weight_versions": [{"version": "default", "start": 0, "end": 6}],
    }
    choice = body["choices"][0]
    assert list(choice) == ["index", "message", "logprobs", "finish_reason", "matched_stop"]
    assert choice["message"]["reasoning_content"] is None and "tool_calls" not in choice["message"]
    usage = body["usage"]
    assert list(usage) == [
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "reasoning_tokens",
        "completion_tokens_details",
    ]
    assert usage["reasoning_tokens"] == 0 and usage["completion_tokens_details"] is None
    again = chat(sg, model="whatever-i-like", max_tokens=6).json()["usage"]  # same prompt: now cached
    assert again["prompt_tokens_details"]["cached_tokens"] > 0  # only reported when > 0, as SGLang does


def test_model_defaults_and_cache_report_off(plain: str) -> None:
    body = chat(plain, max_tokens=2).json()
    assert body["model"] == "default" and body["usage"]["prompt_tokens_details"] is None


def test_matched_stop(plain: str) -> None:
    natural = chat(plain, seed=3).json()["choices"][0]
    assert natural["finish_reason"] == "stop" and natural["matched_stop"] == 2  # the EOS token id
    stop = natural["message"]["content"].split()[4].strip(".,")
    stopped = chat(plain, seed=3, stop=stop).json()["choices"][0]
    assert stopped["matched_stop"] == stop and stop not in stopped["message"]["content"]
    length = chat(plain, max_tokens=2).json()["choices"][0]
    assert length["finish_reason"] == "length" and length["matched_stop"] is None


def test_content_never_null(sg: str) -> None:
    msg = chat(sg, tools=[WEATHER_TOOL]).json()["choices"][0]["message"]
    assert msg["content"] == "" and msg["tool_calls"]


@pytest.mark.parametrize("field", ["n", "frequency_penalty", "presence_penalty", "logprobs", "stream"])
def test_explicit_null_is_400(plain: str, field: str) -> None:
    r = chat(plain, **{field: None})
    assert r.status_code == 400
    body = r.json()
    assert body["object"] == "error" and body["code"] == 400 and field in body["message"]


def test_engine_only_fields_and_n(plain: str) -> None:
    fields = {
        "top_k": 5,
        "min_p": 0.1,
        "separate_reasoning": True,
        "stream_reasoning": True,
        "no_stop_trim": False,
        "stop_regex": None,
        "lora_path": None,
        "rid": "abc",
        "return_meta_info": False,
        "return_hidden_states": False,
        "custom_params": None,
        "structured_outputs": {"json": {}},
        "use_beam_search": False,
    }
    assert chat(plain, max_tokens=2, **fields).status_code == 200
    many = chat(plain, n=2, max_tokens=3).json()
    assert [c["index"] for c in many["choices"]] == [0, 1] and many["usage"]["completion_tokens"] == 6
    lp = chat(plain, max_tokens=3, logprobs=True, top_logprobs=3).json()["choices"][0]["logprobs"]["content"]
    assert len(lp) == 3 and all(len(t["top_logprobs"]) == 3 for t in lp)


def test_context_length_400(plain: str) -> None:
    long = [{"role": "user", "content": "word " * 5000}]
    r = post(plain, CHAT, {"messages": long})
    n = int(r.json()["message"].split("(")[1].split()[0])
    assert_error(r, 400, f"The input ({n} tokens) is longer than the model's context length (4096 tokens).")
    r = chat(plain, max_tokens=4090)
    n = int(r.json()["message"].split("of ")[2].split()[0]) - 4090
    assert_error(
        r,
        400,
        "Requested token count exceeds the model's maximum context length of 4096 tokens. You "
        f"requested a total of {n + 4090} tokens: {n} tokens from the input messages and 4090 tokens for "
        "the completion. Please reduce the number of tokens in the input messages or the completion to fit "
        "within the limit.",
    )


# ---- streaming ------------------------------------------------------------------------------------
def test_stream_shapes(plain: str) -> None:
    evs = stream(plain, CHAT, {"messages": USER, "max_tokens": 3})
    chunks = evs[:-1]
    assert len({c["id"] for c in chunks}) == 1 and all("usage" not in c for c in chunks)  # off by default
    assert chunks[0]["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": "", "reasoning_content": None},
            "logprobs": None,
            "finish_reason": None,
            "matched_stop": None,
        }
    ]
    for c in chunks[1:4]:
        choice = c["choices"][0]
        assert choice["finish_reason"] is None and choice["matched_stop"] is None
        assert choice["delta"] == {"content": choice["delta"]["content"], "reasoning_content": None}
    final = chunks[4]["choices"][0]  # finish_reason in its own chunk, after the content, (almost) empty delta
    assert final == {
        "index": 0,
        "delta": {"reasoning_content": None},
        "logprobs": None,
        "finish_reason": "length",
        "matched_stop": None,
    }
    assert len(chunks) == 5
    natural = stream(plain, CHAT, {"messages": USER})
    assert (
        natural[-2]["choices"][0]["finish_reason"] == "stop"
        and natural[-2]["choices"][0]["matched_stop"] == 2
    )


def test_stream_usage_only_when_asked(plain: str, reasoner: str) -> None:
    evs = stream(plain, CHAT, {"messages": USER, "max_tokens": 3, "stream_options": {}})
    assert all(e["choices"] for e in evs[:-1])
    evs = stream(plain, CHAT, {"messages": USER, "max_tokens": 3, "stream_options": {"include_usage": True}})
    usage = evs[-2]
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": usage["usage"]["prompt_tokens"],
        "total_tokens": usage["usage"]["prompt_tokens"] + 3,
        "completion_tokens": 3,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }
    evs = stream(
        reasoner, CHAT, {"messages": USER, "max_tokens": 30}
    )  # --stream-response-default-include-usage
    assert evs[-2]["choices"] == [] and evs[-2]["usage"]["completion_tokens"] == 30


def test_continuous_usage_on_its_own(plain: str) -> None:
    evs = stream(
        plain, CHAT, {"messages": USER, "max_tokens": 3, "stream_options": {"continuous_usage_stats": True}}
    )
    # SGLang 0.5.23: the running usage rides on the generated chunks, not the role or finish chunks
    assert "usage" not in evs[0] and "usage" not in evs[-2]
    assert [e["usage"]["completion_tokens"] for e in evs[1:-2]] == [1, 2, 3]
    assert evs[1]["usage"]["total_tokens"] == evs[1]["usage"]["prompt_tokens"] + 1


def test_stream_options_with_stream_false_ignored(plain: str) -> None:
    assert chat(plain, stream_options={"include_usage": True}, max_tokens=2).status_code == 200


# ---- tools ---------------------------------------------------------------------------------------
def test_tool_validation(sg: str) -> None:
    assert_error(
        chat(sg, tool_choice="required"), 400, "Tools cannot be empty if tool choice is set to required."
    )
    named = {"type": "function", "function": {"name": "foo"}}
    assert_error(
        chat(sg, tool_choice=named), 400, "Tools cannot be empty if tool choice is set to a specific tool."
    )
    assert_error(
        chat(sg, tools=[WEATHER_TOOL], tool_choice=named), 400, "Tool 'foo' not found in tools list."
    )


def test_tool_calls_with_parser(sg: str) -> None:
    choice = chat(sg, tools=[WEATHER_TOOL, TIME_TOOL]).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["matched_stop"] is None
    (call,) = choice["message"]["tool_calls"]
    assert re.fullmatch(r"call_[0-9a-f]{24}", call["id"]) and call["function"]["name"] == "get_weather"
    args = json.loads(call["function"]["arguments"])
    assert args["unit"] in ("celsius", "fahrenheit") and 1 <= args["days"] <= 7
    named = {"type": "function", "function": {"name": "get_time"}}
    choice = chat(sg, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice=named).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"  # SGLang: tool_calls even for a named function
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_time"


def test_tools_without_parser_stay_in_content(plain: str) -> None:
    choice = chat(plain, tools=[WEATHER_TOOL]).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    content = choice["message"]["content"]
    assert content.startswith("<tool_call>\n") and '"name": "get_weather"' in content
    named = {"type": "function", "function": {"name": "get_weather"}}
    constrained = chat(plain, tools=[WEATHER_TOOL], tool_choice=named).json()["choices"][0]
    assert "tool_calls" not in constrained["message"]
    assert json.loads(constrained["message"]["content"])["unit"] in ("celsius", "fahrenheit")
    required = chat(plain, tools=[WEATHER_TOOL], tool_choice="required").json()["choices"][0]
    assert json.loads(required["message"]["content"])[0]["name"] == "get_weather"


def test_tool_choice_none_does_not_render_tools(plain: str) -> None:
    with_none = chat(plain, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=1).json()["usage"][
        "prompt_tokens"
    ]
    assert with_none == chat(plain, max_tokens=1).json()["usage"]["prompt_tokens"]


def test_streamed_tool_call_deltas(sg: str) -> None:
    evs = stream(sg, CHAT, {"messages": USER, "tools": [WEATHER_TOOL]})
    deltas = [e["choices"][0]["delta"] for e in evs[1:-2]]
    first = deltas[0]
    assert {k: first[k] for k in ("role", "content", "reasoning_content")} == {
        "role": None,
        "content": None,
        "reasoning_content": None,
    }
    head = first["tool_calls"][0]
    assert list(head) == ["id", "index", "type", "function"]
    assert head["function"] == {"name": "get_weather", "arguments": ""} and head["id"].startswith("call_")
    rest = [d["tool_calls"][0] for d in deltas[1:]]
    assert all(r["id"] is None and r["function"]["name"] is None and r["type"] == "function" for r in rest)
    json.loads("".join(r["function"]["arguments"] for r in rest))
    assert all(e["usage"] is None and e["choices"][0]["matched_stop"] is None for e in evs[1:-2])
    final = evs[-2]["choices"][0]
    assert final["finish_reason"] == "tool_calls" and final["matched_stop"] == 2  # streams keep the EOS match


# ---- structured output -----------------------------------------------------------------------------
def test_constraints(sg: str) -> None:
    assert isinstance(
        json.loads(
            chat(sg, response_format={"type": "json_object"}).json()["choices"][0]["message"]["content"]
        ),
        dict,
    )
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    rf = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    assert isinstance(
        json.loads(chat(sg, response_format=rf).json()["choices"][0]["message"]["content"])["x"], int
    )
    assert "x" in json.loads(chat(sg, schema=json.dumps(schema)).json()["choices"][0]["message"]["content"])
    regex = chat(sg, regex=r"(red|green|blue) [0-9]{2}").json()["choices"][0]["message"]["content"]
    assert re.fullmatch(r"(red|green|blue) [0-9]{2}", regex)
    assert chat(sg, ebnf='root ::= "a"').status_code == 200


# ---- reasoning ---------------------------------------------------------------------------------------
def test_reasoning_content(reasoner: str) -> None:
    body = chat(reasoner).json()
    msg = body["choices"][0]["message"]
    assert msg["reasoning_content"] and msg["content"] and "reasoning" not in msg
    assert body["usage"]["reasoning_tokens"] > 0
    inline = chat(reasoner, separate_reasoning=False).json()["choices"][0]["message"]
    assert inline["reasoning_content"] is None and inline["content"].startswith("<think>")
    off = chat(reasoner, chat_template_kwargs={"enable_thinking": False}).json()
    assert off["choices"][0]["message"]["reasoning_content"] is None and off["usage"]["reasoning_tokens"] == 0
    evs = stream(reasoner, CHAT, {"messages": USER})
    firsts = [e["choices"][0]["delta"] for e in evs[1:3]]
    assert all(list(d) == ["reasoning_content"] and d["reasoning_content"] for d in firsts)


# ---- legacy completions and the SDK ----------------------------------------------------------------
def test_completions(sg: str) -> None:
    body = post(sg, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4}).json()
    assert body["object"] == "text_completion" and re.fullmatch(r"[0-9a-f]{32}", body["id"])
    assert list(body["choices"][0]) == ["index", "text", "logprobs", "finish_reason", "matched_stop"]
    evs = stream(sg, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4})
    assert "".join(e["choices"][0]["text"] for e in evs[:-1]) == body["choices"][0]["text"]


def test_openai_sdk(sg: str) -> None:
    client = openai.OpenAI(base_url=sg + "/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(model="anything", messages=USER, max_tokens=5)  # type: ignore[arg-type]
    assert out.model == "anything" and out.choices[0].message.content
    chunks = list(client.chat.completions.create(model="anything", messages=USER, max_tokens=5, stream=True))  # type: ignore[call-overload]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == out.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    tool = client.chat.completions.create(model="x", messages=USER, tools=[WEATHER_TOOL])  # type: ignore[arg-type, list-item]
    assert tool.choices[0].message.tool_calls[0].function.name == "get_weather"  # type: ignore[index, union-attr]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="x", messages=USER, n=None)  # type: ignore[arg-type]


def test_health_probe_is_not_counted(plain: str) -> None:
    before = HTTP.get(plain + "/sim/stats").json()
    for _ in range(3):
        assert HTTP.get(plain + "/health").status_code == 200
    after = HTTP.get(plain + "/sim/stats").json()
    assert after["completed_total"] == before["completed_total"]
    assert after["prompt_tokens_total"] == before["prompt_tokens_total"]


def test_other_constraint_drops_the_tool_constraint(sg: str) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    choice = chat(sg, tools=[WEATHER_TOOL], tool_choice=named, response_format=rf).json()["choices"][0]
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "stop"
    assert set(json.loads(choice["message"]["content"])) == {"answer"}
