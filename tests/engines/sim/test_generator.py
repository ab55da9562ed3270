"""JSON mode in the generator and its planning: the object the prompt asks for, else a short answer;
`json_schema` keeps its own schema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from engines.sim.config import parse_config
from engines.sim.generator import JSON_OBJECT, GenSpec, generate
from engines.sim.plan import plan_outputs
from engines.sim.request import response_format_constraint

PERSON = {
    "$defs": {
        "Address": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "zip": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            },
            "required": ["city"],
        }
    },
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user"]},
        "address": {"$ref": "#/$defs/Address"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "role", "address", "tags"],
}
CFG = parse_config(["--fast"])


def content(body: dict[str, Any]) -> str:
    constraint = response_format_constraint(body.get("response_format"))
    _, outputs = plan_outputs(CFG, body, 10, constraint=constraint)
    assert outputs[0].finish_reason == "stop"
    return outputs[0].text


def test_json_object_follows_the_schema_in_the_prompt() -> None:
    system = f"Reply with JSON matching this json_schema:\n{json.dumps(PERSON, indent=2)}\nNot the schema."
    for i in range(50):
        body = {
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"Person {i}"}],
            "response_format": {"type": "json_object"},
        }
        jsonschema.validate(json.loads(content(body)), PERSON)


def test_json_object_with_keys_named_in_prose() -> None:
    ask = "Make sure to return a JSON blob with keys 'answer' and 'justification'."
    body = {"messages": [{"role": "user", "content": ask}], "response_format": {"type": "json_object"}}
    value = json.loads(content(body))
    assert set(value) == {"answer", "justification"} and all(isinstance(v, str) and v for v in value.values())


def test_json_object_without_a_schema_is_a_short_answer_not_empty() -> None:
    seen = set()
    for i in range(20):
        body = {
            "messages": [{"role": "user", "content": f"JSON please {i}"}],
            "response_format": {"type": "json_object"},
        }
        value = json.loads(content(body))
        assert set(value) == {"answer", "confidence", "topics"}
        assert value["answer"].endswith(".") and 0.5 <= value["confidence"] <= 0.99 and value["topics"]
        seen.add(value["answer"])
    assert len(seen) > 15  # seeded per request


def test_json_mode_is_deterministic() -> None:
    body = {
        "messages": [{"role": "user", "content": f"Use {json.dumps(PERSON)}"}],
        "response_format": {"type": "json_object"},
    }
    assert content(body) == content(dict(body)) and content(body) != content({**body, "seed": 5})


def test_json_schema_keeps_its_own_schema() -> None:
    """The prompt's schema is for JSON mode only: a `json_schema` response format wins."""
    own = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    body = {
        "messages": [{"role": "user", "content": f"Use {json.dumps(PERSON)}"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": own}},
    }
    assert set(json.loads(content(body))) == {"x"}


def test_json_object_reaches_the_generator_as_the_prompts_schema() -> None:
    """Both dialects pass JSON mode as `JSON_OBJECT`; planning turns it into the "json_object" kind."""
    assert response_format_constraint({"type": "json_object"}) == JSON_OBJECT
    out = generate(GenSpec(seed=3, constraint=("json_object", PERSON)))
    jsonschema.validate(json.loads(out.text), PERSON)
    assert json.loads(generate(GenSpec(seed=3, constraint=("json_object", None))).text)
    assert json.loads(generate(GenSpec(seed=3, constraint=JSON_OBJECT)).text) == {}  # the bare schema


def test_json_object_is_cut_by_max_tokens() -> None:
    out = generate(GenSpec(seed=3, max_tokens=5, constraint=("json_object", PERSON)))
    assert out.finish_reason == "length" and out.completion_tokens == 5
