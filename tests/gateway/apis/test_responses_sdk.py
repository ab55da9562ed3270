"""`/v1/responses` with the real `openai` SDK, over both engines' pools: the answers must be OpenAI's
shapes and identical in form whichever engine answered."""

from __future__ import annotations

import json
import re
from typing import Any

import openai
import pytest

from tests.conftest import MODEL
from tests.gateway.apis.conftest import Rig
from tests.support import HTTP

pytestmark = pytest.mark.processes

WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


def _client(rig: Rig, token: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=rig.base_url + "/v1", api_key=token or rig.alice, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def client(rig: Rig) -> openai.OpenAI:
    return _client(rig)


def test_create(client: openai.OpenAI, rig: Rig) -> None:
    r = client.responses.create(model=MODEL, input="Tell me about the sea.", instructions="Be brief.")
    assert re.fullmatch(r"resp_[0-9a-f]{48}", r.id)
    assert r.object == "response" and r.status == "completed" and r.model == MODEL
    assert r.instructions == "Be brief."
    assert r.output_text
    [msg] = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.status == "completed"
    assert re.fullmatch(r"msg_[0-9a-f]{48}", msg.id)
    assert msg.content[0].type == "output_text" and msg.content[0].annotations == []
    assert r.usage is not None
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.usage.input_tokens_details.cached_tokens >= 0
    assert r.usage.output_tokens_details.reasoning_tokens == 0


def test_stream_events_and_retrieve(client: openai.OpenAI) -> None:
    with client.responses.stream(model=MODEL, input="Tell me about the sea.") as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and final.output_text == text
    assert final.status == "completed" and final.usage is not None and final.usage.output_tokens > 0
    # stored before the last event went out: readable at once, the same object
    again = client.responses.retrieve(final.id)
    assert again.id == final.id and again.output_text == text
    assert again.usage is not None and again.usage.output_tokens == final.usage.output_tokens


def test_function_tool_round_trip_through_previous_response_id(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="What is the weather in Lisbon?", tools=[WEATHER])
    [call] = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and re.fullmatch(r"call_[0-9a-f]{24}", call.call_id)
    assert isinstance(json.loads(call.arguments), dict)
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 21}'}],
        tools=[WEATHER],
    )
    assert second.previous_response_id == first.id
    assert second.output_text and not [o for o in second.output if o.type == "function_call"]
    items = client.responses.input_items.list(second.id)
    assert [i.type for i in items.data] == ["function_call_output"]


def test_streamed_function_call(client: openai.OpenAI) -> None:
    with client.responses.stream(model=MODEL, input="Weather in Porto?", tools=[WEATHER]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    [call] = [o for o in final.output if o.type == "function_call"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == call.arguments and json.loads(call.arguments)


def test_json_schema_text_format(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    r = client.responses.create(
        model=MODEL,
        input="A person.",
        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}},
    )
    data = json.loads(r.output_text)
    assert set(data) == {"name", "age"}
    assert r.text is not None and r.text.format.type == "json_schema"


def test_store_false_is_not_stored_and_delete(client: openai.OpenAI) -> None:
    unstored = client.responses.create(model=MODEL, input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    stored = client.responses.create(model=MODEL, input="hi")
    client.responses.delete(stored.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(stored.id)


def test_another_users_response_is_not_found(client: openai.OpenAI, rig: Rig) -> None:
    mine = client.responses.create(model=MODEL, input="a secret")
    bob = _client(rig, rig.bob)
    with pytest.raises(openai.NotFoundError) as err:
        bob.responses.retrieve(mine.id)
    assert err.value.body == {  # the same answer as for an id that never existed
        "message": f"Response with id '{mine.id}' not found.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    with pytest.raises(openai.NotFoundError) as err:
        bob.responses.create(model=MODEL, input="go on", previous_response_id=mine.id)
    assert isinstance(err.value.body, dict)
    assert err.value.body["code"] == "previous_response_not_found"
    assert err.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(mine.id)
    assert client.responses.retrieve(mine.id).id == mine.id


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "no-such-model", "input": "hi"}, 404, None),
        ({"model": MODEL, "input": [{"role": "robot", "content": "hi"}]}, 400, "input[0].role"),
        ({"model": MODEL, "input": [{"role": "user"}]}, 400, "input[0].content"),
        (
            {"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_text"}]}]},
            400,
            "input[0].content[0].text",
        ),
        ({"model": MODEL, "input": [{"type": "computer_call", "id": "x"}]}, 400, "input[0].type"),
        (
            {
                "model": MODEL,
                "input": [{"type": "function_call_output", "call_id": "call_nope", "output": "1"}],
            },
            400,
            "input[0].call_id",
        ),
        ({"model": MODEL, "input": 42}, 400, "input"),
        ({"model": MODEL, "input": "hi", "max_output_tokens": 4}, 400, "max_output_tokens"),
        ({"model": MODEL, "input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        ({"model": MODEL, "input": "hi", "tool_choice": "required"}, 400, "tool_choice"),
        ({"model": MODEL, "input": "hi", "temperature": 3}, 400, "temperature"),
        ({"model": MODEL, "input": "hi", "background": True}, 400, "background"),
    ],
)
def test_bad_input_in_openais_error_shape(
    rig: Rig, body: dict[str, Any], status: int, param: str | None
) -> None:
    r = HTTP.post(rig.base_url + "/v1/responses", json=body, headers={"authorization": f"Bearer {rig.alice}"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["message"]


def test_unknown_model_is_not_found_error(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model="no-such-model", input="hi")
    assert isinstance(err.value.body, dict) and err.value.body["code"] == "model_not_found"


def test_unauthenticated_is_openai_401(rig: Rig) -> None:
    with pytest.raises(openai.AuthenticationError):
        _client(rig, "not-a-token").responses.create(model=MODEL, input="hi")
