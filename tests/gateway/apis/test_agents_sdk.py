"""The OpenAI Agents SDK's default model (its Responses-API model, under the model name it picks when
an agent names none) end to end through the gateway, with a function tool, over both pools."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled
from agents.models.openai_responses import OpenAIResponsesModel
from openai import AsyncOpenAI

from tests.gateway.apis.conftest import AGENTS_DEFAULT_MODEL, Rig

pytestmark = pytest.mark.processes

CALLS: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    CALLS.append(city)
    return f"21 degrees and sunny in {city}"


@pytest.fixture
def agent(rig: Rig) -> Iterator[Agent]:
    set_tracing_disabled(True)  # no trace export: the test stays on loopback
    set_default_openai_client(
        AsyncOpenAI(base_url=rig.base_url + "/v1", api_key=rig.alice, max_retries=0), use_for_tracing=False
    )
    CALLS.clear()
    yield Agent(name="weather", instructions="Answer with the tool's help.", tools=[get_weather])


def test_default_model_runs_a_function_tool_to_a_final_answer(agent: Agent) -> None:
    result = asyncio.run(Runner.run(agent, "What is the weather in Lisbon?"))
    assert CALLS, "the agent never called its tool"
    assert isinstance(result.final_output, str) and result.final_output
    responses = result.raw_responses
    assert len(responses) == 2  # the tool call, then the answer after the tool's output
    assert responses[0].response_id and responses[0].response_id.startswith("resp_")
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert all(r.usage.output_tokens > 0 for r in responses)


def test_default_model_streamed(agent: Agent) -> None:
    async def run() -> tuple[str, list[str]]:
        streamed = Runner.run_streamed(agent, "Weather in Porto?")
        kinds = [event.type async for event in streamed.stream_events()]
        return str(streamed.final_output), kinds

    final, kinds = asyncio.run(run())
    assert CALLS and final
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds


def test_it_is_the_responses_model_under_the_default_name(agent: Agent) -> None:
    from agents.models.multi_provider import MultiProvider

    model = MultiProvider().get_model(None)
    assert isinstance(model, OpenAIResponsesModel) and model.model == AGENTS_DEFAULT_MODEL
