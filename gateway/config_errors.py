"""A config file's errors as an operator reads them: one line each, with the file, the line, the key
and, for an unknown key that is nearly a known one, a suggestion.

    gateway.yaml:14: pools[0].dialct: unknown key (did you mean 'dialect'?)
    gateway.yaml:9: server.port: Input should be a valid integer, unable to parse string as an integer

`problems` maps each of pydantic's errors to the YAML node it is about (the key itself for an unknown
key, the value otherwise, the enclosing mapping for a missing key); errors of a check across
sections (no location) name their keys in their message. Values set by the environment
(`GATEWAY_<SECTION>__<FIELD>`) have no line.
"""

from __future__ import annotations

import difflib
import re
import types
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError


@dataclass(frozen=True, slots=True)
class Problem:
    file: str
    line: int | None  # 1-based; None when no line of the file holds it
    key: str  # dotted path (`pools[0].backends`); "" for the file as a whole
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "key": self.key, "message": self.message}


def yaml_problem(file: str, exc: yaml.YAMLError) -> Problem:
    """A YAML syntax error, at the line where the parser stopped."""
    mark = getattr(exc, "problem_mark", None)
    what = getattr(exc, "problem", None) or str(exc)
    return Problem(file, mark.line + 1 if mark is not None else None, "", f"not valid YAML: {what}")


def problems(file: str, text: str, exc: ValidationError, model: type[BaseModel]) -> list[Problem]:
    """One `Problem` per error of `exc`, which validating `text` (YAML) as `model` raised."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        root = None
    out = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        kind = err["type"]
        message = err["msg"].removeprefix("Value error, ")
        if kind == "extra_forbidden":
            message = "unknown key" + _suggestion(model, loc)
        node = _node(root, loc, key_node=kind == "extra_forbidden")
        if kind == "missing":
            node = _node(root, loc[:-1], key_node=False)
        line = node.start_mark.line + 1 if node is not None and loc else None
        out.append(Problem(file, line, _dotted(loc), message))
    return out


def key_line(text: str, key: str) -> int | None:
    """The line of the dotted `key` (through mappings, and lists by index: `models[0].name`) in the
    YAML `text`; None when it is not there."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return None
    loc: tuple[int | str, ...] = tuple(
        int(p) if p.isdigit() else p for p in re.split(r"\.|\[(\d+)\]\.?", key) if p
    )
    node = _node(root, loc, key_node=True)
    found = node is not None and isinstance(node, yaml.ScalarNode) and node.value == str(loc[-1])
    return node.start_mark.line + 1 if found and node is not None else None


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _node(root: yaml.Node | None, loc: tuple[int | str, ...], *, key_node: bool) -> yaml.Node | None:
    """The YAML node at `loc` (the key's node instead of the value's when `key_node`), or the deepest
    node found on the way (a location pydantic adds, such as a union member's name, is no key)."""
    node = root
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, yaml.MappingNode):
            found: tuple[yaml.Node, yaml.Node] | None = next(
                ((k, v) for k, v in node.value if k.value == str(part)), None
            )
            if found is None:
                return node
            if last and key_node:
                return found[0]
            node = found[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            return node
    return node


def _suggestion(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """ " (did you mean 'x'?)" for an unknown key at `loc` close to a field of the model it is in."""
    parent = _model_at(model, loc[:-1])
    if parent is None or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], list(parent.model_fields), n=1, cutoff=0.6)
    return (
        f" (did you mean '{close[0]}'?)" if close else " (known keys: " + ", ".join(parent.model_fields) + ")"
    )


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The settings model that holds the keys at `loc` (through lists and mappings of models)."""
    current: Any = model
    mapping_key = False  # the next part is a mapping's own key (a tier's name), not a field
    for part in loc:
        if isinstance(part, int):
            continue
        if mapping_key:
            mapping_key = False
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(part)
        if field is None:
            return None
        current, mapping_key = _inner(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _inner(annotation: Any) -> tuple[Any, bool]:
    """The model inside `X | None`, `list[X]` and `dict[str, X]` (else the annotation itself), and
    whether a mapping's keys come before it."""
    mapping = False
    while True:
        origin = get_origin(annotation)
        if origin in (Union, types.UnionType):
            members = [a for a in get_args(annotation) if a is not type(None)]
            models = [a for a in members if isinstance(a, type) and issubclass(a, BaseModel)]
            annotation = models[0] if models else members[0]
        elif origin in (list, tuple, set, frozenset):
            annotation = get_args(annotation)[0]
        elif origin is dict:
            annotation = get_args(annotation)[1]
            mapping = True
        else:
            return annotation, mapping
