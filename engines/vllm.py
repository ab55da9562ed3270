"""The vLLM dialect (`vllm serve`, OpenAI-compatible server).

Request fields (beyond the common rules of `engines.request`; table in docs/engines.md):
- vLLM's own fields pass through (`structured_outputs`, `use_beam_search`, `bad_words`, …);
- removed `guided_json|regex|choice|grammar` (silently ignored since v0.12) and SGLang's `regex` /
  `ebnf` → `structured_outputs.{json|regex|choice|grammar}`; `guided_whitespace_pattern` →
  `structured_outputs.whitespace_pattern`;
- SGLang's `no_stop_trim` → `include_stop_str_in_output`;
- SGLang's `separate_reasoning`, `stream_reasoning` (true), `return_meta_info`,
  `return_hidden_states` (false) are dropped when they hold the value vLLM behaves as, else 400;
- SGLang's `stop_regex`, `lora_path`, `custom_params` → 400 (no vLLM equivalent);
- `return_token_ids: true` → 400 (OpenAI's shapes have no place for token ids);
- `/v1/embeddings` requests: `engines.embeddings` (vLLM's own embedding fields pass, SGLang's → 400);
  the other endpoints beyond chat: `engines.endpoints`.
"""

from __future__ import annotations

from typing import Any

from engines import prometheus
from engines.base import Endpoint, EngineLoad
from engines.decoding import OpenAIShapedAnswers
from engines.endpoints import BUILDERS, VLLM_PATHS
from engines.request import (
    base_request,
    check_constraint_conflicts,
    drop_if_default,
    dumps,
    pop_constraints,
    refuse,
    rename,
)

_ENGINE = "vLLM"
_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV = "vllm:kv_cache_usage_perc"
_KV_OLD = "vllm:gpu_cache_usage_perc"
_QUERIES = "vllm:prefix_cache_queries_total"
_HITS = "vllm:prefix_cache_hits_total"
_METRICS = (_RUNNING, _WAITING, _KV, _KV_OLD, _QUERIES, _HITS)


class VLLMDialect(OpenAIShapedAnswers):
    """Stateless; one shared instance (`DIALECT`)."""

    name = "vllm"
    paths = VLLM_PATHS
    health_path = "/health"
    metrics_path = "/metrics"

    def build_request(self, endpoint: Endpoint, body: dict[str, Any], served_model: str) -> bytes:
        other = BUILDERS.get(endpoint)
        if other is not None:
            return other(body, served_model, "vllm")
        out = base_request(endpoint, body, served_model)
        found = pop_constraints(out, native_regex=False)
        c = check_constraint_conflicts(out, found)
        if c is not None:
            out["structured_outputs"] = {c.kind: c.value, **c.options}
        rename(out, "no_stop_trim", "include_stop_str_in_output")
        drop_if_default(out, "separate_reasoning", True, _ENGINE, "Use 'include_reasoning'.")
        drop_if_default(out, "stream_reasoning", True, _ENGINE)
        drop_if_default(out, "return_meta_info", False, _ENGINE)
        drop_if_default(out, "return_hidden_states", False, _ENGINE)
        drop_if_default(out, "return_token_ids", False, _ENGINE)
        refuse(out, "stop_regex", _ENGINE, "Use 'stop'.")
        refuse(out, "lora_path", _ENGINE, "Adapters are selected by model name.")
        refuse(out, "custom_params", _ENGINE)
        return dumps(out)

    def parse_metrics(self, text: str) -> EngineLoad:
        s = prometheus.samples(text, _METRICS)
        kv = prometheus.combine(s.get(_KV), max)
        if kv is None:
            kv = prometheus.combine(s.get(_KV_OLD), max)
        queries = prometheus.combine(s.get(_QUERIES), sum)
        hits = prometheus.combine(s.get(_HITS), sum)
        rate = hits / queries if hits is not None and queries else None
        return EngineLoad(
            running=prometheus.combine(s.get(_RUNNING), sum),
            waiting=prometheus.combine(s.get(_WAITING), sum),
            kv_usage=kv,
            prefix_cache_hit_rate=rate,
            prefix_cache_hits=hits,
            prefix_cache_queries=queries,
        )


DIALECT = VLLMDialect()
