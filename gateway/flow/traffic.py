"""The traffic class of a request: what kind of work it asks of an engine, from its routing features.

One class a request, the first that holds, in this order:

    tools            tools are offered (`tools`): a tool-call parser and long schemas
    reasoning        thinking is asked for (`reasoning_effort`, `enable_thinking`): long outputs
    long_prompt      at least LONG_PROMPT_TOKENS estimated prompt tokens: prefill dominates
    shared_preamble  its tools and system prompt (~1k tokens or more) are shared with other requests:
                     prefix caching decides
    plain            anything else: short chat

The order puts what changes the engine's work (a parser, a long generation) before what only
changes the prompt (its length, then what other requests share of it). The thresholds are the ones
routing rules use (`routing.rules[].has_tools`, `reasoning`, `min_prompt_tokens`,
`shared_preamble`; policies/pools.py), so a class and a rule mean the same requests.
"""

from __future__ import annotations

from typing import Final, Literal

from policies.features import LONG_PREAMBLE_BLOCKS
from policies.types import RequestFeatures

TrafficClass = Literal["tools", "reasoning", "long_prompt", "shared_preamble", "plain"]
#: every traffic class, in the order of precedence
TRAFFIC_CLASSES: Final[tuple[TrafficClass, ...]] = (
    "tools",
    "reasoning",
    "long_prompt",
    "shared_preamble",
    "plain",
)
#: estimated prompt tokens from which a prompt is long: the long-prompt rule of the example config
#: (deploy/gateway.example.yaml), where prefill starts to dominate time to first token
LONG_PROMPT_TOKENS: Final = 2048


def traffic_class(features: RequestFeatures) -> TrafficClass:
    """The request's traffic class (module docstring)."""
    if features.has_tools:
        return "tools"
    if features.reasoning:
        return "reasoning"
    if features.prompt_tokens >= LONG_PROMPT_TOKENS:
        return "long_prompt"
    if features.preamble_blocks >= LONG_PREAMBLE_BLOCKS:
        return "shared_preamble"
    return "plain"
