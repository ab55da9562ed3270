"""The tool rule (`engines.sim.tools.choose_calls`), decision by decision, and the arguments the
generator writes for each call."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from engines.sim.generator import GenSpec, generate
from engines.sim.tools import called_this_turn, choose_calls
from tests.engines.sim.agent_loop import TOOLS, USER, step


def names(calls: list[tuple[str, Any]]) -> list[str]:
    return [name for name, _ in calls]


def test_required_agent_loop_calls_each_tool_once_then_ends_on_the_output_tool() -> None:
    """pydantic-ai's loop: `required` with [lookup_person, final_result] on every step."""
    assert names(choose_calls(USER, TOOLS, "required")) == ["lookup_person"]
    after_lookup = [*USER, *step("lookup_person")]
    assert names(choose_calls(after_lookup, TOOLS, "required")) == ["final_result"]
    # the output tool's arguments were rejected (its retry is a tool result): every tool has been
    # called, so the last one, the output tool, again
    after_final = [*after_lookup, *step("final_result")]
    assert names(choose_calls(after_final, TOOLS, "required")) == ["final_result"]


def test_required_counts_only_the_current_turn() -> None:
    """A new user message is a new task: the tools may be used again (a run over message history)."""
    history = [*USER, *step("lookup_person"), *step("final_result")]
    again = [*history, {"role": "user", "content": "And Grace?"}]
    assert called_this_turn(history) == {"lookup_person", "final_result"}
    assert called_this_turn(again) == set()
    assert names(choose_calls(again, TOOLS, "required")) == ["lookup_person"]


def test_required_prefers_uncalled_tools_named_by_the_user() -> None:
    tools = [{"type": "function", "function": {"name": n}} for n in ("alpha", "beta", "gamma")]
    user = [{"role": "user", "content": "use gamma and alpha"}]
    assert names(choose_calls(user, tools, "required")) == ["alpha", "gamma"]
    assert names(choose_calls(user, tools, "required", parallel=False)) == ["alpha"]
    assert names(choose_calls([*user, *step("alpha")], tools, "required")) == ["gamma"]
    assert names(choose_calls([*user, *step("alpha", "gamma")], tools, "required")) == ["beta"]
    assert names(choose_calls([*user, *step("alpha", "gamma"), *step("beta")], tools, "required")) == [
        "gamma"
    ]


def test_legacy_function_call_counts_as_called() -> None:
    msgs = [*USER, {"role": "assistant", "content": None, "function_call": {"name": "lookup_person"}}]
    assert names(choose_calls(msgs, TOOLS, "required")) == ["final_result"]


def test_auto_answers_in_text_after_a_tool_result() -> None:
    assert names(choose_calls(USER, TOOLS, "auto")) == ["lookup_person"]
    assert choose_calls([*USER, *step("lookup_person")], TOOLS, "auto") == []
    assert choose_calls([{"role": "user", "content": "no tools please"}], TOOLS, "auto") == []
    named = [{"role": "user", "content": "call final_result"}]
    assert names(choose_calls(named, TOOLS, "auto")) == ["final_result"]


def test_named_tool_choice_always_calls_that_tool() -> None:
    choice = {"type": "function", "function": {"name": "lookup_person"}}
    after = [*USER, *step("lookup_person")]
    assert names(choose_calls(after, TOOLS, choice)) == ["lookup_person"]
    assert choose_calls(USER, TOOLS, "none") == [] and choose_calls(USER, [], "required") == []


def test_arguments_follow_each_tools_parameters() -> None:
    both = tuple((t["function"]["name"], t["function"]["parameters"]) for t in TOOLS)  # type: ignore[index]
    for seed in range(200):
        out = generate(GenSpec(seed=seed, tool_calls=both))
        assert out.finish_reason == "tool_calls" and [c.name for c in out.tool_calls] == names(list(both))
        for made, (_, params) in zip(out.tool_calls, both, strict=True):
            jsonschema.validate(json.loads(made.arguments), params)


def test_a_tool_without_parameters_gets_an_empty_object() -> None:
    out = generate(
        GenSpec(seed=1, tool_calls=(("now", None), ("ping", {"type": "object", "properties": {}})))
    )
    assert [c.arguments for c in out.tool_calls] == ["{}", "{}"]


def test_same_conversation_same_calls() -> None:
    msgs = [*USER, *step("lookup_person")]
    first = generate(GenSpec(seed=7, tool_calls=tuple(choose_calls(msgs, TOOLS, "required"))))
    again = generate(GenSpec(seed=7, tool_calls=tuple(choose_calls(msgs, TOOLS, "required"))))
    assert again == first and first.tool_calls[0].name == "final_result"
