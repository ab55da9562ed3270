"""Deterministic "model output": text, JSON, tool calls and reasoning, from a seed.

Nothing here does I/O or keeps time. `generate(spec, index)` returns one choice's `Output`; the same
spec always gives the same output. Content is kept as *pieces* (one token each, with its leading
whitespace) so a stream is just the pieces in order and `"".join(pieces)` is the full text.

Natural length: a seeded draw in [`min_len`, `max_len`] tokens (raised to `min_tokens`), then EOS.
`max_tokens` cuts it (`finish_reason="length"`); `ignore_eos` makes it exactly `max_tokens`; the first
`stop` string found ends it (`"stop"`, the string reported). Reasoning, when on, comes first and counts
against `max_tokens`.

JSON mode (the `json_object` constraint) answers with the object the prompt asks for
(`engines.sim.prompt_schema`: a schema it carries, or keys it names), else with `plausible_object`: a
short answer, never `{}`. Tool-call arguments always form a JSON object valid for the tool's parameters.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from engines.sim import schema_gen

_PIECE_RE = re.compile(r"\s*(?:\w+|[^\w\s])")
WORDS: tuple[str, ...] = (
    "the",
    "model",
    "answers",
    "questions",
    "about",
    "data",
    "and",
    "systems",
    "with",
    "care",
    "while",
    "engine",
    "keeps",
    "cache",
    "of",
    "recent",
    "prefixes",
    "so",
    "that",
    "requests",
    "share",
    "context",
    "run",
    "faster",
    "on",
    "every",
    "node",
    "in",
    "cluster",
    "as",
    "long",
    "router",
    "sends",
    "them",
    "to",
    "same",
    "place",
    "where",
    "tokens",
    "are",
    "stored",
    "for",
    "reuse",
    "across",
    "many",
    "users",
    "who",
    "ask",
    "similar",
    "things",
    "each",
    "day",
    "plain",
    "words",
    "weather",
    "travel",
    "code",
    "music",
    "history",
    "science",
    "food",
    "sport",
    "health",
    "money",
)
_CAPS = [w.capitalize() for w in WORDS]  # prose() maps one random byte to a word with `& 63`
_SPACED = [" " + w for w in WORDS]
_TOPICS = WORDS[54:]  # "weather" … "money"

Constraint = (
    tuple[Literal["json"], Any]  # JSON schema
    | tuple[Literal["json_object"], Any]  # JSON mode: the schema the prompt asks for, or None
    | tuple[Literal["regex"], str]
    | tuple[Literal["choice"], list[Any]]
    | tuple[Literal["grammar"], str]
)
# How the dialects pass JSON mode (`response_format` json_object, vLLM's `structured_outputs.json_object`;
# SGLang itself turns json_object into this schema): any object. `plan_outputs` makes it "json_object".
JSON_OBJECT: Final[Constraint] = ("json", {"type": "object"})


@dataclass(frozen=True, slots=True)
class ToolCallOut:
    """One generated function call; `arguments` is a JSON string."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class GenSpec:
    """Everything that shapes the output of one request (already validated)."""

    seed: int
    min_len: int = 30
    max_len: int = 60
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    include_stop_str: bool = False
    constraint: Constraint | None = None
    tool_calls: tuple[tuple[str, Any], ...] = ()  # (name, parameters schema) to call, in order
    reasoning: bool = False


@dataclass(slots=True)
class Output:
    """One choice's generated output."""

    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    tool_calls: list[ToolCallOut] = field(default_factory=list)
    tool_text: str = ""  # what the model "said" for its tool calls, as a parser would read it
    finish_reason: str = "stop"
    stop_str: str | None = None
    eos: bool = False
    completion_tokens: int = 0

    @property
    def text(self) -> str:
        """The content as one string."""
        return "".join(self.content)

    @property
    def reasoning_text(self) -> str:
        """The reasoning as one string."""
        return "".join(self.reasoning)


def pieces(text: str) -> list[str]:
    """Split text into one-token pieces that concatenate back to it exactly."""
    out = _PIECE_RE.findall(text)
    rest = len(text) - sum(map(len, out))
    if rest and out:
        out[-1] += text[len(text) - rest :]
    elif rest:
        out = [text]
    return out


def prose(rng: random.Random, n: int) -> list[str]:
    """`n` pieces of plain sentences (one random byte per piece: word, comma or full stop)."""
    out: list[str] = []
    append = out.append
    sentence = 0
    for b in rng.randbytes(n):
        if sentence == 0:
            append(" " + _CAPS[b & 63] if out else _CAPS[b & 63])
        elif sentence >= 6 and b >= 208:
            append(".")
            sentence = 0
            continue
        elif b < 12:
            append(",")
        else:
            append(_SPACED[b & 63])
        sentence += 1
    return out


def tool_call_text(calls: list[ToolCallOut]) -> str:
    """Hermes-style text a model emits for tool calls (what SGLang leaves in content without a parser)."""
    return "\n".join(
        f'<tool_call>\n{{"name": "{c.name}", "arguments": {c.arguments}}}\n</tool_call>' for c in calls
    )


def plausible_object(rng: random.Random) -> dict[str, Any]:
    """What JSON mode gives when the prompt asks for no particular object: a short answer."""
    answer = "".join(prose(rng, rng.randint(6, 12))).rstrip(",.") + "."
    return {
        "answer": answer,
        "confidence": round(rng.uniform(0.5, 0.99), 2),
        "topics": rng.sample(_TOPICS, rng.randint(1, 3)),
    }


def _constrained_text(constraint: Constraint, rng: random.Random) -> str:
    kind, arg = constraint
    if kind == "json":
        return json.dumps(schema_gen.sample(arg, rng), ensure_ascii=False)
    if kind == "json_object":
        value = schema_gen.sample(arg, rng) if isinstance(arg, dict) else None
        if not isinstance(value, dict) or not value:
            value = plausible_object(rng)
        return json.dumps(value, ensure_ascii=False)
    if kind == "regex":
        return schema_gen.sample_regex(str(arg), rng)
    if kind == "choice":
        return str(rng.choice(arg)) if arg else ""
    return " ".join(rng.choice(WORDS) for _ in range(5))  # grammar/EBNF: not interpreted


def generate(spec: GenSpec, index: int = 0) -> Output:
    """The output of choice `index` for `spec` (pure and deterministic)."""
    rng = random.Random(spec.seed * 1_000_003 + index)
    out = Output()
    budget = spec.max_tokens if spec.max_tokens is not None else 1 << 30
    if spec.reasoning:
        thought = prose(random.Random(spec.seed * 7 + index), rng.randint(8, 16))
        out.reasoning = thought[:budget]
        budget -= len(out.reasoning)
        if budget <= 0:
            out.finish_reason = "length"
            out.completion_tokens = len(out.reasoning)
            return out
    if spec.tool_calls:
        calls = [
            ToolCallOut(name, json.dumps(schema_gen.sample_object(params, rng), ensure_ascii=False))
            for name, params in spec.tool_calls
        ]
        raw = tool_call_text(calls)
        raw_pieces = pieces(raw)
        if len(raw_pieces) > budget:
            out.content = raw_pieces[:budget]  # truncated call: unparseable, left as text
            out.finish_reason = "length"
        else:
            out.tool_calls, out.tool_text = calls, raw
            out.finish_reason = "tool_calls"
            out.eos = True
        out.completion_tokens = len(out.reasoning) + min(len(raw_pieces), budget)
        return out
    if spec.constraint is not None:
        content = pieces(_constrained_text(spec.constraint, rng))
        natural = len(content)
    else:
        natural = max(rng.randint(spec.min_len, spec.max_len), spec.min_tokens)
        if spec.ignore_eos and spec.max_tokens is not None:
            natural = spec.max_tokens
        content = prose(rng, min(natural, budget))
    out.eos = natural <= budget and not spec.ignore_eos
    content = content[:budget]
    out.finish_reason = "stop" if out.eos else "length"
    used = len(content)
    if spec.stop and spec.constraint is None:
        content, used = _apply_stop(out, content, spec)
    out.content = content
    out.completion_tokens = len(out.reasoning) + used
    return out


def _apply_stop(out: Output, content: list[str], spec: GenSpec) -> tuple[list[str], int]:
    text = ""
    for i, piece in enumerate(content):
        text += piece
        hits = [(text.find(s), s) for s in spec.stop if s and s in text]
        if hits:
            pos, stop = min(hits)
            end = pos + len(stop) if spec.include_stop_str else pos
            kept = text[:end]
            out.finish_reason, out.stop_str, out.eos = "stop", stop, False
            new = content[:i]
            prefix_len = sum(map(len, new))
            if end > prefix_len:
                new.append(kept[prefix_len:])
            elif end < prefix_len:
                new = pieces(kept)
            return new, i + 1
    return content, len(content)


def token_logprobs(
    piece_list: list[str], top: int, seed: int
) -> list[tuple[str, float, list[tuple[str, float]]]]:
    """Seeded (token, logprob, top alternatives) per piece; the sampled token is always the top one."""
    rng = random.Random(seed ^ 0x5EED)
    result: list[tuple[str, float, list[tuple[str, float]]]] = []
    for piece in piece_list:
        lp = -round(rng.random() * 0.5, 4)
        alts = [(piece, lp)]
        for k in range(1, top):
            alts.append((" " + rng.choice(WORDS), round(lp - k - rng.random(), 4)))
        result.append((piece, lp, alts[:top]))
    return result
