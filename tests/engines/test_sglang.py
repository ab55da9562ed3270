"""The SGLang dialect: request fields, literal SGLang payloads, errors, metrics."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from engines.base import Delta, ToolCallDelta, Usage
from engines.errors import ApiError
from engines.sglang import DIALECT as S
from tests.engines import payloads as p
from tests.engines.robustness import check_dialect_robust

CHAT: dict[str, Any] = {"model": "pub", "messages": [{"role": "user", "content": "hi"}]}


def build(endpoint: Any = "chat", **fields: Any) -> dict[str, Any]:
    base = CHAT if endpoint == "chat" else {"model": "pub", "prompt": "x"}
    return orjson.loads(S.build_request(endpoint, {**base, **fields}, "served"))  # type: ignore[no-any-return]


def rejects(param: str, endpoint: Any = "chat", **fields: Any) -> None:
    with pytest.raises(ApiError) as ei:
        build(endpoint, **fields)
    assert ei.value.status == 400 and ei.value.param == param and param in ei.value.message


def test_nulls_dropped_and_usage_asked() -> None:
    body = {
        **CHAT,
        "n": None,
        "frequency_penalty": None,
        "presence_penalty": None,
        "logprobs": None,
        "stream": True,
    }
    out = orjson.loads(S.build_request("chat", body, "served"))
    assert out == {**CHAT, "model": "served", "stream": True, "stream_options": {"include_usage": True}}
    assert "stream" not in build(stream=None) and "stream_options" not in build(stream=None)


def test_structured_output_translation() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    out = build(structured_outputs={"json": schema})
    assert out["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "schema", "schema": schema},
    }
    assert "structured_outputs" not in out
    assert build(guided_json=schema)["response_format"]["json_schema"]["schema"] == schema
    assert build(structured_outputs={"json_object": True})["response_format"] == {"type": "json_object"}
    assert build(guided_regex="a+")["regex"] == "a+"
    assert build(structured_outputs={"choice": ["yes", "no way"]})["regex"] == "(yes|no way)"
    assert build(guided_grammar="root ::= 'a'")["ebnf"] == "root ::= 'a'"
    out = build("completions", guided_json=schema)
    assert orjson.loads(out["json_schema"]) == schema and "response_format" not in out
    assert build(regex="[0-9]+")["regex"] == "[0-9]+"  # native, untouched
    assert build(ebnf="root ::= 'x'")["ebnf"] == "root ::= 'x'"
    rejects("structured_outputs.structural_tag", structured_outputs={"structural_tag": "{}"})
    rejects(
        "structured_outputs.disable_any_whitespace",
        structured_outputs={"json": {}, "disable_any_whitespace": True},
    )
    rejects("guided_whitespace_pattern", guided_json={}, guided_whitespace_pattern=" ")
    rejects("regex", response_format={"type": "json_object"}, regex="a")


def test_vllm_only_fields() -> None:
    assert build(include_stop_str_in_output=True)["no_stop_trim"] is True
    defaults = {
        "use_beam_search": False,
        "length_penalty": 1,
        "bad_words": [],
        "allowed_token_ids": [],
        "add_generation_prompt": True,
        "add_special_tokens": False,
        "include_reasoning": True,
        "return_token_ids": False,
    }
    assert not set(defaults) & set(build(**defaults))
    assert "add_special_tokens" not in build("completions", add_special_tokens=True)
    rejects("add_special_tokens", "completions", add_special_tokens=False)
    for field, value in [
        ("use_beam_search", True),
        ("length_penalty", 0.5),
        ("bad_words", ["x"]),
        ("allowed_token_ids", [1]),
        ("add_generation_prompt", False),
        ("include_reasoning", False),
        ("prompt_logprobs", 1),
        ("truncate_prompt_tokens", 10),
        ("chat_template", "{{x}}"),
        ("thinking_token_budget", 3),
        ("kv_transfer_params", {}),
        ("bootstrap_host", "10.0.0.1"),
    ]:
        rejects(field, **{field: value})


def test_sglang_fields_pass() -> None:
    fields = {
        "separate_reasoning": False,
        "stream_reasoning": False,
        "no_stop_trim": True,
        "stop_regex": "a+",
        "lora_path": "adapter",
        "custom_params": {"x": 1},
        "top_k": 3,
        "min_p": 0.1,
    }
    out = build(**fields)
    for k, v in fields.items():
        assert out[k] == v
    assert "rid" not in build(rid="r1")


def test_decode_literal_bodies() -> None:
    c = S.decode_response("chat", p.BODIES[1].sglang)
    (ch,) = c.choices
    assert ch.content is None  # SGLang's "" beside tool_calls
    assert ch.tool_calls and (ch.tool_calls[0].name, ch.tool_calls[0].arguments) == (
        "get_weather",
        '{"city": "Paris"}',
    )
    c = S.decode_response("chat", p.BODIES[3].sglang)
    assert c.choices[0].reasoning == "Think hard"
    assert c.usage == Usage(9, 20, cached_tokens=4, reasoning_tokens=2)
    c = S.decode_response("chat", p.BODIES[0].sglang)
    assert c.choices[0].content == "Hello world" and c.usage == Usage(9, 20, None, 0)


def test_stream_decoder_drops_repeated_ids_and_nulls() -> None:
    dec = S.stream_decoder("chat")
    events = [dec.feed(c) for c in p.STREAMS[1].sglang]
    assert events[0] == []
    assert events[1] == [
        Delta(0, tool_calls=[ToolCallDelta(0, "call_0123456789abcdef01234567", "get_weather", "")])
    ]
    assert events[2] == [Delta(0, tool_calls=[ToolCallDelta(0, None, None, '{"city": ')])]
    assert events[4] == [Delta(0, finish_reason="tool_calls")]
    assert events[5] == [Usage(9, 20, None, 0)]
    dec = S.stream_decoder("chat")
    assert dec.feed(p.s_chunk([p.s_choice(reasoning_content="hm")])) == [Delta(0, reasoning="hm")]


def test_stream_error_event_flat_shape() -> None:
    (err,) = S.stream_decoder("chat").feed(p.STREAMS[-1].sglang[-1])
    assert isinstance(err, ApiError) and err.status == 500 and "10.0.0.3" not in err.message
    flat = orjson.dumps(
        {"object": "error", "message": "bad", "type": "BadRequestError", "param": None, "code": 400}
    )
    (err,) = S.stream_decoder("chat").feed(flat)
    assert isinstance(err, ApiError) and err.status == 400 and err.message == "bad"


def test_decode_error_mapping() -> None:
    e1 = S.decode_error(400, p.S_CONTEXT_1)
    assert (e1.code, e1.param) == ("context_length_exceeded", "messages")
    assert e1.message.startswith(
        "This model's maximum context length is 4096 tokens. However, your messages resulted in 5000"
    )
    e2 = S.decode_error(400, p.S_CONTEXT_2, "completions")
    assert (e2.code, e2.param) == ("context_length_exceeded", "prompt")
    assert "5100 tokens (5000 in the prompt, 100 in the completion)" in e2.message
    e = S.decode_error(500, p.S_500)
    assert e.status == 500 and "10.1.2.3" not in e.message
    e = S.decode_error(
        400,
        orjson.dumps(
            {
                "object": "error",
                "message": "Tool 'foo' not found in tools list.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        ),
    )
    assert e.status == 400 and e.message == "Tool 'foo' not found in tools list."
    e = S.decode_error(
        400,
        orjson.dumps(
            {
                "object": "error",
                "message": "see /root/x.py at host-1:30000",
                "type": "x",
                "param": None,
                "code": 400,
            }
        ),
    )
    assert "/root" not in e.message and "30000" not in e.message


def test_parse_metrics() -> None:
    load = S.parse_metrics(p.SGLANG_METRICS)
    # the hit rate is lifetime cached / prompt tokens (every cache source, streamed or not), not the
    # gauge of the last prefill batch, which SGLang's own /health generation sets to 0
    assert (load.running, load.waiting, load.kv_usage, load.prefix_cache_hit_rate) == (4.0, 2.0, 0.75, 0.75)
    assert (load.prefix_cache_hits, load.prefix_cache_queries) == (1200.0, 1600.0)
    # before the first hit SGLang has no cached_tokens_total series at all: 0 hits, not "unknown"
    cold = 'sglang:prompt_tokens_total{is_streaming="false"} 13.0\nsglang:cache_hit_rate{tp_rank="0"} 0.4\n'
    assert (S.parse_metrics(cold).prefix_cache_hit_rate, S.parse_metrics(cold).prefix_cache_hits) == (
        0.0,
        0.0,
    )
    # an SGLang without the counters: the gauge, as before
    assert S.parse_metrics('sglang:cache_hit_rate{tp_rank="0"} 0.4\n').prefix_cache_hit_rate == 0.4
    assert S.parse_metrics("# only comments\n").kv_usage is None
    dp = 'sglang:num_running_reqs{dp_rank="0"} 1\nsglang:num_running_reqs{dp_rank="1"} 2\n'
    assert S.parse_metrics(dp).running == 3.0


def test_robust() -> None:
    check_dialect_robust(S)
