"""JSON mode and agent tool loops on the wire of both dialects' simulators, streamed and not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from engines.sim.launcher import start_all, stop_all
from tests.engines.sim.agent_loop import TOOLS, USER, step
from tests.engines.sim.helpers import post, sim, stream

pytestmark = pytest.mark.processes

CHAT = "/v1/chat/completions"
PERSON = TOOLS[1]["function"]["parameters"]  # type: ignore[index]
SIMS = {
    "vllm": ("vllm", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
    "sglang": ("sglang", "--tool-call-parser", "qwen25"),
    "sglang-no-parser": ("sglang",),
}


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, str]]:
    procs = {name: sim(*flags) for name, flags in SIMS.items()}
    start_all(list(procs.values()))
    try:
        yield {name: p.base_url for name, p in procs.items()}
    finally:
        stop_all(list(procs.values()))


def streamed_text(events: list[Any]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events if isinstance(e, dict) and e["choices"]
    )


def streamed_calls(events: list[Any]) -> list[tuple[str, str]]:
    calls: dict[int, list[str]] = {}
    for e in events:
        if not (isinstance(e, dict) and e["choices"]):
            continue
        for tc in e["choices"][0]["delta"].get("tool_calls") or ():
            entry = calls.setdefault(tc["index"], ["", ""])
            entry[0] += tc["function"].get("name") or ""
            entry[1] += tc["function"].get("arguments") or ""
    return [(name, args) for name, args in calls.values()]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_json_mode_follows_the_system_schema_streamed_or_not(sims: dict[str, str], engine: str) -> None:
    system = f"Match the following json_schema:\n\n{json.dumps(PERSON, indent=2)}\n\nNot the schema itself."
    body = {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Ada."}],
        "response_format": {"type": "json_object"},
    }
    whole = post(sims[engine], CHAT, body).json()["choices"][0]
    assert whole["finish_reason"] == "stop"
    jsonschema.validate(json.loads(whole["message"]["content"]), PERSON)
    assert streamed_text(stream(sims[engine], CHAT, body)) == whole["message"]["content"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_required_loop_moves_on_to_the_output_tool(sims: dict[str, str], engine: str) -> None:
    first = {"messages": USER, "tools": TOOLS, "tool_choice": "required"}
    msg = post(sims[engine], CHAT, first).json()["choices"][0]["message"]
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["lookup_person"]
    second = {**first, "messages": [*USER, *step("lookup_person")]}
    choice = post(sims[engine], CHAT, second).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (made,) = choice["message"]["tool_calls"]
    assert made["function"]["name"] == "final_result"
    jsonschema.validate(json.loads(made["function"]["arguments"]), PERSON)
    assert streamed_calls(stream(sims[engine], CHAT, second)) == [
        ("final_result", made["function"]["arguments"])
    ]


def test_required_loop_without_a_parser_names_the_output_tool_in_content(sims: dict[str, str]) -> None:
    """SGLang without a tool parser: `required` leaves a JSON array of calls in `content`."""
    body = {"messages": [*USER, *step("lookup_person")], "tools": TOOLS, "tool_choice": "required"}
    choice = post(sims["sglang-no-parser"], CHAT, body).json()["choices"][0]
    (made,) = json.loads(choice["message"]["content"])
    assert made["name"] == "final_result"
    jsonschema.validate(made["parameters"], PERSON)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_auto_answers_in_text_after_the_tool_result(sims: dict[str, str], engine: str) -> None:
    body = {"messages": [*USER, *step("lookup_person")], "tools": TOOLS}
    choice = post(sims[engine], CHAT, body).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and not choice["message"].get("tool_calls")
    assert choice["message"]["content"]
