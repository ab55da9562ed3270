"""LangChain's `ChatOpenAI` against a real gateway in front of real simulators, both dialects.

`with_structured_output(..., method="json_mode")` sends `response_format: {"type": "json_object"}` and
nothing else: LangChain's docs tell the caller to put the wanted format in the prompt. These tests do
it the ways its users do, and the parsed object must validate on the first answer (`max_retries=0`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from langchain_core.output_parsers import PydanticOutputParser
from langchain_openai import ChatOpenAI

from tests.clients.models import AnswerWithJustification, Order, Person
from tests.clients.recording import Recorder
from tests.conftest import MODEL
from tests.support import GatewayProcess

pytestmark = pytest.mark.processes


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def llm(pool_gateway: GatewayProcess, recorder: Recorder) -> Iterator[ChatOpenAI]:
    http = recorder.client()
    yield ChatOpenAI(
        model=MODEL,
        base_url=pool_gateway.base_url + "/v1",
        api_key="unused",  # type: ignore[arg-type]
        max_retries=0,
        http_client=http,
    )
    http.close()


def _sent_json_mode(recorder: Recorder, engine: str) -> None:
    assert [b.get("response_format") for b in recorder.bodies] == [{"type": "json_object"}]
    assert recorder.pools == [engine]


def test_json_mode_follows_format_instructions_in_the_system_message(
    llm: ChatOpenAI, recorder: Recorder, engine: str
) -> None:
    """PydanticOutputParser's instructions: an example schema and objects first, the schema last."""
    instructions = PydanticOutputParser(pydantic_object=Person).get_format_instructions()
    structured = llm.with_structured_output(Person, method="json_mode")
    person = structured.invoke(
        [("system", "Extract the person.\n" + instructions), ("human", "Ada Lovelace, 36, admin, London.")]
    )
    assert isinstance(person, Person)
    _sent_json_mode(recorder, engine)


def test_json_mode_follows_a_schema_pasted_into_the_question(
    llm: ChatOpenAI, recorder: Recorder, engine: str
) -> None:
    """The schema as JSON in the user message: a nested model with `$defs`, a UUID, a datetime, an
    enum, a pattern and bounds."""
    schema = json.dumps(Order.model_json_schema())
    structured = llm.with_structured_output(Order, method="json_mode")
    order = structured.invoke(f"Reply in JSON matching this schema:\n{schema}\n\nOrder 7 for Ada: two pens.")
    assert isinstance(order, Order) and order.items
    _sent_json_mode(recorder, engine)


def test_json_mode_follows_a_schema_written_as_a_python_dict(
    llm: ChatOpenAI, recorder: Recorder, engine: str
) -> None:
    """An f-string of `model_json_schema()` prints Python's repr (single quotes, None), not JSON."""
    structured = llm.with_structured_output(Person, method="json_mode")
    person = structured.invoke(
        f"Who is Ada Lovelace? Answer as JSON with this schema: {Person.model_json_schema()}"
    )
    assert isinstance(person, Person)
    _sent_json_mode(recorder, engine)


def test_json_mode_with_keys_named_in_prose(llm: ChatOpenAI, recorder: Recorder, engine: str) -> None:
    """LangChain's own json_mode example, word for word."""
    structured = llm.with_structured_output(AnswerWithJustification, method="json_mode")
    result = structured.invoke(
        "Answer the following question. "
        "Make sure to return a JSON blob with keys 'answer' and 'justification'.\n\n"
        "What's heavier a pound of bricks or a pound of feathers?"
    )
    assert isinstance(result, AnswerWithJustification) and result.answer and result.justification
    _sent_json_mode(recorder, engine)


def test_json_mode_without_instructions_is_still_a_json_object(
    llm: ChatOpenAI, recorder: Recorder, engine: str
) -> None:
    """No format asked for (schema None): a small object with content, not `{}`."""
    result = llm.with_structured_output(None, method="json_mode").invoke("Tell me about the sea, in JSON.")
    assert isinstance(result, dict) and result and all(result.values())
    _sent_json_mode(recorder, engine)
