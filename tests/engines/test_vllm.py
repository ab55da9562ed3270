"""The vLLM dialect: request fields, literal vLLM payloads, errors, metrics."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from engines.base import Delta, ToolCallDelta, Usage
from engines.errors import ApiError
from engines.vllm import DIALECT as V
from tests.engines import payloads as p
from tests.engines.robustness import check_dialect_robust

CHAT: dict[str, Any] = {"model": "pub", "messages": [{"role": "user", "content": "hi"}]}


def build(endpoint: Any = "chat", **fields: Any) -> dict[str, Any]:
    base = CHAT if endpoint == "chat" else {"model": "pub", "prompt": "x"}
    return orjson.loads(V.build_request(endpoint, {**base, **fields}, "served"))  # type: ignore[no-any-return]


def rejects(param: str, endpoint: Any = "chat", **fields: Any) -> None:
    with pytest.raises(ApiError) as ei:
        build(endpoint, **fields)
    assert ei.value.status == 400 and ei.value.param == param and param in ei.value.message


def test_common_request_rules() -> None:
    body = {
        **CHAT,
        "stream": True,
        "stream_options": {"include_usage": False},
        "n": None,
        "temperature": None,
    }
    out = orjson.loads(V.build_request("chat", body, "served"))
    assert out == {**CHAT, "model": "served", "stream": True, "stream_options": {"include_usage": True}}
    assert body["model"] == "pub" and body["n"] is None  # not mutated
    assert build(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})[
        "stream_options"
    ] == {"include_usage": True, "continuous_usage_stats": True}
    assert build(stream=True, stream_options={"continuous_usage_stats": True})["stream_options"] == {
        "include_usage": True
    }
    assert "stream_options" not in build(stream=False, stream_options={"include_usage": True})
    tools = [{"type": "function", "function": {"name": "f"}}]
    out = build(tools=tools, tool_choice="none", parallel_tool_calls=True)
    assert "tools" not in out and "tool_choice" not in out and "parallel_tool_calls" not in out
    assert build(tools=tools, tool_choice="auto")["tools"] == tools
    assert "rid" not in build(rid="abc")


def test_structured_output_translation() -> None:
    assert build(guided_json={"type": "object"})["structured_outputs"] == {"json": {"type": "object"}}
    assert build(guided_json='{"type": "object"}')["structured_outputs"] == {"json": {"type": "object"}}
    assert build(guided_regex="a+")["structured_outputs"] == {"regex": "a+"}
    assert build(guided_choice=["a", "b"])["structured_outputs"] == {"choice": ["a", "b"]}
    assert build(guided_grammar="root ::= 'a'")["structured_outputs"] == {"grammar": "root ::= 'a'"}
    assert build(guided_json={"type": "object"}, guided_whitespace_pattern=" ")["structured_outputs"] == {
        "json": {"type": "object"},
        "whitespace_pattern": " ",
    }
    out = build(regex="[0-9]+")
    assert out["structured_outputs"] == {"regex": "[0-9]+"} and "regex" not in out
    out = build("completions", ebnf="root ::= 'x'")
    assert out["structured_outputs"] == {"grammar": "root ::= 'x'"} and "ebnf" not in out
    so = {"json": {"type": "object"}, "disable_any_whitespace": True}
    assert build(structured_outputs=so)["structured_outputs"] == so
    assert "guided_decoding_backend" not in build(guided_regex="a", guided_decoding_backend="xgrammar")
    for k in ("guided_json", "guided_regex", "guided_choice", "guided_grammar"):
        assert k not in build(**{k: ["a"] if k == "guided_choice" else "a" if k != "guided_json" else {}})


def test_structured_output_conflicts() -> None:
    rejects("regex", guided_json={}, regex="a")
    rejects("guided_regex", response_format={"type": "json_object"}, guided_regex="a")
    rejects("structured_outputs", structured_outputs={"json": {}, "regex": "a"})
    rejects("guided_json", guided_json="{not json")
    rejects("guided_choice", guided_choice=[])
    tools = [{"type": "function", "function": {"name": "f"}}]
    rejects("response_format", tools=tools, tool_choice="required", response_format={"type": "json_object"})
    rejects("regex", tools=tools, tool_choice={"type": "function", "function": {"name": "f"}}, regex="a")
    assert build(tools=tools, tool_choice="auto", response_format={"type": "json_object"})["response_format"]


def test_sglang_only_fields() -> None:
    assert build(no_stop_trim=True)["include_stop_str_in_output"] is True
    out = build(
        separate_reasoning=True, stream_reasoning=True, return_meta_info=False, return_hidden_states=False
    )
    assert not {"separate_reasoning", "stream_reasoning", "return_meta_info", "return_hidden_states"} & set(
        out
    )
    rejects("separate_reasoning", separate_reasoning=False)
    rejects("stream_reasoning", stream_reasoning=False)
    rejects("return_hidden_states", return_hidden_states=True)
    rejects("stop_regex", stop_regex="a+")
    rejects("lora_path", lora_path="x")
    rejects("custom_params", custom_params={})
    rejects("return_token_ids", return_token_ids=True)
    rejects("kv_transfer_params", kv_transfer_params={"remote_host": "10.0.0.1"})
    rejects("custom_logit_processor", custom_logit_processor="x")


def test_vllm_fields_pass() -> None:
    fields = {
        "use_beam_search": True,
        "length_penalty": 0.5,
        "include_stop_str_in_output": True,
        "bad_words": ["x"],
        "allowed_token_ids": [1],
        "prompt_logprobs": 1,
        "truncate_prompt_tokens": 10,
        "add_generation_prompt": False,
        "chat_template": "{{x}}",
        "include_reasoning": False,
        "thinking_token_budget": 5,
        "top_k": 3,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    out = build(**fields)
    for k, v in fields.items():
        assert out[k] == v


def test_decode_literal_bodies() -> None:
    c = V.decode_response("chat", p.BODIES[3].vllm)
    (ch,) = c.choices
    assert (ch.content, ch.reasoning, ch.finish_reason, ch.tool_calls) == ("42", "Think hard", "stop", None)
    assert c.usage == Usage(9, 20, cached_tokens=4, reasoning_tokens=2)
    c = V.decode_response("chat", p.BODIES[1].vllm)
    (tc,) = c.choices[0].tool_calls or []
    assert (tc.name, tc.arguments) == ("get_weather", '{"city": "Paris"}') and c.choices[0].content is None
    c = V.decode_response("completions", p.BODIES[5].vllm)
    assert c.choices[0].content == "Once upon" and c.choices[0].finish_reason == "length"
    # older builds: reasoning_content
    old = p.v_body({"content": "x", "reasoning_content": "r"}, "stop")
    assert V.decode_response("chat", old).choices[0].reasoning == "r"


def test_stream_decoder_splits_nothing_and_keeps_first_piece() -> None:
    dec = V.stream_decoder("chat")
    sc = p.STREAMS[1]
    events = [dec.feed(c) for c in sc.vllm]
    assert events[0] == []  # role chunk: nothing to say yet
    assert events[1] == [Delta(0, tool_calls=[ToolCallDelta(0, "chatcmpl-tool-8a1b2c", "get_weather", "")])]
    assert events[3] == [
        Delta(0, tool_calls=[ToolCallDelta(0, None, None, '"Paris"}')], finish_reason="tool_calls")
    ]
    assert events[4] == [Usage(9, 20)]
    dec = V.stream_decoder("chat")
    assert dec.feed(p.v_chunk([p.v_choice(content="hi", finish="stop")])) == [
        Delta(0, "hi", finish_reason="stop")
    ]


def test_stream_errors_and_garbage() -> None:
    dec = V.stream_decoder("chat")
    (err,) = dec.feed(p.STREAMS[-1].vllm[-1])
    assert isinstance(err, ApiError) and err.status == 500 and "/opt" not in err.message
    (err,) = dec.feed(b"not json")
    assert isinstance(err, ApiError) and err.status == 500
    (err,) = dec.feed(p.v_chunk([p.v_choice(content="x", finish="abort")]))
    assert isinstance(err, ApiError)
    ctx = orjson.dumps({"error": orjson.loads(p.V_CONTEXT)["error"]})
    (err,) = V.stream_decoder("completions").feed(ctx)
    assert isinstance(err, ApiError) and err.code == "context_length_exceeded" and err.param == "prompt"


def test_decode_error_mapping() -> None:
    e = V.decode_error(400, p.V_CONTEXT)
    assert (e.status, e.type, e.code, e.param) == (
        400,
        "invalid_request_error",
        "context_length_exceeded",
        "messages",
    )
    assert e.message == (
        "This model's maximum context length is 4096 tokens. However, you requested 5100 tokens "
        "(5000 in the messages, 100 in the completion). Please reduce the length of the messages or completion."
    )
    assert V.decode_error(400, p.V_CONTEXT, "completions").param == "prompt"
    e = V.decode_error(400, p.V_CONTEXT_032)
    assert (e.code, e.param) == ("context_length_exceeded", "messages")
    assert e.message == (
        "This model's maximum context length is 4096 tokens. However, your messages resulted in 4097 tokens. "
        "Please reduce the length of the messages."
    )
    e = V.decode_error(404, p.V_UNKNOWN_MODEL)
    assert (e.status, e.code) == (404, "model_not_found")
    e = V.decode_error(400, p.V_VALIDATION)
    assert e.status == 400 and e.type == "invalid_request_error" and "temperature" in e.message
    assert "http" not in e.message and "pydantic.dev" not in e.message
    e = V.decode_error(400, p.V_AUTO_TOOLS)
    assert e.param == "tool_choice" and "--" not in e.message
    e = V.decode_error(500, p.V_500)
    assert (e.status, e.type) == (500, "server_error") and "CUDA" not in e.message and "/usr" not in e.message
    assert V.decode_error(503, b"").status == 503
    assert V.decode_error(401, b'{"error": "Unauthorized"}').status == 500
    assert V.decode_error(400, b"<html>bad</html>").status == 400


def test_parse_metrics() -> None:
    load = V.parse_metrics(p.VLLM_METRICS)
    assert (load.running, load.waiting, load.kv_usage) == (5.0, 1.0, 0.5)
    assert load.prefix_cache_hit_rate == 0.25
    assert (load.prefix_cache_hits, load.prefix_cache_queries) == (250.0, 1000.0)
    old = V.parse_metrics("vllm:gpu_cache_usage_perc 0.3\nvllm:num_requests_running NaN\ngarbage{ line\n")
    assert old.kv_usage == 0.3 and old.running is None
    assert V.parse_metrics("").running is None


def test_robust() -> None:
    check_dialect_robust(V)
