"""The traffic class of a request, from the features routing computes: one class, by precedence."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.flow.traffic import LONG_PROMPT_TOKENS, TRAFFIC_CLASSES, traffic_class
from policies.features import BLOCK_TOKENS, LONG_PREAMBLE_BLOCKS, extract_features
from policies.pools import Rule

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
#: a system prompt of about 1,200 tokens (4 bytes a token): past the shared-preamble threshold
PREAMBLE = "You are the support agent of a large shop. " * (LONG_PREAMBLE_BLOCKS * BLOCK_TOKENS * 4 // 40)
#: a user message past the long-prompt threshold
LONG = "word " * (LONG_PROMPT_TOKENS * 4 // 5 + 100)


def chat(user: str = "hi", system: str | None = None, **extra: Any) -> dict[str, Any]:
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user}
    ]
    return {"model": "m", "messages": messages, **extra}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (chat(), "plain"),
        (chat(tools=[TOOL]), "tools"),
        (chat(tools=[TOOL], tool_choice="none"), "tools"),
        (chat(reasoning_effort="high"), "reasoning"),
        (chat(chat_template_kwargs={"enable_thinking": True}), "reasoning"),
        (chat(reasoning_effort="none"), "plain"),
        (chat(LONG), "long_prompt"),
        (chat(system=PREAMBLE), "shared_preamble"),
        ({"model": "m", "prompt": LONG}, "long_prompt"),
        ({"model": "m", "prompt": "short"}, "plain"),
    ],
)
def test_each_class_from_the_request_body(body: dict[str, Any], expected: str) -> None:
    assert traffic_class(extract_features(body)) == expected


def test_a_request_has_one_class_the_first_that_holds() -> None:
    everything = chat(LONG, system=PREAMBLE, tools=[TOOL], reasoning_effort="high")
    assert traffic_class(extract_features(everything)) == "tools"
    assert (
        traffic_class(extract_features(chat(LONG, system=PREAMBLE, reasoning_effort="high"))) == "reasoning"
    )
    assert traffic_class(extract_features(chat(LONG, system=PREAMBLE))) == "long_prompt"
    assert TRAFFIC_CLASSES == ("tools", "reasoning", "long_prompt", "shared_preamble", "plain")


def test_the_thresholds_are_the_routing_rules() -> None:
    """A class and a routing rule with the same condition mean the same requests."""
    long_rule = Rule("long", ("p",), prompt_tokens_gte=LONG_PROMPT_TOKENS)
    shared_rule = Rule("shared", ("p",), shared_preamble=True)
    for body in (chat(LONG), chat("x" * (LONG_PROMPT_TOKENS * 4 - 40)), chat(system=PREAMBLE), chat()):
        f = extract_features(body)
        assert long_rule.matches(f) == (traffic_class(f) == "long_prompt")
        assert shared_rule.matches(f) == (traffic_class(f) == "shared_preamble")
