"""Request-side rules shared by both dialects (each dialect then applies its own field table).

Common to both engines (docs/engines.md, "Request fields"):
- explicit `null` means "the default": every top-level null is dropped (SGLang rejects some);
- `model` becomes the served name;
- streaming always asks for usage upstream: `stream_options = {"include_usage": true}`, plus
  `continuous_usage_stats` only when the client asked for both (vLLM's rule, applied to both);
  without streaming, `stream_options` is never sent;
- `tool_choice: "none"` removes `tools`, `tool_choice` and `parallel_tool_calls` upstream, so
  neither engine renders the tools into the prompt (SGLang's behaviour; vLLM renders them unless
  `--exclude-tools-when-tool-choice-none`);
- fields that reach into the engine's internals are refused on both (`kv_transfer_params`,
  `bootstrap_*`, `custom_logit_processor`) and `rid` is dropped (the gateway owns request ids);
- structured-output constraints, whatever field carries them, are gathered into one `Constraint`
  (at most one per request, and none beside a forced tool call — SGLang would silently drop one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from engines.base import Endpoint
from engines.errors import ApiError, invalid_request

ConstraintKind = Literal["json", "json_object", "regex", "choice", "grammar", "structural_tag"]

#: refused on both engines: they reach into the engine's internals (disaggregation peers, code).
REFUSED = (
    "kv_transfer_params",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "custom_logit_processor",
)
#: dropped on both engines, documented.
DROPPED = ("rid", "guided_decoding_backend")

_KINDS: dict[str, ConstraintKind] = {
    "json": "json",
    "json_object": "json_object",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
    "structural_tag": "structural_tag",
}
_GUIDED: dict[str, ConstraintKind] = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}

_META = re.compile(r"[\\.^$*+?{}\[\]|()]")
_NATIVE: tuple[tuple[str, ConstraintKind], ...] = (("regex", "regex"), ("ebnf", "grammar"))


@dataclass(slots=True)
class Constraint:
    """One structured-output constraint from an engine-specific field."""

    kind: ConstraintKind
    value: Any
    param: str  # the client's field, for error messages
    options: dict[str, Any]  # vLLM `structured_outputs` options (whitespace_pattern, …)


def unsupported(field: str, engine: str, hint: str = "") -> ApiError:
    msg = f"Unsupported parameter: '{field}' is not supported by this model's engine ({engine})."
    return invalid_request(msg + (" " + hint if hint else ""), param=field)


def prompt_tools(body: Mapping[str, Any]) -> Any:
    """The tools a chat body's engine renders into its prompt: none with `tool_choice: "none"`,
    which the gateway sends without them (above). The gateway's own tokenization for KV-event routing
    (`gateway.routing.tokens`) must render what the engine will, so both use this rule."""
    return None if body.get("tool_choice") == "none" else body.get("tools")


def base_request(endpoint: Endpoint, body: dict[str, Any], served_model: str) -> dict[str, Any]:
    """A new dict with the rules above applied (constraints not yet extracted)."""
    out = {k: v for k, v in body.items() if v is not None}
    out["model"] = served_model
    if out.get("stream") is True:
        so = body.get("stream_options")
        opts: dict[str, Any] = {"include_usage": True}
        if type(so) is dict and so.get("include_usage") is True and so.get("continuous_usage_stats") is True:
            opts["continuous_usage_stats"] = True
        out["stream_options"] = opts
    else:
        out.pop("stream_options", None)
    if endpoint == "chat" and out.get("tool_choice") == "none":
        out.pop("tools", None)
        out.pop("tool_choice", None)
        out.pop("parallel_tool_calls", None)
    for f in REFUSED:
        if f in out:
            raise invalid_request(f"Unsupported parameter: '{f}' is not accepted by this gateway.", param=f)
    for f in DROPPED:
        out.pop(f, None)
    return out


def _json_value(v: Any, param: str) -> Any:
    if type(v) is str:
        try:
            return orjson.loads(v)
        except orjson.JSONDecodeError:
            raise invalid_request(f"Invalid '{param}': not a valid JSON schema.", param=param) from None
    if type(v) is not dict:
        raise invalid_request(f"Invalid '{param}': expected a JSON schema object.", param=param)
    return v


def _check(kind: ConstraintKind, v: Any, param: str) -> Any:
    if kind == "json":
        return _json_value(v, param)
    if kind == "json_object":
        if v is not True:
            raise invalid_request(f"Invalid '{param}': expected true.", param=param)
        return v
    if kind == "choice":
        if type(v) is not list or not v or not all(type(c) is str for c in v):
            raise invalid_request(f"Invalid '{param}': expected a non-empty array of strings.", param=param)
        return v
    if kind == "structural_tag" and type(v) is dict:
        return v
    if type(v) is not str or not v:
        raise invalid_request(f"Invalid '{param}': expected a non-empty string.", param=param)
    return v


def pop_constraints(out: dict[str, Any], *, native_regex: bool) -> list[Constraint]:
    """Remove and return every engine-specific constraint field of `out`.

    `native_regex`: the engine takes top-level `regex`/`ebnf` (SGLang), which are then left in place
    but still counted. `structured_outputs` options other than the constraint itself are kept in
    `Constraint.options`.
    """
    found: list[Constraint] = []
    so = out.pop("structured_outputs", None)
    if so is not None:
        if type(so) is not dict:
            raise invalid_request(
                "Invalid 'structured_outputs': expected an object.", param="structured_outputs"
            )
        kinds = [k for k in so if k in _KINDS and so[k] is not None and so[k] is not False]
        options = {k: v for k, v in so.items() if k not in _KINDS and v is not None}
        if len(kinds) > 1:
            raise invalid_request(
                "Invalid 'structured_outputs': give only one of json, json_object, regex, choice, grammar, "
                "structural_tag.",
                param="structured_outputs",
            )
        if kinds:
            k = kinds[0]
            p = f"structured_outputs.{k}"
            found.append(Constraint(_KINDS[k], _check(_KINDS[k], so[k], p), p, options))
        elif options:
            bad = next(iter(options))
            raise invalid_request(
                f"Invalid 'structured_outputs': '{bad}' needs a constraint.",
                param=f"structured_outputs.{bad}",
            )
    ws = out.pop("guided_whitespace_pattern", None)
    for field, kind in _GUIDED.items():
        if field in out:
            v = out.pop(field)
            opts = {"whitespace_pattern": ws} if ws is not None and kind == "json" else {}
            found.append(Constraint(kind, _check(kind, v, field), field, opts))
    if ws is not None and not any(c.options.get("whitespace_pattern") == ws for c in found):
        raise invalid_request(
            "Invalid 'guided_whitespace_pattern': only valid with 'guided_json'.",
            param="guided_whitespace_pattern",
        )
    for field, kind in _NATIVE:
        if field in out:
            v = out[field] if native_regex else out.pop(field)
            found.append(Constraint(kind, _check(kind, v, field), field, {}))
    return found


def check_constraint_conflicts(out: dict[str, Any], found: list[Constraint]) -> Constraint | None:
    """At most one constraint in all (`response_format` included), and none beside a forced tool call."""
    rf = out.get("response_format")
    rf_on = type(rf) is dict and rf.get("type") not in (None, "text")
    params = (["response_format"] if rf_on else []) + [c.param for c in found]
    if len(params) > 1:
        raise invalid_request(
            f"Only one structured output constraint may be given; got '{params[0]}' and '{params[1]}'.",
            param=params[1],
        )
    tc = out.get("tool_choice")
    if params and (tc == "required" or type(tc) is dict):
        raise invalid_request(
            f"'{params[0]}' cannot be combined with a forced tool call (tool_choice 'required' or a named function).",
            param=params[0],
        )
    return found[0] if found else None


def choice_regex(choices: list[str]) -> str:
    """A regex matching exactly one of `choices`."""
    return "(" + "|".join(_META.sub(r"\\\g<0>", c) for c in choices) + ")"


def drop_if_default(out: dict[str, Any], field: str, default: Any, engine: str, hint: str = "") -> None:
    """Drop `field` when it holds the value this engine behaves as anyway; otherwise 400."""
    if field in out:
        v = out[field]
        if v == default and (type(v) is bool) == (type(default) is bool):
            del out[field]
        else:
            raise unsupported(field, engine, hint)


def refuse(out: dict[str, Any], field: str, engine: str, hint: str = "") -> None:
    if field in out:
        raise unsupported(field, engine, hint)


def rename(out: dict[str, Any], src: str, dst: str) -> None:
    """Move `src` to `dst` (400 if both are given and disagree)."""
    if src in out:
        v = out.pop(src)
        if dst in out and out[dst] != v:
            raise invalid_request(f"'{src}' and '{dst}' disagree; give only one.", param=src)
        out[dst] = v


def dumps(out: dict[str, Any]) -> bytes:
    return orjson.dumps(out)
