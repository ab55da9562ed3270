"""Seeded, reusable request workloads for routing benchmarks (and anything else that needs traffic).

Every generator takes a `random.Random`-compatible seed and its documented parameters, and returns a
list of `Request`s in arrival order: an OpenAI chat body (`messages`, optional `tools`) and, for
conversational workloads, a `session` id and turn number — a session's turn k+1 repeats turn k's
whole prompt plus the (generator-written) assistant reply, so prefix reuse is exactly what a real
client would produce and is known offline (the oracle replays the same list). Text is made of
seeded pseudo-words, so the simulator's tokenizer (`engines/sim/tokenizer.py`: one token per word or
punctuation mark) counts roughly one token per word; lengths below are in those tokens.

| generator              | models                                             | parameters                                            |
|------------------------|----------------------------------------------------|-------------------------------------------------------|
| `multi_turn_chat`      | chat sessions (cf. vLLM's multi-turn benchmark)     | `sessions_active`, `turns` (min, max), `system_tokens`, `tenants` (shared system prompts), `user_tokens`, `reply_tokens` |
| `shared_prefix`        | `prefix_repetition`: N prefixes, unique suffixes   | `num_prefixes`, `prefix_tokens`, `suffix_tokens`      |
| `agent_tool_loop`      | agents calling tools, history growing each step    | `agents_active`, `steps` (min, max), `num_tools`, `system_tokens`, `tool_result_tokens` |
| `long_document_qa`     | questions over a few long documents                | `num_docs`, `doc_tokens`, `question_tokens`           |
| `uniform_random`       | no shared prefixes at all                          | `prompt_tokens` (min, max)                            |

`schedule(requests, rate, seed)` gives the Poisson arrival times of a trace at `rate` requests/s.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_SYLL = ("ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "de", "po", "la", "xe", "qu", "zo", "fi", "ba")


@dataclass
class Request:
    """One chat request of a trace. `session` orders turns: a turn is sent after the previous one ends."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    session: str | None = None
    turn: int = 0
    max_tokens: int = 16
    meta: dict[str, Any] = field(default_factory=dict)

    def body(self, model: str, stream: bool = True) -> dict[str, Any]:
        b: dict[str, Any] = {"model": model, "messages": self.messages, "max_tokens": self.max_tokens}
        if self.tools:
            b["tools"] = self.tools
        if stream:  # with its usage at the end, as the engines' benchmark tools ask
            b["stream"] = True
            b["stream_options"] = {"include_usage": True}
        return b


class Words:
    """Seeded pseudo-words: `text(n)` is n words (≈ n simulator tokens) with a full stop every ~12."""

    def __init__(self, rng: random.Random, vocab: int = 4000) -> None:
        self.rng = rng
        self.vocab = ["".join(rng.choice(_SYLL) for _ in range(rng.randint(2, 4))) for _ in range(vocab)]

    def text(self, n: int) -> str:
        out: list[str] = []
        for i in range(max(1, n)):
            out.append(self.rng.choice(self.vocab))
            if i % 12 == 11:
                out[-1] += "."
        return " ".join(out)


def _interleave(
    rng: random.Random, active: int, total: int, new_session: Callable[[int], list[Request]]
) -> list[Request]:
    """Arrival order of `total` requests from `active` concurrent sessions (a finished one is replaced)."""
    live: list[list[Request]] = []
    made = 0
    out: list[Request] = []
    while len(out) < total:
        while len(live) < active:
            live.append(new_session(made))
            made += 1
        i = rng.randrange(len(live))
        out.append(live[i].pop(0))
        if not live[i]:
            live.pop(i)
    return out


def multi_turn_chat(
    total: int,
    seed: int = 1,
    *,
    sessions_active: int = 24,
    turns: tuple[int, int] = (3, 8),
    tenants: int = 6,
    system_tokens: int = 300,
    user_tokens: tuple[int, int] = (30, 120),
    reply_tokens: tuple[int, int] = (60, 200),
) -> list[Request]:
    """Chat sessions; each tenant has its own system prompt; history grows turn by turn."""
    rng = random.Random(seed)
    w = Words(rng)
    systems = [w.text(system_tokens) for _ in range(tenants)]

    def session(k: int) -> list[Request]:
        sid = f"chat-{k}"
        msgs: list[dict[str, Any]] = [{"role": "system", "content": rng.choice(systems)}]
        reqs: list[Request] = []
        for t in range(rng.randint(*turns)):
            msgs = [*msgs, {"role": "user", "content": w.text(rng.randint(*user_tokens))}]
            reqs.append(Request(list(msgs), session=sid, turn=t))
            msgs = [*msgs, {"role": "assistant", "content": w.text(rng.randint(*reply_tokens))}]
        return reqs

    return _interleave(rng, sessions_active, total, session)


def shared_prefix(
    total: int, seed: int = 2, *, num_prefixes: int = 32, prefix_tokens: int = 1200, suffix_tokens: int = 60
) -> list[Request]:
    """`prefix_repetition`: each request = one of `num_prefixes` shared system prompts + a unique question."""
    rng = random.Random(seed)
    w = Words(rng)
    prefixes = [w.text(prefix_tokens) for _ in range(num_prefixes)]
    out = []
    for _ in range(total):
        p = rng.randrange(num_prefixes)
        msgs = [
            {"role": "system", "content": prefixes[p]},
            {"role": "user", "content": w.text(suffix_tokens)},
        ]
        out.append(Request(msgs, meta={"prefix": p}))
    return out


def _tool(rng: random.Random, w: Words, i: int) -> dict[str, Any]:
    props = {
        f"arg_{j}": {
            "type": rng.choice(["string", "integer", "boolean"]),
            "description": w.text(rng.randint(8, 20)),
        }
        for j in range(rng.randint(2, 5))
    }
    return {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": w.text(rng.randint(20, 50)),
            "parameters": {"type": "object", "properties": props, "required": sorted(props)[:1]},
        },
    }


def agent_tool_loop(
    total: int,
    seed: int = 3,
    *,
    agents_active: int = 16,
    steps: tuple[int, int] = (4, 10),
    num_tools: int = 8,
    toolsets: int = 4,
    system_tokens: int = 250,
    tool_result_tokens: tuple[int, int] = (80, 300),
) -> list[Request]:
    """Agents: a system prompt and tool schemas (one of `toolsets` sets), then call → result → call …"""
    rng = random.Random(seed)
    w = Words(rng)
    sets = [[_tool(rng, w, s * 100 + i) for i in range(num_tools)] for s in range(toolsets)]
    systems = [w.text(system_tokens) for _ in range(toolsets)]

    def agent(k: int) -> list[Request]:
        sid = f"agent-{k}"
        s = rng.randrange(toolsets)
        tools = sets[s]
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": systems[s]},
            {"role": "user", "content": w.text(rng.randint(20, 60))},
        ]
        reqs: list[Request] = []
        for t in range(rng.randint(*steps)):
            reqs.append(Request(list(msgs), tools=tools, session=sid, turn=t))
            fn = rng.choice(tools)["function"]["name"]
            call_id = f"call_{k}_{t}"
            args = json.dumps({"arg_0": w.text(3)})
            msgs = [
                *msgs,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": fn, "arguments": args}}]},
                {"role": "tool", "tool_call_id": call_id, "content": w.text(rng.randint(*tool_result_tokens))},
            ]  # fmt: skip
        return reqs

    return _interleave(rng, agents_active, total, agent)


def long_document_qa(
    total: int, seed: int = 4, *, num_docs: int = 12, doc_tokens: int = 3000, question_tokens: int = 30
) -> list[Request]:
    """Questions over `num_docs` long documents (the document first, then the question)."""
    rng = random.Random(seed)
    w = Words(rng)
    docs = [w.text(doc_tokens) for _ in range(num_docs)]
    out = []
    for _ in range(total):
        d = rng.randrange(num_docs)
        content = f"Document:\n{docs[d]}\n\nQuestion: {w.text(question_tokens)}"
        out.append(Request([{"role": "user", "content": content}], meta={"doc": d}))
    return out


def uniform_random(
    total: int, seed: int = 5, *, prompt_tokens: tuple[int, int] = (200, 1500)
) -> list[Request]:
    """Unrelated prompts of random length: nothing to gain from affinity, only balance matters."""
    rng = random.Random(seed)
    w = Words(rng)
    return [Request([{"role": "user", "content": w.text(rng.randint(*prompt_tokens))}]) for _ in range(total)]


WORKLOADS: dict[str, Callable[..., list[Request]]] = {
    "multi_turn_chat": multi_turn_chat,
    "shared_prefix": shared_prefix,
    "agent_tool_loop": agent_tool_loop,
    "long_document_qa": long_document_qa,
    "uniform": uniform_random,
}


def schedule(n: int, rate: float, seed: int = 0) -> list[float]:
    """Poisson arrival offsets (seconds from the start) of `n` requests at `rate` per second."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out
