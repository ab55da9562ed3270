"""Dialect-neutral planning helpers: generation spec from a request, ids, logprobs shapes."""

from __future__ import annotations

import os
from typing import Any

from engines.sim.config import SimConfig
from engines.sim.generator import JSON_OBJECT, Constraint, GenSpec, Output, generate, token_logprobs
from engines.sim.prompt_schema import requested_schema
from engines.sim.request import max_tokens_of, seed_of, stop_list


def hex_id(nbytes: int = 16) -> str:
    """Random lowercase hex (ids need not be deterministic; output is)."""
    return os.urandom(nbytes).hex()


def thinking_enabled(cfg: SimConfig, body: dict[str, Any]) -> bool:
    """Reasoning is produced when the sim has `--reasoning-parser` and the request does not turn
    thinking off with `chat_template_kwargs: {"enable_thinking": false}` (or `"thinking": false`)."""
    if not cfg.reasoning_parser:
        return False
    kwargs = body.get("chat_template_kwargs")
    off = isinstance(kwargs, dict) and (
        kwargs.get("enable_thinking") is False or kwargs.get("thinking") is False
    )
    return not off


def plan_outputs(
    cfg: SimConfig,
    body: dict[str, Any],
    prompt_tokens: int,
    *,
    constraint: Constraint | None = None,
    calls: list[tuple[str, Any]] | None = None,
    reasoning: bool = False,
    honour_min_tokens: bool = True,
    first_index: int = 0,
) -> tuple[int, list[Output]]:
    """(seed, outputs of every choice) for a validated request; `first_index` numbers the choices
    (a batch's prompt k plans choices `k * n …`, so its prompts do not all answer alike)."""
    seed = seed_of(body)
    max_tokens = max_tokens_of(body)
    if max_tokens is None:
        max_tokens = max(0, cfg.max_model_len - prompt_tokens)
    min_tokens = body.get("min_tokens") if honour_min_tokens else 0
    if constraint == JSON_OBJECT:  # JSON mode answers with the object the prompt asks for
        constraint = ("json_object", requested_schema(body.get("messages", body.get("prompt"))))
    spec = GenSpec(
        seed=seed,
        min_len=cfg.min_output_tokens,
        max_len=cfg.max_output_tokens,
        max_tokens=max_tokens,
        min_tokens=min_tokens if isinstance(min_tokens, int) else 0,
        ignore_eos=body.get("ignore_eos") is True,
        stop=stop_list(body),
        include_stop_str=body.get("include_stop_str_in_output") is True,
        constraint=constraint,
        tool_calls=tuple(calls or ()),
        reasoning=reasoning,
    )
    return seed, [generate(spec, first_index + i) for i in range(choice_count(body))]


def choice_count(body: dict[str, Any]) -> int:
    """Choices a request asks for per prompt (`n`, 1 unless a positive int)."""
    n = body.get("n")
    return n if isinstance(n, int) and n > 0 else 1


def chat_logprobs(pieces: list[str], top: int, seed: int) -> dict[str, Any]:
    """OpenAI chat `logprobs` object for content pieces."""
    content = [
        {
            "token": tok,
            "logprob": lp,
            "bytes": list(tok.encode()),
            "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in alts[:top]],
        }
        for tok, lp, alts in token_logprobs(pieces, max(top, 1), seed)
    ]
    return {"content": content}


def completion_logprobs(pieces: list[str], top: int, seed: int, offset: int = 0) -> dict[str, Any]:
    """Legacy completions `logprobs` object."""
    tokens: list[str] = []
    values: list[float] = []
    tops: list[dict[str, float]] = []
    offsets: list[int] = []
    pos = offset
    for tok, lp, alts in token_logprobs(pieces, max(top, 1), seed):
        tokens.append(tok)
        values.append(lp)
        tops.append(dict(alts[: max(top, 1)]))
        offsets.append(pos)
        pos += len(tok)
    return {"text_offset": offsets, "token_logprobs": values, "tokens": tokens, "top_logprobs": tops}
