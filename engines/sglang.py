"""The SGLang dialect (`python -m sglang.launch_server`, OpenAI-compatible server).

Request fields (beyond the common rules of `engines.request`; table in docs/engines.md):
- SGLang's own fields pass through (`regex`, `ebnf`, `separate_reasoning`, `stream_reasoning`,
  `no_stop_trim`, `stop_regex`, `lora_path`, `custom_params`);
- vLLM's `structured_outputs` and removed `guided_*` → chat: `response_format` (json_schema /
  json_object), `regex` (regex, and choice as an alternation), `ebnf` (grammar); completions:
  the same but json → SGLang's `json_schema` string field;
- vLLM's `include_stop_str_in_output` → `no_stop_trim`;
- vLLM-only fields holding the value SGLang behaves as anyway are dropped (`use_beam_search:
  false`, `length_penalty: 1.0`, `bad_words: []`, `allowed_token_ids: []`, `add_generation_prompt:
  true`, `add_special_tokens` at the endpoint's default, `include_reasoning: true`,
  `return_token_ids: false`); any other value, and `prompt_logprobs`, `truncate_prompt_tokens`,
  `chat_template`, `thinking_token_budget`, `structural_tag` / `whitespace_pattern` constraints → 400;
- `/v1/embeddings` requests: `engines.embeddings` (SGLang's own embedding fields pass, vLLM's → 400);
  the other endpoints beyond chat: `engines.endpoints`.
"""

from __future__ import annotations

from typing import Any

import orjson

from engines import prometheus
from engines.base import Endpoint, EngineLoad
from engines.decoding import OpenAIShapedAnswers
from engines.endpoints import BUILDERS, SGLANG_PATHS
from engines.request import (
    Constraint,
    base_request,
    check_constraint_conflicts,
    choice_regex,
    drop_if_default,
    dumps,
    pop_constraints,
    refuse,
    rename,
    unsupported,
)

_ENGINE = "SGLang"
_RUNNING = "sglang:num_running_reqs"
_WAITING = "sglang:num_queue_reqs"
_KV = "sglang:token_usage"
_HIT = "sglang:cache_hit_rate"
# Lifetime prompt and cached tokens, kept by the tokenizer manager for every request that logs metrics:
# not for `/health`'s one-token generation, which does set `cache_hit_rate` (the last prefill batch's)
# to 0 — measured on SGLang 0.5.23, so the gauge is only a fallback.
_PROMPT = "sglang:prompt_tokens_total"
_CACHED = "sglang:cached_tokens_total"
_METRICS = (_RUNNING, _WAITING, _KV, _HIT, _PROMPT, _CACHED)
# With tensor/pipeline parallelism every rank reports the scheduler gauges: count rank 0 only.
_RANK0 = 'tp_rank="0"'


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _write_constraint(endpoint: Endpoint, out: dict[str, Any], c: Constraint) -> None:
    if c.options:
        bad = next(iter(c.options))
        raise unsupported(
            f"guided_{bad}" if c.param.startswith("guided") else f"structured_outputs.{bad}", _ENGINE
        )
    if c.kind == "structural_tag":
        raise unsupported(c.param, _ENGINE, "Use response_format with type 'structural_tag'.")
    if c.param in ("regex", "ebnf"):
        return  # native, left in place
    if c.kind == "regex":
        out["regex"] = c.value
    elif c.kind == "choice":
        out["regex"] = choice_regex(c.value)
    elif c.kind == "grammar":
        out["ebnf"] = c.value
    elif endpoint == "completions":
        schema = c.value if c.kind == "json" else {"type": "object"}
        out["json_schema"] = orjson.dumps(schema).decode()
    elif c.kind == "json":
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "schema", "schema": c.value}}
    else:
        out["response_format"] = {"type": "json_object"}


class SGLangDialect(OpenAIShapedAnswers):
    """Stateless; one shared instance (`DIALECT`)."""

    name = "sglang"
    paths = SGLANG_PATHS
    health_path = "/health"
    metrics_path = "/metrics"

    def build_request(self, endpoint: Endpoint, body: dict[str, Any], served_model: str) -> bytes:
        other = BUILDERS.get(endpoint)
        if other is not None:
            return other(body, served_model, "sglang")
        out = base_request(endpoint, body, served_model)
        found = pop_constraints(out, native_regex=True)
        c = check_constraint_conflicts(out, found)
        if c is not None:
            _write_constraint(endpoint, out, c)
        rename(out, "include_stop_str_in_output", "no_stop_trim")
        drop_if_default(out, "use_beam_search", False, _ENGINE)
        drop_if_default(out, "length_penalty", 1.0, _ENGINE)
        drop_if_default(out, "bad_words", [], _ENGINE)
        drop_if_default(out, "allowed_token_ids", [], _ENGINE)
        drop_if_default(out, "add_generation_prompt", True, _ENGINE)
        drop_if_default(out, "add_special_tokens", endpoint == "completions", _ENGINE)
        drop_if_default(out, "include_reasoning", True, _ENGINE, "Use 'separate_reasoning'.")
        drop_if_default(out, "return_token_ids", False, _ENGINE)
        drop_if_default(out, "return_meta_info", False, _ENGINE)
        drop_if_default(out, "return_hidden_states", False, _ENGINE)
        for f in ("prompt_logprobs", "truncate_prompt_tokens", "chat_template", "thinking_token_budget"):
            refuse(out, f, _ENGINE)
        return dumps(out)

    def parse_metrics(self, text: str) -> EngineLoad:
        s = prometheus.samples(text, _METRICS)
        queries = prometheus.combine(s.get(_PROMPT), sum)
        hits = prometheus.combine(s.get(_CACHED), sum)  # by `cache_source`
        if queries is None:  # no counters: the last batch's gauge
            rate = prometheus.combine(s.get(_HIT), _mean, _RANK0)
        else:
            hits = hits or 0.0  # no series before the first hit
            rate = hits / queries if queries else None
        return EngineLoad(
            running=prometheus.combine(s.get(_RUNNING), sum, _RANK0),
            waiting=prometheus.combine(s.get(_WAITING), sum, _RANK0),
            kv_usage=prometheus.combine(s.get(_KV), max),
            prefix_cache_hit_rate=rate,
            prefix_cache_hits=hits,
            prefix_cache_queries=queries,
        )


DIALECT = SGLangDialect()
