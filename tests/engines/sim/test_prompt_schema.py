"""Finding the object a prompt asks for (`engines.sim.prompt_schema`), in the wrappings client
libraries use. The instructor and pydantic-ai texts are what instructor 1.17 (`Mode.JSON`) and
pydantic-ai-slim 2.38 (`PromptedOutput`) sent to a capturing simulator; LangChain's format instructions
come from LangChain itself."""

from __future__ import annotations

import json
import time
from typing import Any

from langchain_core.output_parsers import PydanticOutputParser
from pydantic import BaseModel, Field

from engines.sim.prompt_schema import embedded_objects, last_schema, named_keys, requested_schema


class Address(BaseModel):
    city: str
    postcode: str | None = None


class Person(BaseModel):
    """A person."""

    name: str = Field(description="full name")
    age: int = Field(ge=0, le=150)
    role: str = Field(json_schema_extra={"enum": ["admin", "user"]})
    address: Address
    tags: list[str] = []


SCHEMA = Person.model_json_schema()


def instructor_json_system(schema: dict[str, Any], own: str = "") -> str:
    """instructor Mode.JSON's system message (appended to the caller's own system text)."""
    return (
        (own + "\n\n" if own else "")
        + "\n            As a genius expert, your task is to understand the content and provide\n"
        "            the parsed objects in json that match the following json_schema:\n\n\n"
        f"            {json.dumps(schema, indent=2)}\n\n"
        "            Make sure to return an instance of the JSON, not the schema itself\n"
    )


def pydantic_ai_prompted_system(schema: dict[str, Any]) -> str:
    return (
        "\nAlways respond with a JSON object that's compatible with this schema:\n\n"
        f"{json.dumps(schema)}\n\nDon't include any text or Markdown fencing before or after.\n"
    )


def chat(*messages: tuple[str, Any]) -> list[dict[str, Any]]:
    return [{"role": role, "content": content} for role, content in messages]


def test_instructor_json_mode() -> None:
    assert requested_schema(chat(("system", instructor_json_system(SCHEMA)), ("user", "Ada."))) == SCHEMA
    own = instructor_json_system(SCHEMA, own="You extract people.")
    assert requested_schema(chat(("system", own), ("user", "Ada."))) == SCHEMA


def test_instructor_reask_keeps_the_schema() -> None:
    """The re-ask adds the answer and pydantic's errors (which quote `{}` and Python reprs)."""
    errors = (
        "Correct your JSON ONLY RESPONSE, based on the following errors:\n1 validation error for Person\n"
        "name\n  Field required [type=missing, input_value={'age': 3}, input_type=dict]"
    )
    messages = chat(
        ("system", instructor_json_system(SCHEMA)), ("user", "Ada."), ("assistant", "{}"), ("user", errors)
    )
    assert requested_schema(messages) == SCHEMA


def test_pydantic_ai_prompted_output_and_its_retry() -> None:
    system = pydantic_ai_prompted_system(SCHEMA)
    retry = '4 validation errors:\n```json\n[\n  {"type": "missing", "loc": ["name"], "msg": "Field required"}\n]\n```'
    messages = chat(("system", system), ("user", "Who is Ada?"), ("assistant", "{}"), ("user", retry))
    assert requested_schema(messages) == SCHEMA


def test_langchain_format_instructions_give_the_schema_not_the_example() -> None:
    """An example schema (property `foo`) and two example objects come first; the schema last."""
    instructions = PydanticOutputParser(pydantic_object=Person).get_format_instructions()
    assert '"foo"' in instructions
    found = requested_schema(chat(("system", "Answer.\n" + instructions), ("user", "Ada.")))
    assert found is not None and set(found["properties"]) == set(SCHEMA["properties"])
    assert found["$defs"] == SCHEMA["$defs"]


def test_schema_as_a_python_dict_repr_and_in_a_fence() -> None:
    assert requested_schema(chat(("user", f"Who is Ada? Use this schema: {SCHEMA}"))) == SCHEMA
    fenced = f"Reply with JSON.\n```json\n{json.dumps(SCHEMA, indent=4)}\n```\nThanks!"
    assert requested_schema(chat(("user", fenced))) == SCHEMA
    parts = [{"type": "text", "text": "Schema:"}, {"type": "text", "text": json.dumps(SCHEMA)}]
    assert requested_schema([{"role": "user", "content": parts}]) == SCHEMA


def test_schema_inside_a_wrapper() -> None:
    named = {"name": "Person", "strict": True, "schema": SCHEMA}
    assert last_schema(json.dumps(named)) == SCHEMA
    tool = {"type": "function", "function": {"name": "record", "parameters": SCHEMA}}
    assert last_schema("Call this: " + json.dumps(tool)) == SCHEMA


def test_root_refs_and_unions() -> None:
    recursive = {
        "$defs": {"Node": {"type": "object", "properties": {"kids": {"items": {"$ref": "#/$defs/Node"}}}}},
        "$ref": "#/$defs/Node",
    }
    assert last_schema(json.dumps(recursive)) == recursive
    union = {"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"type": "null"}]}
    assert last_schema(json.dumps(union)) == union
    assert last_schema(json.dumps({"$ref": "#/$defs/Missing"})) is None


def test_newest_instruction_wins_and_data_does_not_count() -> None:
    other = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
    messages = chat(("system", instructor_json_system(SCHEMA)), ("user", f"Now use {json.dumps(other)}"))
    assert requested_schema(messages) == other
    data = chat(("system", instructor_json_system(SCHEMA)), ("user", '{"name": "Ada", "age": 36}'))
    assert requested_schema(data) == SCHEMA  # an instance is data, not a schema


def test_the_models_answers_and_tool_results_are_not_instructions() -> None:
    messages = chat(
        ("user", "Give me JSON."),
        ("assistant", json.dumps(SCHEMA)),
        ("tool", json.dumps(SCHEMA)),
    )
    assert requested_schema(messages) is None


def test_things_that_are_not_schemas() -> None:
    for text in (
        '{"properties": {"foo": ["bar", "baz"]}}',  # LangChain's "not well-formatted" example
        '{"foo": ["bar", "baz"]}',
        '{"type": "string", "description": "a name"}',  # not an object
        '{"type": "object", "properties": {}}',  # nothing to fill
        '{"type": "object", "properties": {"a": {"type": "string"}}',  # unbalanced
        "function f() { return {a: 1}; }",
    ):
        assert last_schema(text) is None, text


def test_keys_named_in_prose() -> None:
    """LangChain's own json_mode examples name the keys instead of giving a schema."""
    doc = "Make sure to return a JSON blob with keys 'answer' and 'justification'.\n\nWhat's heavier?"
    assert named_keys(doc) == ["answer", "justification"]
    assert named_keys("Return a JSON object with key 'random_ints' and a value of 10 ints") == ["random_ints"]
    assert named_keys('Use the fields: "city", "country" or `zip`.') == ["city", "country", "zip"]
    assert named_keys("No keys here, just 'quotes'.") == []
    schema = requested_schema(chat(("user", doc)))
    assert schema == {
        "type": "object",
        "properties": {"answer": {"type": "string"}, "justification": {"type": "string"}},
        "required": ["answer", "justification"],
    }
    assert requested_schema(chat(("user", "Tell me about the sea, in JSON."))) is None


def test_completion_prompts() -> None:
    assert requested_schema("Schema: " + json.dumps(SCHEMA)) == SCHEMA
    assert requested_schema(["first", "Schema: " + json.dumps(SCHEMA)]) == SCHEMA
    assert requested_schema(None) is None


def test_scanning_is_bounded() -> None:
    """Brace-heavy text costs a bounded scan; a schema at the end of a long document is still found."""
    t0 = time.perf_counter()
    assert list(embedded_objects("{'a" * 100_000)) == []
    assert list(embedded_objects("{" * 300_000)) == []
    assert requested_schema(chat(("user", "word " * 100_000 + json.dumps(SCHEMA)))) == SCHEMA
    assert time.perf_counter() - t0 < 5
