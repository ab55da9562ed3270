"""pydantic-ai agents against a real gateway in front of real simulators, both dialects.

With a pydantic `output_type`, pydantic-ai gives the model its function tools plus an output tool
(`final_result`) and sends `tool_choice: "required"` on every step; the run ends when the output tool
is called with valid arguments. The simulated model calls each tool once per turn, then the output
tool, so the loop ends in two requests (not the first tool again until the request limit).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic_ai import Agent, PromptedOutput
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

from tests.clients.models import Person
from tests.clients.recording import Recorder
from tests.conftest import MODEL
from tests.support import GatewayProcess

pytestmark = pytest.mark.processes

LIMITS = UsageLimits(request_limit=5)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def model(pool_gateway: GatewayProcess, recorder: Recorder) -> AsyncIterator[OpenAIChatModel]:
    http = recorder.async_client()
    provider = OpenAIProvider(base_url=pool_gateway.base_url + "/v1", api_key="unused", http_client=http)
    yield OpenAIChatModel(MODEL, provider=provider)
    await http.aclose()


def _tool_calls(messages: list[object]) -> list[str]:
    return [
        part.tool_name
        for msg in messages
        if isinstance(msg, ModelResponse)
        for part in msg.parts
        if isinstance(part, ToolCallPart)
    ]


async def test_agent_calls_its_tool_then_its_output_tool(
    model: OpenAIChatModel, recorder: Recorder, engine: str
) -> None:
    agent = Agent(model, output_type=Person, instructions="Look people up before you answer.")
    looked_up: list[str] = []

    @agent.tool_plain
    def lookup_person(name: str) -> str:
        """Look a person up by name."""
        looked_up.append(name)
        return f"{name}: 36 years old, admin, lives in London (GB)."

    result = await agent.run("Who is Ada Lovelace?", usage_limits=LIMITS)
    assert isinstance(result.output, Person)
    assert len(looked_up) == 1 and isinstance(looked_up[0], str)
    assert _tool_calls(result.all_messages()) == ["lookup_person", "final_result"]
    assert [b["tool_choice"] for b in recorder.bodies] == ["required", "required"]
    assert [t["function"]["name"] for t in recorder.bodies[0]["tools"]] == ["lookup_person", "final_result"]
    assert recorder.pools == [engine, engine]


async def test_agent_with_text_output_answers_after_the_tool_result(
    model: OpenAIChatModel, recorder: Recorder, engine: str
) -> None:
    """Text output allowed: `tool_choice` auto; the model calls the tool, then answers in text."""
    agent = Agent(model, instructions="Use the tool.")
    seen: list[str] = []

    @agent.tool_plain
    def local_time(city: str) -> str:
        """The local time in a city."""
        seen.append(city)
        return "14:05"

    result = await agent.run("What time is it in Lisbon?", usage_limits=LIMITS)
    assert isinstance(result.output, str) and result.output
    assert len(seen) == 1 and _tool_calls(result.all_messages()) == ["local_time"]
    assert [b.get("tool_choice", "auto") for b in recorder.bodies] == ["auto", "auto"]
    assert recorder.pools == [engine, engine]


async def test_prompted_output_follows_the_schema_in_the_instructions(
    model: OpenAIChatModel, recorder: Recorder, engine: str
) -> None:
    """`PromptedOutput`: JSON mode with the schema in the system prompt, valid on the first answer (one
    request: no retry)."""
    agent = Agent(model, output_type=PromptedOutput(Person))
    result = await agent.run("Who is Ada Lovelace?", usage_limits=LIMITS)
    assert isinstance(result.output, Person)
    assert [b["response_format"] for b in recorder.bodies] == [{"type": "json_object"}]
    assert recorder.pools == [engine]
