"""Deterministic sample values for JSON schemas and regular expressions.

`sample(schema, rng)` returns a value that validates against common JSON-schema features: `type`
(also lists), `enum`, `const`, `properties`/`required` (every required property, and the optional ones
too), `additionalProperties` (a key or two when it is a schema and nothing is declared), `items`,
`prefixItems`, `minItems`/`maxItems`, `uniqueItems`, `minimum`/`maximum` and their exclusive forms,
`multipleOf`, `minLength`/`maxLength`, `pattern`, `format` (date, date-time, time, email, uuid, uri,
ipv4, ipv6, hostname, duration), `anyOf`/`oneOf` (first branch), `allOf` (branches merged), local `$ref`
to `#/$defs/...` or `#/definitions/...` (also recursive models: past a few levels only required
properties and `minItems` items are produced, so a tree ends). `sample_object` is the same for a
function's arguments: always an object. `sample_regex(pattern, rng)` walks Python's own regex parse
tree, so any pattern without look-arounds or back-references gets a matching string.
"""

from __future__ import annotations

import importlib
import math
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
_SHALLOW = 6  # from this depth on: required properties only, minItems items (recursive schemas end)
_MAX_DEPTH = 16


def sample(schema: Any, rng: random.Random, root: Any = None, depth: int = 0) -> Any:
    """A value valid for `schema` (a dict; `True` or anything else yields a string)."""
    if not isinstance(schema, dict):
        return rng.choice(_WORDS)
    root = schema if root is None else root
    if depth > _MAX_DEPTH:
        return None
    if "$ref" in schema:
        return sample(resolve(root, schema["$ref"]), rng, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            return sample(_first_branch(branches, root, depth), rng, root, depth + 1)
    if isinstance(schema.get("allOf"), list) and schema["allOf"]:
        return sample(_merge(schema, root), rng, root, depth + 1)
    typ = schema.get("type")
    if isinstance(typ, list):
        typ = next((t for t in typ if t != "null"), "null")
    if typ is None:
        typ = (
            "object"
            if "properties" in schema
            else "array"
            if "items" in schema or "prefixItems" in schema
            else "string"
        )
    if typ == "object":
        return _object(schema, rng, root, depth)
    if typ == "array":
        return _array(schema, rng, root, depth)
    if typ in ("integer", "number"):
        return _number(schema, rng, typ == "integer")
    if typ == "boolean":
        return rng.random() < 0.5
    if typ == "null":
        return None
    return _string(schema, rng)


def sample_object(schema: Any, rng: random.Random) -> dict[str, Any]:
    """Arguments for a function whose `parameters` are `schema`: always a JSON object (`{}` when the
    schema describes no object, e.g. a tool without parameters)."""
    value = sample(schema, rng) if isinstance(schema, dict) and schema else {}
    return value if isinstance(value, dict) else {}


def _first_branch(branches: list[Any], root: Any, depth: int) -> Any:
    """The first branch; when deep, a `null` branch if there is one (an optional recursive field ends)."""
    if depth >= _SHALLOW:
        for branch in branches:
            if isinstance(branch, dict) and branch.get("type") == "null":
                return branch
    return branches[0]


def _merge(schema: dict[str, Any], root: Any) -> dict[str, Any]:
    """`allOf` as one schema: every branch's keywords, properties and required lists together."""
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    for branch in schema["allOf"]:
        if isinstance(branch, dict) and "$ref" in branch:
            branch = {**resolve(root, branch["$ref"]), **{k: v for k, v in branch.items() if k != "$ref"}}
        if not isinstance(branch, dict):
            continue
        for key, value in branch.items():
            if key == "properties" and isinstance(value, dict):
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required" and isinstance(value, list):
                merged["required"] = [*merged.get("required", []), *value]
            else:
                merged.setdefault(key, value)
    return merged


def _object(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> dict[str, Any]:
    props = schema.get("properties") or {}
    if not isinstance(props, dict):
        props = {}
    if depth >= _SHALLOW:
        required = schema.get("required")
        wanted = set(required) if isinstance(required, list) else set()
        props = {name: sub for name, sub in props.items() if name in wanted}
    out = {name: sample(sub, rng, root, depth + 1) for name, sub in props.items()}
    extra = schema.get("additionalProperties")
    if not out and isinstance(extra, dict) and extra and depth < _SHALLOW:
        for _ in range(rng.randint(1, 2)):
            out[rng.choice(_WORDS)] = sample(extra, rng, root, depth + 1)
    return out


def _array(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> list[Any]:
    prefix = schema.get("prefixItems")
    prefix = prefix if isinstance(prefix, list) else []
    lo = max(int(schema.get("minItems", 0 if depth >= _SHALLOW else 1)), len(prefix))
    hi = int(schema.get("maxItems", len(prefix) if prefix else max(lo, 3)))
    count = lo if depth >= _SHALLOW else rng.randint(lo, max(lo, hi))
    items = schema.get("items", {})
    out = [sample(sub, rng, root, depth + 1) for sub in prefix[:count]]
    unique = schema.get("uniqueItems") is True
    tries = 0
    while len(out) < count and tries < count * 8 + 8:
        tries += 1
        value = sample(items, rng, root, depth + 1)
        if not (unique and value in out):
            out.append(value)
    return out


def _number(schema: dict[str, Any], rng: random.Random, integer: bool) -> int | float:
    low, lo_open = _bound(schema, "minimum", "exclusiveMinimum")
    high, hi_open = _bound(schema, "maximum", "exclusiveMaximum")
    lo = low if low is not None else (high - 100 if high is not None else 0.0)
    hi = high if high is not None else lo + 100
    step = schema.get("multipleOf")
    if not (isinstance(step, int | float) and not isinstance(step, bool) and step > 0):
        step = None
    if integer or step is not None:
        unit = step or 1
        k_lo = math.floor(lo / unit) + 1 if lo_open else math.ceil(lo / unit)
        k_hi = math.ceil(hi / unit) - 1 if hi_open else math.floor(hi / unit)
        k = rng.randint(k_lo, max(k_lo, k_hi))
        return int(k * unit) if integer else round(k * unit, 10)
    value = round(rng.uniform(lo, hi), 2)
    if (value < lo or (lo_open and value == lo)) or (value > hi or (hi_open and value == hi)):
        value = (lo + hi) / 2
    return value


def _bound(schema: dict[str, Any], inclusive: str, exclusive: str) -> tuple[float | None, bool]:
    """(bound, open?) from the draft 6+ forms, or draft 4's boolean `exclusiveMinimum`."""
    excl = schema.get(exclusive)
    incl = schema.get(inclusive)
    if isinstance(excl, int | float) and not isinstance(excl, bool):
        return float(excl), True
    if isinstance(incl, int | float) and not isinstance(incl, bool):
        return float(incl), excl is True
    return None, False


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
        return f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T12:{rng.randint(0, 59):02d}:00Z"
    if fmt == "time":
        return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00"
    if fmt == "duration":
        return f"PT{rng.randint(1, 59)}M"
    if fmt == "email":
        return f"{rng.choice(_WORDS)}@example.com"
    if fmt == "uuid":
        a, b, c, d, e = (rng.getrandbits(bits) for bits in (32, 16, 12, 12, 48))
        return f"{a:08x}-{b:04x}-4{c:03x}-8{d:03x}-{e:012x}"
    if fmt in ("uri", "url", "iri"):
        return f"https://example.com/{rng.choice(_WORDS)}"
    if fmt in ("hostname", "idn-hostname"):
        return f"{rng.choice(_WORDS)}.example.com"
    if fmt == "ipv4":
        return f"192.0.2.{rng.randint(1, 254)}"
    if fmt == "ipv6":
        return f"2001:db8::{rng.randint(1, 0xFFFF):x}"
    text = rng.choice(_WORDS)
    lo = int(schema.get("minLength", 0))
    hi = int(schema.get("maxLength", 10_000))
    while len(text) < lo:
        text += rng.choice(_WORDS)
    return text[: max(lo, hi)]


def resolve(root: Any, ref: Any) -> Any:
    """The schema a local `$ref` (`#/...`) points to in `root`, else `{}`."""
    if ref == "#":
        return root
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return {}
    node = root
    for raw in ref[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
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
