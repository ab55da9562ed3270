"""When the simulated model calls a tool, and which one (a deterministic, documented rule).

It plays an agent that uses each tool once per task and then answers, so agent loops end as they do
with a real model (pydantic-ai, for one, sends `tool_choice: "required"` with its function tools and
then its output tool `final_result`; a model that kept calling the first tool ran into the client's
request limit). The *turn* is everything after the last user message; a tool is *called* in it when an
assistant message of the turn has a `tool_calls` entry (or legacy `function_call`) with its name.

- `tool_choice` `none` (or no tools): never.
- a named function: always that function.
- `auto` (the default with tools): a call, unless the last message is a tool result (the model then
  answers in text, closing the loop) or the last user message contains "no tools".
- `required`: always a call, to a tool the turn has not called yet; once every tool has been called,
  the last tool in `tools` (where agent frameworks put their output tool: its call ends their loop).
- Which tool, among those still eligible: every one whose name appears in the last user message (one
  call each, in `tools` order; only the first when `parallel_tool_calls` is false); if none is named,
  the first.
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


def called_this_turn(messages: list[Any]) -> set[str]:
    """Names of the functions the assistant called after the last user message."""
    names: set[str] = set()
    for msg in reversed(messages):
        if not isinstance(msg, dict):
            continue
        if msg.get("role") == "user":
            break
        if msg.get("role") != "assistant":
            continue
        calls = list(msg.get("tool_calls") or ())
        if isinstance(msg.get("function_call"), dict):
            calls.append({"function": msg["function_call"]})
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                names.add(fn["name"])
    return names


def choose_calls(
    messages: list[Any], tools: list[Any], tool_choice: Any, parallel: bool = True
) -> list[tuple[str, Any]]:
    """(name, parameters schema) of each call the model makes; [] means a text answer."""
    if not tools or tool_choice == "none":
        return []
    named = named_function(tool_choice)
    if named is not None:
        return [(tool_name(t), tool_params(t)) for t in tools if tool_name(t) == named][:1]
    lowered = last_user_text(messages).lower()
    if tool_choice == "required":
        called = called_this_turn(messages)
        eligible = [t for t in tools if tool_name(t) not in called] or list(tools[-1:])
    elif last_role(messages) == "tool" or "no tools" in lowered:
        return []
    else:
        eligible = list(tools)
    picked = [t for t in eligible if tool_name(t) and tool_name(t).lower() in lowered] or eligible[:1]
    if not parallel:
        picked = picked[:1]
    return [(tool_name(t), tool_params(t)) for t in picked]
