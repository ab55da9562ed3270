"""The pydantic models the client tests ask for: nested objects, `$defs` refs, enums, bounds, lists,
optional fields and string formats, as real extraction schemas have them."""

from __future__ import annotations

from datetime import date, datetime
from enum import StrEnum
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, Field


class Role(StrEnum):
    ADMIN = "admin"
    USER = "user"


class Address(BaseModel):
    city: str
    country: str = Field(min_length=2, max_length=2, description="ISO 3166 alpha-2 code")
    postcode: str | None = None


class Person(BaseModel):
    """A person."""

    name: str = Field(description="full name")
    age: int = Field(ge=0, le=150)
    role: Role
    address: Address
    born: date | None = None
    tags: list[str] = []


class Item(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{3}-\d{4}$")
    quantity: int = Field(gt=0, le=20)
    price: float = Field(gt=0, lt=1000)


class Order(BaseModel):
    """An order, with its lines."""

    id: UUID
    placed: datetime
    status: Literal["open", "shipped", "cancelled"]
    customer: Person
    items: list[Item] = Field(min_length=1)
    notes: str | None = None


class AnswerWithJustification(BaseModel):
    """LangChain's own json_mode example."""

    answer: str
    justification: str
