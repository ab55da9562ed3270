"""instructor against a real gateway in front of real simulators, both dialects.

`Mode.JSON` sends `response_format: {"type": "json_object"}` with the model's JSON schema in the system
message (after the caller's own system text, when there is one). The answer must validate the first
time: `max_retries=0` turns instructor's re-ask off.
"""

from __future__ import annotations

from collections.abc import Iterator

import instructor
import openai
import pytest

from tests.clients.models import Order, Person, Role
from tests.clients.recording import Recorder
from tests.conftest import MODEL
from tests.support import GatewayProcess

pytestmark = pytest.mark.processes


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def client(pool_gateway: GatewayProcess, recorder: Recorder) -> Iterator[instructor.Instructor]:
    http = recorder.client()
    sdk = openai.OpenAI(
        base_url=pool_gateway.base_url + "/v1", api_key="unused", max_retries=0, http_client=http
    )
    yield instructor.from_openai(sdk, mode=instructor.Mode.JSON)
    http.close()


def _sent_once_in_json_mode(recorder: Recorder, engine: str) -> str:
    """The system message of the one request sent, after checking it was JSON mode to `engine`."""
    assert len(recorder.bodies) == 1 and recorder.pools == [engine]
    body = recorder.bodies[0]
    assert body["response_format"] == {"type": "json_object"}
    system = [m["content"] for m in body["messages"] if m["role"] == "system"]
    assert len(system) == 1 and '"$defs"' in system[0]
    return str(system[0])


def test_json_mode_returns_a_validated_object(
    client: instructor.Instructor, recorder: Recorder, engine: str
) -> None:
    person = client.chat.completions.create(
        model=MODEL,
        response_model=Person,
        max_retries=0,
        messages=[{"role": "user", "content": "Ada Lovelace is a 36 year old admin in London."}],
    )
    assert isinstance(person, Person) and isinstance(person.role, Role)
    _sent_once_in_json_mode(recorder, engine)


def test_json_mode_after_the_callers_system_message(
    client: instructor.Instructor, recorder: Recorder, engine: str
) -> None:
    order = client.chat.completions.create(
        model=MODEL,
        response_model=Order,
        max_retries=0,
        messages=[
            {"role": "system", "content": "You turn emails into orders."},
            {"role": "user", "content": "Ada wants two pens and a notebook, please."},
        ],
    )
    assert isinstance(order, Order) and order.items and isinstance(order.customer, Person)
    assert _sent_once_in_json_mode(recorder, engine).startswith("You turn emails into orders.")
