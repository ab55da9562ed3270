"""The object a prompt asks for, which JSON mode (`response_format: {"type": "json_object"}`) follows.

JSON mode only constrains the output to *some* JSON object; a real model fills it from what the prompt
asks for. Client libraries say what they want in the prompt, each in its own wrapping (what they sent
to a capturing simulator, late 2026):

- instructor `Mode.JSON` (and `MD_JSON`): a system message (appended to the caller's own, when there is
  one) "As a genius expert, your task is to understand the content and provide the parsed objects in
  json that match the following json_schema:" + the model's JSON schema (indented, `$defs` and `$ref`
  kept) + "Make sure to return an instance of the JSON, not the schema itself". Its re-ask on a
  validation error adds the answer and a user message "Correct your JSON ONLY RESPONSE, based on the
  following errors: …" (pydantic's error text, no schema).
- pydantic-ai `PromptedOutput`: a system message "Always respond with a JSON object that's compatible
  with this schema:" + the schema on one line + "Don't include any text or Markdown fencing before or
  after."; its retry is a user message with the errors as a fenced JSON array.
- LangChain `with_structured_output(..., method="json_mode")`: nothing at all (its docs tell the caller
  to write the instructions). Callers paste the schema into a message, as JSON or as a Python dict's
  repr (an f-string of `Model.model_json_schema()`); use `PydanticOutputParser.get_format_instructions()`
  (an example schema with a `foo` property and two example objects first, then the schema in a
  ``` fence); or name the keys in prose, as LangChain's own example does: "Make sure to return a JSON
  blob with keys 'answer' and 'justification'."

`requested_schema(prompt)` finds that: the user, system and developer messages are read newest first,
and the first one holding a JSON schema of an object gives its *last* one (the real schema follows
LangChain's example); a schema may sit inside a wrapper object (`{"name", "schema"}`, a tool
definition). A schema is an object whose `properties` map names to sub-schemas, or a `$ref` / `anyOf` /
`oneOf` / `allOf` root leading to one. Failing a schema, keys named in quotes after "key(s)", "field(s)"
or "propert(y|ies)" give an object schema of those keys (strings). None means the prompt asks for no
particular object.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from typing import Any

from engines.sim.prompt import content_text
from engines.sim.schema_gen import resolve

_MAX_SCAN = 256 * 1024  # characters of one message read (its end: schemas come after the data)
_MAX_TRIES = 512  # `{` positions tried per message
_MAX_LITERAL_TRIES = 16  # of which read as Python literals (each may scan up to _MAX_LITERAL characters)
_DECODER = json.JSONDecoder()
_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "items",
        "prefixItems",
        "$ref",
        "$defs",
        "definitions",
        "anyOf",
        "oneOf",
        "allOf",
        "enum",
        "const",
        "required",
        "additionalProperties",
        "title",
        "description",
        "format",
        "default",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "uniqueItems",
        "multipleOf",
        "examples",
        "nullable",
        "discriminator",
        "not",
    }
)
_KEY_WORD = re.compile(r"\b(?:keys?|fields?|propert(?:y|ies)|attributes?)\b", re.IGNORECASE)
_QUOTED_KEY = re.compile(r"""\s*(?:,|;|:|\band\b|\bor\b|&)?\s*(['"`])([A-Za-z_][\w\-]{0,63})\1""")
_LITERAL_START = re.compile(r"""\{\s*['"]""")  # how a Python dict with string keys starts
_MAX_LITERAL = 64 * 1024


def requested_schema(prompt: Any) -> dict[str, Any] | None:
    """The JSON schema of the object `prompt` asks for (chat `messages`, or a completion prompt); see
    the module docstring. None: no schema and no named keys."""
    texts = list(_instruction_texts(prompt))
    for text in texts:
        schema = last_schema(text)
        if schema is not None:
            return schema
    for text in texts:
        keys = named_keys(text)
        if keys:
            return {"type": "object", "properties": {k: {"type": "string"} for k in keys}, "required": keys}
    return None


def last_schema(text: str) -> dict[str, Any] | None:
    """The last JSON schema of an object written in `text` (JSON or a Python literal), else None."""
    found = None
    for obj in embedded_objects(text):
        schema = _schema_in(obj)
        if schema is not None:
            found = schema
    return found


def embedded_objects(text: str) -> Iterator[dict[str, Any]]:
    """Every outermost JSON object in `text`, in order; Python dict literals (single quotes, `True`,
    `None`) count when they hold only JSON values. Bounded: the last `_MAX_SCAN` characters, at most
    `_MAX_TRIES` start positions, `_MAX_LITERAL_TRIES` of them read as literals."""
    if len(text) > _MAX_SCAN:
        text = text[-_MAX_SCAN:]
    start = text.find("{")
    tries = literal_tries = 0
    while start != -1 and tries < _MAX_TRIES:
        tries += 1
        obj, end = _json_at(text, start)
        if obj is None and literal_tries < _MAX_LITERAL_TRIES and _LITERAL_START.match(text, start):
            literal_tries += 1
            obj, end = _literal_at(text, start)
        if obj is None:
            start = text.find("{", start + 1)
        else:
            yield obj
            start = text.find("{", end)


def named_keys(text: str) -> list[str]:
    """Keys named in quotes after "key(s)" / "field(s)" / "propert(y|ies)" / "attribute(s)", in order:
    "keys 'answer' and 'justification'" → ["answer", "justification"]."""
    keys: list[str] = []
    for word in _KEY_WORD.finditer(text):
        pos = word.end()
        while (m := _QUOTED_KEY.match(text, pos)) is not None:
            if m.group(2) not in keys:
                keys.append(m.group(2))
            pos = m.end()
    return keys


def _instruction_texts(prompt: Any) -> Iterator[str]:
    """What the caller wrote, newest first: user / system / developer messages (not the model's answers
    or tool results), or the strings of a completion prompt."""
    if isinstance(prompt, str):
        yield prompt
        return
    if not isinstance(prompt, list):
        return
    for item in reversed(prompt):
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict) and item.get("role") in ("user", "system", "developer"):
            yield content_text(item.get("content"))


def _json_at(text: str, start: int) -> tuple[dict[str, Any] | None, int]:
    """(the JSON object starting at `start`, the index after it), or (None, start)."""
    try:
        obj, end = _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):
        return None, start
    return (obj, end) if isinstance(obj, dict) else (None, start)


def _literal_at(text: str, start: int) -> tuple[dict[str, Any] | None, int]:
    """A Python dict literal at `start` (what an f-string of a dict prints), JSON-compatible only."""
    end = _balanced_end(text, start)
    if end is None or end - start > _MAX_LITERAL:
        return None, start
    try:
        obj = ast.literal_eval(text[start:end])
        obj = json.loads(json.dumps(obj, allow_nan=False))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None, start
    return (obj, end) if isinstance(obj, dict) else (None, start)


def _balanced_end(text: str, start: int) -> int | None:
    """The index after the bracket closing the one at `start` (quotes respected), else None."""
    depth = 0
    quote = ""
    i = start
    n = min(len(text), start + _MAX_LITERAL + 1)
    while i < n:
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _schema_in(obj: Any, depth: int = 0) -> dict[str, Any] | None:
    """`obj` if it is a JSON schema of an object, else the outermost one inside it (a wrapper such as
    `{"name", "schema"}` or a tool definition), looked for three levels down."""
    if not isinstance(obj, dict):
        return None
    if _object_schema(obj, obj):
        return obj
    if depth >= 3:
        return None
    for value in obj.values():
        for item in value if isinstance(value, list) else [value]:
            found = _schema_in(item, depth + 1)
            if found is not None:
                return found
    return None


def _object_schema(node: dict[str, Any], root: dict[str, Any], hops: int = 0) -> bool:
    """Whether `node` describes objects with named properties (following refs and unions from `root`)."""
    if hops > 4:
        return False
    if "$ref" in node:
        target = resolve(root, node["$ref"])
        return isinstance(target, dict) and target is not node and _object_schema(target, root, hops + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        branches = node.get(key)
        if isinstance(branches, list) and branches:
            return any(isinstance(b, dict) and _object_schema(b, root, hops + 1) for b in branches)
    typ = node.get("type", "object")
    if typ != "object" and not (isinstance(typ, list) and "object" in typ):
        return False
    props = node.get("properties")
    required = node.get("required", [])
    return (
        isinstance(props, dict)
        and bool(props)
        and all(_sub_schema(v) for v in props.values())
        and isinstance(required, list)
        and all(isinstance(r, str) for r in required)
    )


def _sub_schema(value: Any) -> bool:
    """A property's schema: `true`, `{}`, or an object using at least one schema keyword."""
    return value is True or (isinstance(value, dict) and (not value or any(k in _KEYWORDS for k in value)))
