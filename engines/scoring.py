"""`/rerank` and `/score` on the engine side, and their answers in vLLM's shapes (OpenAI has none).

Requests, for a text-only body the gateway has validated (`gateway/apis/scoring.py`):
- rerank: every document is scored and `top_n` applied by the gateway (the engines cut and break
  ties each their own way), so `top_n` is not sent; `return_documents` is the gateway's (it writes
  the documents from the request: SGLang is told `false`); vLLM's `instruction` and SGLang's
  `instruct` are one field, each engine sent its own spelling; SGLang gets `documents` as a list;
- score: the pair forms (`PAIR_FORMS`: vLLM's `text_1`/`text_2`, `queries` with `documents` or
  `items`, `data_1`/`data_2`, and SGLang's `query`/`items`) go to vLLM as `text_1`/`text_2` and to
  SGLang as `query`/`items`; SGLang scores one text against many, so N:N pairs are a 400 there;
- `model` becomes the served name; nulls and `request_id` are dropped; vLLM's own fields
  (`VLLM_ONLY`) pass to vLLM and are a 400 on SGLang.

Answers:
- rerank: `{"id": "rerank-…", "model", "usage": {"prompt_tokens", "total_tokens"}, "results":
  [{"index", "document": {"text", "multi_modal": null}, "relevance_score"}]}`, best first (ties by
  index), at most `top_n` (0: all); without documents when `return_documents` is false. SGLang's
  bare list of `{score, index, meta_info}` is read, its usage summed from `meta_info.prompt_tokens`;
- score: `{"id": "score-…", "object": "list", "created", "model", "data": [{"index", "object":
  "score", "score"}], "usage"}` in pair order; SGLang's `scores` rows give their first value.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

import orjson

from engines.errors import invalid_request, server_error
from engines.request import unsupported
from engines.upstream_errors import GENERIC_UPSTREAM

_ENGINE = {"vllm": "vLLM", "sglang": "SGLang"}
#: the ways to name a score request's two sides, vLLM's and SGLang's
PAIR_FORMS = (
    ("text_1", "text_2"),
    ("queries", "documents"),
    ("queries", "items"),
    ("data_1", "data_2"),
    ("query", "items"),
)
VLLM_ONLY = (
    "truncate_prompt_tokens",
    "padding",
    "truncation_side",
    "mm_processor_kwargs",
    "use_activation",
    "max_tokens_per_query",
    "max_tokens_per_doc",
    "chat_template_kwargs",
)
_DROPPED = ("request_id", "rid")


@dataclass(slots=True)
class Scores:
    """An engine's scores as (input index, score), and the prompt tokens it counted (None: not said)."""

    values: list[tuple[int, float]]
    prompt_tokens: int | None = None


def pair_form(body: dict[str, Any]) -> tuple[str, str] | None:
    """The first pair form whose two fields a score body sets."""
    return next((f for f in PAIR_FORMS if f[0] in body and f[1] in body), None)


def _common(body: dict[str, Any], served_model: str, engine: str) -> dict[str, Any]:
    out = {k: v for k, v in body.items() if v is not None and k not in _DROPPED}
    out["model"] = served_model
    if engine == "sglang":
        for field in VLLM_ONLY:
            if field in out:
                raise unsupported(field, _ENGINE[engine])
    return out


def build_rerank_request(body: dict[str, Any], served_model: str, engine: str) -> bytes:
    out = _common(body, served_model, engine)
    out.pop("top_n", None)
    out.pop("return_documents", None)
    instruction = out.pop("instruction", None)
    instruction = out.pop("instruct", instruction)
    if engine == "sglang":
        if isinstance(out.get("documents"), str):
            out["documents"] = [out["documents"]]
        out["return_documents"] = False
        if instruction is not None:
            out["instruct"] = instruction
    elif instruction is not None:
        out["instruction"] = instruction
    return orjson.dumps(out)


def build_score_request(body: dict[str, Any], served_model: str, engine: str) -> bytes:
    out = _common(body, served_model, engine)
    form = pair_form(out)
    assert form is not None, "the intake checks the pair form"
    left, right = out.pop(form[0]), out.pop(form[1])
    if engine == "vllm":
        out["text_1"], out["text_2"] = left, right
        return orjson.dumps(out)
    if isinstance(left, list):
        if len(left) != 1:
            raise invalid_request(
                f"Invalid '{form[0]}': this model's engine (SGLang) scores one text against many; "
                "N:N pairs are not supported.",
                param=form[0],
            )
        left = left[0]
    out["query"], out["items"] = left, right if isinstance(right, list) else [right]
    return orjson.dumps(out)


# -- answers ----------------------------------------------------------------------------------------
def decode_rerank(data: bytes) -> Scores:
    """vLLM's `{results: [{index, relevance_score}], usage}` or SGLang's `[{index, score, meta_info}]`."""
    obj = _loads(data)
    if type(obj) is dict and type(obj.get("results")) is list:
        values = [_pair(r, "relevance_score") for r in obj["results"]]
        return Scores(values, _usage(obj))
    if type(obj) is list:
        values = [_pair(r, "score") for r in obj]
        counts = [_int(r.get("meta_info"), "prompt_tokens") for r in obj]
        known = None if None in counts else sum(c for c in counts if c is not None)
        return Scores(values, known)
    raise server_error(GENERIC_UPSTREAM)


def decode_score(data: bytes) -> Scores:
    """vLLM's `{data: [{index, score}], usage}` or SGLang's `{scores: [[s, …], …], usage}`."""
    obj = _loads(data)
    if type(obj) is not dict:
        raise server_error(GENERIC_UPSTREAM)
    if type(obj.get("data")) is list:
        return Scores([_pair(d, "score") for d in obj["data"]], _usage(obj))
    rows = obj.get("scores")
    if type(rows) is list and all(type(r) is list and r and _number(r[0]) for r in rows):
        return Scores([(i, float(r[0])) for i, r in enumerate(rows)], _usage(obj))
    raise server_error(GENERIC_UPSTREAM)


def encode_rerank(
    scores: Scores, documents: list[str], *, model: str, top_n: int, with_documents: bool, tokens: int
) -> bytes:
    """vLLM's rerank answer; raises the generic upstream error when the engine skipped a document."""
    if sorted(i for i, _ in scores.values) != list(range(len(documents))):
        raise server_error(GENERIC_UPSTREAM)
    ranked = sorted(scores.values, key=lambda p: (-p[1], p[0]))
    if 0 < top_n < len(ranked):
        ranked = ranked[:top_n]
    results: list[dict[str, Any]] = []
    for i, score in ranked:
        result: dict[str, Any] = {"index": i}
        if with_documents:
            result["document"] = {"text": documents[i], "multi_modal": None}
        result["relevance_score"] = score
        results.append(result)
    return orjson.dumps(
        {
            "id": "rerank-" + secrets.token_hex(16),
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": results,
        }
    )


def encode_score(scores: Scores, pairs: int, *, model: str, tokens: int) -> bytes:
    """vLLM's score answer, in pair order."""
    if sorted(i for i, _ in scores.values) != list(range(pairs)):
        raise server_error(GENERIC_UPSTREAM)
    data = [{"index": i, "object": "score", "score": s} for i, s in sorted(scores.values)]
    return orjson.dumps(
        {
            "id": "score-" + secrets.token_hex(16),
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": {
                "prompt_tokens": tokens,
                "total_tokens": tokens,
                "completion_tokens": 0,
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
        }
    )


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        raise server_error(GENERIC_UPSTREAM) from None


def _number(v: Any) -> bool:
    return type(v) in (int, float)


def _pair(item: Any, key: str) -> tuple[int, float]:
    if type(item) is not dict or type(item.get("index")) is not int or not _number(item.get(key)):
        raise server_error(GENERIC_UPSTREAM)
    return item["index"], float(item[key])


def _int(obj: Any, key: str) -> int | None:
    v = obj.get(key) if type(obj) is dict else None
    return v if type(v) is int else None


def _usage(obj: dict[str, Any]) -> int | None:
    return _int(obj.get("usage"), "prompt_tokens")
