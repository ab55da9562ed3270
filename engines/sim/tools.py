"""When the simulated model calls a tool, and which one (a deterministic, documented rule).

- `tool_choice` `none` (or no tools): never.
- a named function: always that function.
- `required`: always; the tool is picked as for `auto`.
- `auto` (the default with tools): a call, unless the last message is a tool result (the model then
  answers in text, closing an agent loop) or the last user message contains "no tools".
- Which tool: every tool whose name appears in the last user message (one call each, in `tools` order;
  only the first when `parallel_tool_calls` is false); if none is named, the first tool.
"""

from __future__ import annotations

from typing import Any

from engines.sim.prompt import last_role, last_user_text


def tool_name(tool: Any) -> str:
    """The function name of one `tools` entry ("" if malformed)."""
    if isinstance(tool, dict):
        fn = tool.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return str(fn["name"])
    return ""


def tool_params(tool: Any) -> Any:
    """The parameters schema of one `tools` entry."""
    fn = tool.get("function") if isinstance(tool, dict) else None
    return fn.get("parameters") if isinstance(fn, dict) else None


def named_function(tool_choice: Any) -> str | None:
    """The function name of a named `tool_choice` object, else None."""
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return str(fn["name"])
        return ""
    return None


def choose_calls(
    messages: list[Any], tools: list[Any], tool_choice: Any, parallel: bool = True
) -> list[tuple[str, Any]]:
    """(name, parameters schema) of each call the model makes; [] means a text answer."""
    if not tools or tool_choice == "none":
        return []
    named = named_function(tool_choice)
    if named is not None:
        return [(tool_name(t), tool_params(t)) for t in tools if tool_name(t) == named][:1]
    text = last_user_text(messages)
    if tool_choice != "required" and (last_role(messages) == "tool" or "no tools" in text.lower()):
        return []
    lowered = text.lower()
    picked = [t for t in tools if tool_name(t) and tool_name(t).lower() in lowered] or list(tools[:1])
    if not parallel:
        picked = picked[:1]
    return [(tool_name(t), tool_params(t)) for t in picked]
