"""Builders for snapshots and conversations shared by the policy tests."""

from __future__ import annotations

import random
from typing import Any

from policies.features import extract_features
from policies.types import BackendView, FleetSnapshot, PoolView, RequestFeatures

WORDS = [f"w{i}x" for i in range(2000)]


def backends(prefix: str, n: int, **kwargs: Any) -> tuple[BackendView, ...]:
    return tuple(BackendView(f"{prefix}-{i}", **kwargs) for i in range(n))


def pool(
    name: str,
    n: int = 4,
    *,
    weight: float = 1.0,
    models: frozenset[str] = frozenset({"m"}),
    tool_calling: bool = True,
    structured_output: bool = True,
    dialect: str = "vllm",
    members: tuple[BackendView, ...] | None = None,
) -> PoolView:
    return PoolView(
        name=name,
        dialect=dialect,
        weight=weight,
        models=models,
        tool_calling=tool_calling,
        structured_output=structured_output,
        backends=members if members is not None else backends(name, n),
    )


def fleet(*pools: PoolView) -> FleetSnapshot:
    return FleetSnapshot(tuple(pools))


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def conversation(rng: random.Random, *, system: str, turns: int = 1, words: int = 40) -> list[dict[str, Any]]:
    """A system prompt and `turns` user/assistant exchanges ending with a user message."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for i in range(turns):
        if i:
            messages.append({"role": "assistant", "content": text(rng, words)})
        messages.append({"role": "user", "content": text(rng, words)})
    return messages


def features(messages: list[dict[str, Any]], **body: Any) -> RequestFeatures:
    return extract_features({"model": "m", "messages": messages, **body})


def grow(rng: random.Random, messages: list[dict[str, Any]], words: int = 40) -> list[dict[str, Any]]:
    """The next turn of a conversation: the assistant's answer and a new user message appended."""
    return [
        *messages,
        {"role": "assistant", "content": text(rng, words)},
        {"role": "user", "content": text(rng, words)},
    ]
