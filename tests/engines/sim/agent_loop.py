"""An agent's conversation as pydantic-ai sends it: a function tool, the output tool `final_result`,
and the messages of each step (shared by the tool-rule and wire tests)."""

from __future__ import annotations

from typing import Any

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup_person",
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
FINAL = {  # pydantic-ai's output tool, as it sends it (a `$defs` ref, an enum, bounds)
    "type": "function",
    "function": {
        "name": "final_result",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "role": {"enum": ["admin", "user"], "type": "string"},
                "address": {"$ref": "#/$defs/Address"},
            },
            "required": ["name", "age", "role", "address"],
            "additionalProperties": False,
            "$defs": {
                "Address": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                    "additionalProperties": False,
                }
            },
        },
    },
}
TOOLS = [LOOKUP, FINAL]


def call(name: str, i: int = 0) -> dict[str, Any]:
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}


def step(*names_: str) -> list[dict[str, Any]]:
    """An assistant message calling `names_`, then their tool results."""
    msgs: list[dict[str, Any]] = [
        {"role": "assistant", "content": None, "tool_calls": [call(n, i) for i, n in enumerate(names_)]}
    ]
    msgs += [{"role": "tool", "tool_call_id": f"c{i}", "content": "done"} for i in range(len(names_))]
    return msgs


USER = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "Who is Ada?"}]
