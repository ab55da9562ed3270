"""Deterministic sample values for JSON schemas and regular expressions.

`sample(schema, rng)` returns a value that validates against common JSON-schema features: `type`
(also lists), `enum`, `const`, `properties`/`required` (every required property, and the optional ones
too), `items`, `minItems`/`maxItems`, `minimum`/`maximum`, `minLength`/`maxLength`, `pattern`,
`anyOf`/`oneOf`/`allOf` (first branch), local `$ref` to `#/$defs/...` or `#/definitions/...`.
`sample_regex(pattern, rng)` walks Python's own regex parse tree, so any pattern without
look-arounds or back-references gets a matching string.
"""

from __future__ import annotations

import importlib
import random
from typing import Any

_sre_parse: Any = importlib.import_module("re._parser")
_C: Any = importlib.import_module("re._constants")

_WORDS = ("alpha", "bravo", "delta", "echo", "kilo", "lima", "nova", "oscar", "sierra", "tango", "zulu")
_CAT_CHARS = {
    "CATEGORY_DIGIT": "0123456789",
    "CATEGORY_NOT_DIGIT": "abcxyz",
    "CATEGORY_SPACE": " ",
    "CATEGORY_NOT_SPACE": "abc123",
    "CATEGORY_WORD": "abcdefxyz0123_",
    "CATEGORY_NOT_WORD": "-.!",
}


def sample(schema: Any, rng: random.Random, root: Any = None, depth: int = 0) -> Any:
    """A value valid for `schema` (a dict; anything else yields a string)."""
    if not isinstance(schema, dict):
        return rng.choice(_WORDS)
    root = schema if root is None else root
    if depth > 8:
        return None
    if "$ref" in schema:
        return sample(_resolve(root, schema["$ref"]), rng, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            return sample(branches[0], rng, root, depth + 1)
    typ = schema.get("type")
    if isinstance(typ, list):
        typ = next((t for t in typ if t != "null"), "null")
    if typ is None:
        typ = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if typ == "object":
        props = schema.get("properties") or {}
        return {name: sample(sub, rng, root, depth + 1) for name, sub in props.items()}
    if typ == "array":
        lo = int(schema.get("minItems", 1))
        hi = int(schema.get("maxItems", max(lo, 3)))
        return [
            sample(schema.get("items", {}), rng, root, depth + 1) for _ in range(rng.randint(lo, max(lo, hi)))
        ]
    if typ == "integer":
        low, high = _bounds(schema, 0, 100)
        return rng.randint(int(low), int(high))
    if typ == "number":
        low, high = _bounds(schema, 0, 100)
        return round(rng.uniform(low, high), 2)
    if typ == "boolean":
        return rng.random() < 0.5
    if typ == "null":
        return None
    return _string(schema, rng)


def _bounds(schema: dict[str, Any], low: float, high: float) -> tuple[float, float]:
    lo = float(schema.get("minimum", schema.get("exclusiveMinimum", low - 1) + 1))
    hi = float(schema.get("maximum", schema.get("exclusiveMaximum", max(high, lo) + 1) - 1))
    return lo, max(lo, hi)


def _string(schema: dict[str, Any], rng: random.Random) -> str:
    if isinstance(schema.get("pattern"), str):
        try:
            return sample_regex(schema["pattern"], rng)
        except Exception:
            pass
    fmt = schema.get("format")
    if fmt == "date":
        return f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if fmt == "date-time":
        return f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T12:00:00Z"
    if fmt == "email":
        return f"{rng.choice(_WORDS)}@example.com"
    text = rng.choice(_WORDS)
    lo = int(schema.get("minLength", 0))
    hi = int(schema.get("maxLength", 10_000))
    while len(text) < lo:
        text += rng.choice(_WORDS)
    return text[: max(lo, hi)]


def _resolve(root: Any, ref: str) -> Any:
    node = root
    if not ref.startswith("#/"):
        return {}
    for part in ref[2:].split("/"):
        if not isinstance(node, dict) or part not in node:
            return {}
        node = node[part]
    return node


def sample_regex(pattern: str, rng: random.Random) -> str:
    """A string fully matching `pattern` (Python `re` syntax)."""
    out: list[str] = []
    _emit(_sre_parse.parse(pattern), rng, out)
    return "".join(out)


def _emit(parsed: Any, rng: random.Random, out: list[str]) -> None:
    for op, av in parsed:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(av))
        elif name == "NOT_LITERAL":
            out.append("a" if chr(av) != "a" else "b")
        elif name == "ANY":
            out.append("x")
        elif name == "IN":
            out.append(_pick_in(av, rng))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            lo, hi, sub = av
            hi = lo + 3 if hi == _C.MAXREPEAT else hi
            for _ in range(rng.randint(lo, max(lo, min(hi, lo + 3)))):
                _emit(sub, rng, out)
        elif name == "SUBPATTERN":
            _emit(av[-1], rng, out)
        elif name == "ATOMIC_GROUP":
            _emit(av, rng, out)
        elif name == "BRANCH":
            _emit(rng.choice(av[1]), rng, out)
        elif name == "CATEGORY":
            out.append(rng.choice(_CAT_CHARS.get(str(av), "a")))
        # AT (anchors) and anything else emit nothing


def _pick_in(items: Any, rng: random.Random) -> str:
    choices: list[str] = []
    negate = False
    for op, av in items:
        name = str(op)
        if name == "NEGATE":
            negate = True
        elif name == "LITERAL":
            choices.append(chr(av))
        elif name == "RANGE":
            choices.extend(chr(c) for c in range(av[0], min(av[1], av[0] + 25) + 1))
        elif name == "CATEGORY":
            choices.extend(_CAT_CHARS.get(str(av), "a"))
    if negate:
        pool = [c for c in "abcdefghijklmnopqrstuvwxyz0123456789" if c not in choices]
        return rng.choice(pool or ["~"])
    return rng.choice(choices or ["a"])
