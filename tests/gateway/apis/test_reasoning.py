"""Reasoning text (engines with a reasoning parser) as a Responses `reasoning` item and an Anthropic
`thinking` block, streamed and not, over both pools."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import anthropic
import openai
import pytest

from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.support import GatewayProcess

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def thinking_gw(engine: str) -> Iterator[GatewayProcess]:
    with contextlib.ExitStack() as st:
        sim = st.enter_context(fast_sim(engine, "--reasoning-parser", "qwen3"))
        yield st.enter_context(GatewayProcess(single_pool_config(engine, [sim.base_url])))


def test_responses_reasoning_item(thinking_gw: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=thinking_gw.base_url + "/v1", api_key="x", max_retries=0)
    r = client.responses.create(model=MODEL, input="Think, then answer.")
    assert [o.type for o in r.output] == ["reasoning", "message"]
    reasoning = r.output[0]
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert reasoning.content and reasoning.content[0].type == "reasoning_text" and reasoning.content[0].text
    assert r.usage is not None
    with client.responses.stream(model=MODEL, input="Think, then answer.") as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
    assert kinds.index("response.reasoning_text.delta") < kinds.index("response.output_text.delta")
    assert [o.type for o in final.output] == ["reasoning", "message"]


def test_messages_thinking_block(thinking_gw: GatewayProcess) -> None:
    client = anthropic.Anthropic(base_url=thinking_gw.base_url, api_key="x", max_retries=0)
    m = client.messages.create(model=MODEL, max_tokens=300, messages=[{"role": "user", "content": "Think."}])
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].type == "thinking" and m.content[0].thinking
    with client.messages.stream(
        model=MODEL, max_tokens=300, messages=[{"role": "user", "content": "Think."}]
    ) as s:
        deltas = [e.delta.type for e in s if e.type == "content_block_delta"]
        final = s.get_final_message()
    assert deltas[0] == "thinking_delta" and "signature_delta" in deltas and "text_delta" in deltas
    assert [b.type for b in final.content] == ["thinking", "text"]
