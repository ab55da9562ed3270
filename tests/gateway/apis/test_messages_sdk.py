"""`/v1/messages` and `/v1/messages/count_tokens` with the real `anthropic` SDK, over both engines'
pools: Anthropic's shapes, event sequence and error types whichever engine answered."""

from __future__ import annotations

import re
from typing import Any

import anthropic
import pytest

from tests.conftest import MODEL
from tests.gateway.apis.conftest import Rig
from tests.support import HTTP

pytestmark = pytest.mark.processes

WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
HI: list[Any] = [{"role": "user", "content": "Tell me about the sea."}]


def _client(rig: Rig, key: str | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=rig.base_url, api_key=key or rig.alice, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def client(rig: Rig) -> anthropic.Anthropic:
    return _client(rig)


def test_create(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model=MODEL, max_tokens=200, system="Be brief.", messages=HI)
    assert re.fullmatch(r"msg_[0-9a-f]{24}", m.id)
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    [block] = m.content
    assert block.type == "text" and block.text
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0
    assert m.usage.cache_read_input_tokens is not None


def test_max_tokens_stop_reason(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model=MODEL, max_tokens=3, messages=HI)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_stream(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model=MODEL, max_tokens=200, messages=HI) as stream:
        events = list(stream)
        final = stream.get_final_message()
    raw = [e.type for e in events if e.type not in ("text",)]
    assert raw[0] == "message_start"
    assert raw[1] == "content_block_start"
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    text = "".join(
        e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason == "end_turn"
    # message_delta carries the engine's own figures, which replace message_start's estimate
    delta = next(e for e in events if e.type == "message_delta")
    assert final.usage.output_tokens == delta.usage.output_tokens > 0
    assert final.usage.input_tokens == delta.usage.input_tokens


def test_stream_wire_has_ping_and_event_names(rig: Rig) -> None:
    body = {"model": MODEL, "max_tokens": 20, "stream": True, "messages": HI}
    r = HTTP.post(rig.base_url + "/v1/messages", json=body, headers={"x-api-key": rig.alice})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    names = [line[7:] for line in r.text.split("\n") if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-1] == "message_stop" and "[DONE]" not in r.text
    assert r.headers["request-id"] == r.headers["x-request-id"]


def test_tool_use_round_trip(client: anthropic.Anthropic) -> None:
    first = client.messages.create(
        model=MODEL,
        max_tokens=200,
        tools=[WEATHER],
        messages=[{"role": "user", "content": "Weather in Lisbon?"}],
    )
    assert first.stop_reason == "tool_use"
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and isinstance(use.input, dict)
    assert re.fullmatch(r"toolu_[0-9a-f]{24}", use.id)
    second = client.messages.create(
        model=MODEL,
        max_tokens=200,
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather in Lisbon?"},
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C, sunny"}],
            },
        ],
    )
    assert second.stop_reason == "end_turn"
    assert [b.type for b in second.content] == ["text"]


def test_streamed_tool_use(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model=MODEL,
        max_tokens=200,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather?"}],
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert deltas and all(d.type == "input_json_delta" for d in deltas)
    [use] = final.content
    assert use.type == "tool_use" and use.name == "get_weather" and isinstance(use.input, dict) and use.input
    assert final.stop_reason == "tool_use"


def test_count_tokens(client: anthropic.Anthropic) -> None:
    short = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    longer = client.messages.count_tokens(
        model=MODEL, system="You are a careful assistant.", tools=[WEATHER], messages=HI
    )
    assert 0 < short.input_tokens < longer.input_tokens


def test_bearer_credentials_work_too(rig: Rig) -> None:
    c = anthropic.Anthropic(base_url=rig.base_url, auth_token=rig.alice, max_retries=0, timeout=30)
    assert c.messages.create(model=MODEL, max_tokens=5, messages=HI).content


def test_errors_are_anthropics(client: anthropic.Anthropic, rig: Rig) -> None:
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="no-such-model", max_tokens=5, messages=HI)
    assert nf.value.body == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": "The model `no-such-model` does not exist or you do not have access to it.",
        },
    }
    with pytest.raises(anthropic.AuthenticationError) as au:
        _client(rig, "wrong-key").messages.create(model=MODEL, max_tokens=5, messages=HI)
    assert isinstance(au.value.body, dict) and au.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.BadRequestError) as br:
        client.messages.create(
            model=MODEL,
            max_tokens=5,
            messages=[
                {"role": "user", "content": "hi"},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}],
                },
            ],
        )
    assert isinstance(br.value.body, dict)
    assert br.value.body["error"]["type"] == "invalid_request_error"
    assert (
        "unexpected `tool_use_id` found in `tool_result` blocks: toolu_x" in br.value.body["error"]["message"]
    )


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"model": MODEL, "messages": HI}, "max_tokens: Field required"),
        (
            {"model": MODEL, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
            "messages.0.role",
        ),
        ({"model": MODEL, "max_tokens": 5, "messages": HI, "temperature": 1.5}, "temperature"),
        (
            {"model": MODEL, "max_tokens": 5, "messages": HI, "frequency_penalty": 1},
            "Extra inputs are not permitted",
        ),
        ({"model": MODEL, "max_tokens": 5, "messages": HI, "tool_choice": {"type": "any"}}, "needs tools"),
        (
            {
                "model": MODEL,
                "max_tokens": 5,
                "messages": HI,
                "tools": [{"type": "web_search_20250305", "name": "w"}],
            },
            "tools.0.type",
        ),
        (
            {
                "model": MODEL,
                "max_tokens": 5,
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}],
                    },
                    {"role": "user", "content": "and?"},
                ],
            },
            "`tool_use` ids were found without `tool_result` blocks immediately after: toolu_1",
        ),
    ],
)
def test_bad_input_in_anthropics_error_shape(rig: Rig, body: dict[str, Any], fragment: str) -> None:
    r = HTTP.post(
        rig.base_url + "/v1/messages",
        json=body,
        headers={"x-api-key": rig.alice, "anthropic-version": "2023-06-01"},
    )
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error"
    assert set(r.json()["error"]) == {"type", "message"}
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert fragment in r.json()["error"]["message"]


def test_method_not_allowed_is_anthropics_shape(rig: Rig) -> None:
    r = HTTP.get(rig.base_url + "/v1/messages", headers={"x-api-key": rig.alice})
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    assert r.headers["allow"] == "POST"
