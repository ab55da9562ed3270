"""Structural signatures of engine answers, for comparing a simulator with the real engine it imitates.

A signature keeps what a client's parser depends on and drops what random weights, clocks and ids
make differ between two runs:

- a JSON body becomes the set of its `path: type` pairs (`choices[].message.content: string`); list
  elements are merged under `[]`, so two choices or twenty logprobs give the same signature; numbers
  are one type (`number`), as in JSON;
- an SSE stream becomes its framing (`data: ` events, `[DONE]` last), the sequence of its chunk
  *kinds* per choice with repeats collapsed (`role`, `content`, `tool-head`, `tool-args`,
  `content+finish`, `finish`, …), where the usage chunk (`choices: []`) comes, and the `path: type`
  pairs of each kind's chunks.

Values are compared only where they are structure: the HTTP status, the content type, which chunk
carries the role, the finish_reason or the usage. Generated text, token counts, ids and timestamps
never are.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


# Values that are structure, not output: compared as `path = value` (digits in messages as `N`).
VALUE_PATHS = frozenset(
    {
        ".object",
        ".type",
        ".code",
        ".param",
        ".message",
        ".error.type",
        ".error.code",
        ".error.param",
        ".error.message",
        ".error.object",
        ".choices[].finish_reason",
        ".choices[].message.role",
        ".choices[].delta.role",
        ".choices[].message.tool_calls[].type",
        ".choices[].delta.tool_calls[].type",
        ".choices[].message.tool_calls[].function.name",
        ".choices[].delta.tool_calls[].function.name",
        ".data[].object",
    }
)
# Objects whose keys are data (legacy completions' top_logprobs: {token: logprob}).
MAPS = frozenset({".choices[].logprobs.top_logprobs[]"})


def paths(value: Any, prefix: str = "") -> set[str]:
    """Every `path: type` in `value`; list elements under `path[]` (an empty list: only `path: array`);
    `path = value` too for the paths in VALUE_PATHS."""
    out = {f"{prefix or '.'}: {json_type(value)}"}
    if prefix in VALUE_PATHS and not isinstance(value, dict | list):
        shown = re.sub(r"\d+", "N", value) if isinstance(value, str) else value
        out.add(f"{prefix} = {json.dumps(shown)}")
    if isinstance(value, dict):
        for key, item in value.items():
            out |= paths(item, f"{prefix}.{'*' if prefix in MAPS else key}")
    elif isinstance(value, list):
        for item in value:
            out |= paths(item, f"{prefix}[]")
    return out


def chunk_kind(chunk: dict[str, Any], choice: dict[str, Any] | None) -> str:
    """What one (chunk, choice) carries: `role`, `content`, `reasoning`, `tool-head` (a tool call's
    id/name), `tool-args`, `text` (completions), `empty`; `+finish` when it carries the finish_reason;
    `usage` for a chunk without choices; `error` for an error event."""
    if "error" in chunk:
        return "error"
    if choice is None:
        return "usage"
    parts: list[str] = []
    delta = choice.get("delta")
    if isinstance(delta, dict):
        if delta.get("role") is not None:
            parts.append("role")
        elif delta.get("tool_calls"):
            heads = [c for c in delta["tool_calls"] if c.get("id") or (c.get("function") or {}).get("name")]
            parts.append("tool-head" if heads else "tool-args")
        elif isinstance(delta.get("content"), str):
            parts.append("content")
        elif delta.get("reasoning") is not None or delta.get("reasoning_content") is not None:
            parts.append("reasoning")
    elif isinstance(choice.get("text"), str):
        parts.append("text")
    if choice.get("finish_reason") is not None:
        parts.append("finish")
    return "+".join(parts) or "empty"


def _collapse(kinds: list[str]) -> list[str]:
    out: list[str] = []
    for kind in kinds:
        if not out or out[-1] != kind:
            out.append(kind)
    return out


@dataclass
class Shape:
    """The signature of one answer."""

    status: int
    content_type: str  # "json", "sse", "empty", "text" or "other"
    body: set[str] = field(default_factory=set)  # path: type pairs (non-streamed)
    framing: list[str] = field(default_factory=list)  # SSE framing faults (empty when clean)
    sequence: dict[str, list[str]] = field(default_factory=dict)  # per choice index (and "all")
    kinds: dict[str, set[str]] = field(default_factory=dict)  # chunk kind -> path: type pairs

    def describe(self) -> str:
        lines = [f"status {self.status}, {self.content_type}"]
        lines += [f"  body {p}" for p in sorted(self.body)]
        lines += [f"  framing: {f}" for f in self.framing]
        lines += [f"  sequence[{k}] = {' '.join(v)}" for k, v in sorted(self.sequence.items())]
        for kind, ps in sorted(self.kinds.items()):
            lines += [f"  {kind} {p}" for p in sorted(ps)]
        return "\n".join(lines)


def _content_type(response: httpx.Response) -> str:
    ctype = response.headers.get("content-type", "")
    if not response.content:
        return "empty"
    if ctype.startswith("application/json"):
        return "json"
    if ctype.startswith("text/event-stream"):
        return "sse"
    if ctype.startswith("text/plain"):
        return "text"
    return "other"


def shape_of(response: httpx.Response) -> Shape:
    shape = Shape(response.status_code, _content_type(response))
    if shape.content_type == "json":
        shape.body = paths(response.json())
    elif shape.content_type == "sse":
        _stream_shape(response.text, shape)
    return shape


def _stream_shape(text: str, shape: Shape) -> None:
    if not text.endswith("\n\n"):
        shape.framing.append("does not end with a blank line")
    events = [e for e in text.split("\n\n") if e]
    if not events or events[-1] != "data: [DONE]":
        shape.framing.append("last event is not data: [DONE]")
    everything: list[str] = []
    per_choice: dict[str, list[str]] = {}
    for event in events[:-1]:
        if not event.startswith("data: ") or "\n" in event:
            shape.framing.append(f"not one data line: {event[:80]!r}")
            continue
        chunk = json.loads(event.removeprefix("data: "))
        choices = chunk.get("choices") if isinstance(chunk.get("choices"), list) else []
        for choice in choices or [None]:
            kind = chunk_kind(chunk, choice)
            everything.append(kind)
            if choice is not None:
                per_choice.setdefault(str(choice.get("index")), []).append(kind)
            # the chunk's own keys, with the choice list reduced to this choice
            one = {**chunk, "choices": [choice] if choice is not None else []}
            shape.kinds.setdefault(kind, set()).update(paths(one))
    shape.sequence = {index: _collapse(kinds) for index, kinds in per_choice.items()}
    shape.sequence["all"] = _collapse(["choice" if k != "usage" else k for k in everything])


def differences(sim: Shape, real: Shape) -> list[str]:
    """What differs, one line each: `status`, `content-type`, `body +path` (only the simulator has it)
    / `body -path` (only the real engine), `framing`, `sequence[i]`, `<kind> ±path`."""
    out: list[str] = []
    if sim.status != real.status:
        out.append(f"status sim={sim.status} real={real.status}")
    if sim.content_type != real.content_type:
        out.append(f"content-type sim={sim.content_type} real={real.content_type}")
    out += [f"body +{p}" for p in sorted(sim.body - real.body)]
    out += [f"body -{p}" for p in sorted(real.body - sim.body)]
    if sim.framing != real.framing:
        out.append(f"framing sim={sim.framing} real={real.framing}")
    for index in sorted(set(sim.sequence) | set(real.sequence)):
        a, b = sim.sequence.get(index), real.sequence.get(index)
        if a != b:
            out.append(f"sequence[{index}] sim={' '.join(a or [])} real={' '.join(b or [])}")
    for kind in sorted(set(sim.kinds) & set(real.kinds)):
        out += [f"{kind} +{p}" for p in sorted(sim.kinds[kind] - real.kinds[kind])]
        out += [f"{kind} -{p}" for p in sorted(real.kinds[kind] - sim.kinds[kind])]
    return out
