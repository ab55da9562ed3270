"""`schema_gen.sample` against real validators: pydantic models' own schemas, checked by pydantic and
by `jsonschema` (draft 2020-12), over many seeds."""

from __future__ import annotations

import random
from datetime import date, datetime, time, timedelta
from typing import Any, Literal
from uuid import UUID

import jsonschema
import pytest
from pydantic import BaseModel, Field

from engines.sim.schema_gen import sample, sample_object


class Address(BaseModel):
    city: str
    country: str = Field(min_length=2, max_length=2)
    postcode: str | None = None


class Line(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{3}-\d{4}$")
    quantity: int = Field(gt=0, le=20, multiple_of=2)
    price: float = Field(gt=0, lt=1)
    discount: float = Field(ge=0.5, le=0.5)


class Order(BaseModel):
    id: UUID
    placed: datetime
    due: date
    at: time
    within: timedelta
    status: Literal["open", "shipped"]
    ship_to: Address
    lines: list[Line] = Field(min_length=1, max_length=4)
    labels: set[str]
    pair: tuple[int, str]
    counts: dict[str, int]
    notes: str | None = None


class Tree(BaseModel):
    """Recursive: children of the same model, and an optional parent link."""

    name: str
    children: list[Tree] = []
    parent: Tree | None = None


MODELS: list[type[BaseModel]] = [Address, Line, Order, Tree]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_samples_of_pydantic_schemas_validate(model: type[BaseModel]) -> None:
    schema = model.model_json_schema()
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    for seed in range(200):
        value = sample(schema, random.Random(seed))
        validator.validate(value)
        model.model_validate(value)


def test_recursive_schemas_end() -> None:
    def size(node: dict[str, Any]) -> int:
        parent = node.get("parent")
        return 1 + sum(size(c) for c in node.get("children", [])) + (size(parent) if parent else 0)

    schema = Tree.model_json_schema()
    assert max(size(sample(schema, random.Random(seed))) for seed in range(50)) < 200


def test_exclusive_bounds_and_draft4_booleans() -> None:
    for seed in range(100):
        rng = random.Random(seed)
        assert 0 < sample({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.01}, rng) < 0.01
        assert sample({"type": "integer", "minimum": 3, "exclusiveMinimum": True, "maximum": 4}, rng) == 4
        assert sample({"type": "integer", "exclusiveMaximum": -5}, rng) < -5


def test_allof_branches_merge() -> None:
    schema = {
        "$defs": {
            "Named": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
        },
        "allOf": [
            {"$ref": "#/$defs/Named"},
            {"properties": {"age": {"type": "integer"}}, "required": ["age"]},
        ],
    }
    value = sample(schema, random.Random(1))
    assert isinstance(value["name"], str) and isinstance(value["age"], int)


def test_function_arguments_are_always_an_object() -> None:
    rng = random.Random(0)
    assert sample_object(None, rng) == {}
    assert sample_object({}, rng) == {}
    assert sample_object({"type": "object", "properties": {}}, rng) == {}
    assert sample_object({"type": "string"}, rng) == {}
    assert set(sample_object({"type": "object", "properties": {"q": {"type": "string"}}}, rng)) == {"q"}
