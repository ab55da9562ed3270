"""A Responses API request → the neutral chat request every later stage works on (pure, no I/O).

`translate(body, context, …)` validates the Responses request with its own field names and writes:
- `chat`: the chat-completions request (instructions → a system message first; the conversation
  items → messages; function tools → chat tools; `text.format` → `response_format`;
  `max_output_tokens` → `max_tokens`; `reasoning.effort` → `reasoning_effort`;
  `user` / `safety_identifier` → `user`; fields the Responses API does not define pass through as
  on chat, so engine extras such as `top_k` work alike);
- `head`: what the Response object echoes of the request (gateway/apis/responses.py adds the id);
- `input_items`: this request's input as items with ids (GET …/input_items);
- `context`: the items of the conversation before the answer (a stored previous response's
  context, then this input): what the next `previous_response_id` continues from.

Items and what they become:
    message (role user | system | developer | assistant; content a string or parts:
    input_text, output_text, refusal → text; input_image → image_url)   → that chat message
    function_call (call_id, name, arguments)     → an assistant message's tool call (calls that
                                                   follow an assistant message join it)
    function_call_output (call_id, output)       → a tool message; its call_id must name a call
                                                   earlier in the conversation (else 400)
    reasoning                                    → dropped (engines do not re-read past reasoning)
Every other item type, hosted tools (web_search, file_search, …), `background`, `conversation`,
`prompt` and output logprobs answer 400 `unsupported_parameter`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engines.errors import invalid_request
from engines.responses import new_id
from gateway.apis.checks import (
    boolean,
    integer,
    invalid_value,
    missing,
    number,
    string,
    type_error,
    unsupported,
)

#: Responses fields this module consumes; any other field goes to the chat request as it is
_OWN = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "parallel_tool_calls",
        "tools",
        "tool_choice",
        "text",
        "reasoning",
        "store",
        "stream",
        "stream_options",
        "previous_response_id",
        "metadata",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "truncation",
        "include",
        "top_logprobs",
        "service_tier",
        "background",
        "conversation",
        "prompt",
        "max_tool_calls",
        "context_management",
    }
)
_ROLES = ("user", "system", "developer", "assistant")
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_MIN_OUTPUT_TOKENS = 16


@dataclass(slots=True)
class Translation:
    chat: dict[str, Any]
    head: dict[str, Any]
    input_items: list[dict[str, Any]]
    context: list[dict[str, Any]]
    store: bool


def translate(
    body: dict[str, Any],
    *,
    context: list[dict[str, Any]] | None,
    response_id: str,
    created_at: int,
) -> Translation:
    """See the module docstring; raises `ApiError` (400, `param` the Responses field)."""
    _refuse_unsupported(body)
    instructions = string(body, "instructions")
    items = _input_items(body.get("input"), context is not None)
    conversation = [*(context or ()), *items]
    messages = to_messages(conversation, len(context or ()))
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    if not messages:
        raise missing("input")
    chat: dict[str, Any] = {k: v for k, v in body.items() if k not in _OWN}
    chat["model"] = body["model"]
    chat["messages"] = messages
    stream = boolean(body, "stream")
    if stream:
        chat["stream"] = True
    max_out = integer(body, "max_output_tokens", _MIN_OUTPUT_TOKENS)
    if max_out is not None:
        chat["max_tokens"] = max_out
    for key, hi in (("temperature", 2.0), ("top_p", 1.0)):
        v = number(body, key, 0.0, hi)
        if v is not None:
            chat[key] = v
    tools, chat_tools = _tools(body.get("tools"))
    if chat_tools:
        chat["tools"] = chat_tools
    tool_choice = _tool_choice(body.get("tool_choice"), chat_tools)
    if tool_choice is not None:
        chat["tool_choice"] = tool_choice[1]
    parallel = boolean(body, "parallel_tool_calls")
    if parallel is not None and chat_tools:
        chat["parallel_tool_calls"] = parallel
    text, response_format = _text(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    reasoning = _reasoning(body.get("reasoning"))
    if reasoning["effort"] is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    user = string(body, "user")
    safety = string(body, "safety_identifier")
    if user or safety:
        chat["user"] = user or safety
    cache_key = string(body, "prompt_cache_key")
    if cache_key:
        chat["prompt_cache_key"] = cache_key
    store = boolean(body, "store")
    metadata = _metadata(body.get("metadata"))
    truncation = body.get("truncation")
    if truncation is not None and truncation not in ("auto", "disabled"):
        raise invalid_value("truncation", truncation, ("auto", "disabled"))
    max_tool_calls = integer(body, "max_tool_calls", 1)
    head: dict[str, Any] = {
        "id": response_id,
        "created_at": created_at,
        "instructions": instructions,
        "max_output_tokens": max_out,
        "max_tool_calls": max_tool_calls,
        "model": body["model"],
        "parallel_tool_calls": parallel if parallel is not None else True,
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": cache_key,
        "reasoning": reasoning,
        "safety_identifier": safety,
        "service_tier": "default",
        "store": store is not False,
        "temperature": chat.get("temperature"),
        "text": text,
        "tool_choice": tool_choice[0] if tool_choice is not None else "auto",
        "tools": tools,
        "top_logprobs": 0,
        "top_p": chat.get("top_p"),
        "truncation": truncation or "disabled",
        "user": user,
        "metadata": metadata,
    }
    return Translation(chat, head, items, conversation, store is not False)


def _refuse_unsupported(body: dict[str, Any]) -> None:
    if body.get("background") not in (None, False):
        raise unsupported("background", "Background responses")
    for key, what in (
        ("conversation", "The Conversations API"),
        ("prompt", "Prompt templates"),
        ("context_management", "Context management"),
    ):
        if body.get(key) is not None:
            raise unsupported(key, what)
    include = body.get("include")
    if include is not None:
        if type(include) is not list or not all(type(i) is str for i in include):
            raise type_error("include", "an array of strings", include)
        if "message.output_text.logprobs" in include:
            raise unsupported("include", "Output logprobs ('message.output_text.logprobs')")
    top = body.get("top_logprobs")
    if top is not None and top != 0:
        raise unsupported("top_logprobs", "Output logprobs")


# -- input items ----------------------------------------------------------------------------------
def _input_items(raw: Any, has_previous: bool) -> list[dict[str, Any]]:
    """The request's input as normalised items with ids."""
    if raw is None:
        if has_previous:
            return []
        raise missing("input")
    if type(raw) is str:
        return [_message_item("user", [{"type": "input_text", "text": raw}], None)]
    if type(raw) is not list:
        raise type_error("input", "a string or an array of input items", raw)
    return [_item(it, f"input[{i}]") for i, it in enumerate(raw)]


def _message_item(role: str, content: list[dict[str, Any]], id: str | None) -> dict[str, Any]:
    return {
        "id": id or new_id("msg"),
        "type": "message",
        "role": role,
        "status": "completed",
        "content": content,
    }


def _item(it: Any, p: str) -> dict[str, Any]:
    if type(it) is not dict:
        raise type_error(p, "an object", it)
    t = it.get("type")
    if t is not None and type(t) is not str:
        raise type_error(f"{p}.type", "a string", t)
    item_id = string(it, "id", f"{p}.id")
    if t is None or t == "message":
        role = it.get("role")
        if role is None:
            raise missing(f"{p}.role")
        if role not in _ROLES:
            raise invalid_value(f"{p}.role", role, _ROLES)
        return _message_item(role, _content(it.get("content"), f"{p}.content", role), item_id)
    if t == "function_call":
        call_id = _required_str(it, "call_id", p)
        name = _required_str(it, "name", p)
        arguments = _required_str(it, "arguments", p, allow_empty=True)
        return {
            "id": item_id or new_id("fc"),
            "type": "function_call",
            "status": "completed",
            "arguments": arguments,
            "call_id": call_id,
            "name": name,
        }
    if t == "function_call_output":
        call_id = _required_str(it, "call_id", p)
        output = it.get("output")
        if type(output) is list:
            output = _text_of(_content(output, f"{p}.output", "user"))
        elif type(output) is not str:
            raise missing(f"{p}.output") if output is None else type_error(f"{p}.output", "a string", output)
        return {
            "id": item_id or new_id("fco"),
            "type": "function_call_output",
            "status": "completed",
            "call_id": call_id,
            "output": output,
        }
    if t == "reasoning":
        return {**it, "id": item_id or new_id("rs")}
    raise invalid_request(
        f"Invalid value for '{p}.type': input items of type '{t[:64]}' are not supported by this gateway "
        "(supported: message, function_call, function_call_output, reasoning).",
        param=f"{p}.type",
        code="unsupported_parameter",
    )


def _required_str(it: dict[str, Any], key: str, p: str, allow_empty: bool = False) -> str:
    v = it.get(key)
    if v is None:
        raise missing(f"{p}.{key}")
    if type(v) is not str:
        raise type_error(f"{p}.{key}", "a string", v)
    if not v and not allow_empty:
        raise invalid_request(f"Invalid '{p}.{key}': empty string.", param=f"{p}.{key}", code="empty_string")
    return v


def _content(raw: Any, p: str, role: str) -> list[dict[str, Any]]:
    """Message content as parts (a string becomes one text part)."""
    part_type = "output_text" if role == "assistant" else "input_text"
    if type(raw) is str:
        return [{"type": part_type, "text": raw}]
    if raw is None:
        raise missing(p)
    if type(raw) is not list:
        raise type_error(p, "a string or an array of content parts", raw)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(raw):
        q = f"{p}[{j}]"
        if type(part) is not dict:
            raise type_error(q, "an object", part)
        t = part.get("type")
        if t in _TEXT_PARTS:
            text = part.get("text")
            if type(text) is not str:
                raise type_error(f"{q}.text", "a string", text)
            parts.append({"type": part_type if t == "text" else t, "text": text})
        elif t == "refusal":
            text = part.get("refusal")
            if type(text) is not str:
                raise type_error(f"{q}.refusal", "a string", text)
            parts.append({"type": "refusal", "refusal": text})
        elif t == "input_image":
            url = part.get("image_url")
            if type(url) is not str or not url:
                raise unsupported(f"{q}.image_url", "An input_image without an image_url (file_id)")
            parts.append({"type": "input_image", "image_url": url, "detail": part.get("detail") or "auto"})
        elif type(t) is str:
            raise invalid_request(
                f"Invalid value for '{q}.type': content parts of type '{t[:64]}' are not supported by this "
                "gateway (supported: input_text, output_text, refusal, input_image).",
                param=f"{q}.type",
                code="unsupported_parameter",
            )
        else:
            raise missing(f"{q}.type") if t is None else type_error(f"{q}.type", "a string", t)
    return parts


def _text_of(parts: list[dict[str, Any]]) -> str:
    return "\n".join(p.get("text") or p.get("refusal") or "" for p in parts if p["type"] != "input_image")


def to_messages(items: list[dict[str, Any]], new_from: int = 0) -> list[dict[str, Any]]:
    """Normalised items → chat messages. A function_call_output whose call_id names no earlier
    function call is a 400 (for items from `new_from` on; stored ones were checked when stored)."""
    messages: list[dict[str, Any]] = []
    calls: set[str] = set()
    for pos, it in enumerate(items):
        t = it["type"]
        if t == "message":
            messages.append({"role": it["role"], "content": _chat_content(it["content"])})
        elif t == "function_call":
            calls.add(it["call_id"])
            call = {
                "id": it["call_id"],
                "type": "function",
                "function": {"name": it["name"], "arguments": it["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if last["content"] == "":
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif t == "function_call_output":
            if it["call_id"] not in calls and pos >= new_from:
                raise invalid_request(
                    f"No tool call found for function call output with call_id {it['call_id']}.",
                    param=f"input[{pos - new_from}].call_id",
                )
            messages.append({"role": "tool", "tool_call_id": it["call_id"], "content": it["output"]})
    return messages


def _chat_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if all(p["type"] != "input_image" for p in parts):
        return _text_of(parts)
    out: list[dict[str, Any]] = []
    for p in parts:
        if p["type"] == "input_image":
            out.append({"type": "image_url", "image_url": {"url": p["image_url"], "detail": p["detail"]}})
        else:
            out.append({"type": "text", "text": p.get("text") or p.get("refusal") or ""})
    return out


# -- tools, tool choice, text format, reasoning, metadata -----------------------------------------
def _tools(raw: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(tools as the Response echoes them, chat tools)."""
    if raw is None:
        return [], []
    if type(raw) is not list:
        raise type_error("tools", "an array", raw)
    echoed: list[dict[str, Any]] = []
    chat: list[dict[str, Any]] = []
    for i, tool in enumerate(raw):
        p = f"tools[{i}]"
        if type(tool) is not dict:
            raise type_error(p, "an object", tool)
        t = tool.get("type")
        if t != "function":
            if t is None:
                raise missing(f"{p}.type")
            raise unsupported(f"{p}.type", f"The tool type '{str(t)[:64]}' (only 'function' tools are)")
        name = _required_str(tool, "name", p)
        description = string(tool, "description", f"{p}.description")
        params = tool.get("parameters")
        if params is not None and type(params) is not dict:
            raise type_error(f"{p}.parameters", "an object", params)
        strict = boolean(tool, "strict", f"{p}.strict")
        echoed.append(
            {
                "type": "function",
                "name": name,
                "description": description,
                "parameters": params,
                "strict": strict if strict is not None else True,
            }
        )
        fn: dict[str, Any] = {"name": name}
        if description is not None:
            fn["description"] = description
        if params is not None:
            fn["parameters"] = params
        if strict is not None:
            fn["strict"] = strict
        chat.append({"type": "function", "function": fn})
    return echoed, chat


def _tool_choice(raw: Any, tools: list[dict[str, Any]]) -> tuple[Any, Any] | None:
    """(tool_choice as echoed, chat tool_choice), or None when not given."""
    if raw is None:
        return None
    if type(raw) is str:
        if raw not in ("none", "auto", "required"):
            raise invalid_value("tool_choice", raw, ("none", "auto", "required"))
        if raw != "none" and not tools:
            raise invalid_request(
                "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
                param="tool_choice",
            )
        return raw, raw
    if type(raw) is not dict:
        raise type_error("tool_choice", "a string or an object", raw)
    if raw.get("type") != "function":
        raise unsupported("tool_choice.type", f"tool_choice of type '{str(raw.get('type'))[:64]}'")
    name = raw.get("name")
    if type(name) is not str:
        raise (
            missing("tool_choice.name") if name is None else type_error("tool_choice.name", "a string", name)
        )
    if not any(t["function"]["name"] == name for t in tools):
        raise invalid_request(
            f"Invalid value for 'tool_choice': no function named {name} was specified in the 'tools' parameter.",
            param="tool_choice",
        )
    return {"type": "function", "name": name}, {"type": "function", "function": {"name": name}}


def _text(raw: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(`text` as echoed, chat response_format or None)."""
    if raw is None:
        return {"format": {"type": "text"}}, None
    if type(raw) is not dict:
        raise type_error("text", "an object", raw)
    fmt = raw.get("format")
    echoed = {k: v for k, v in raw.items() if k != "format"}
    if fmt is None:
        return {"format": {"type": "text"}, **echoed}, None
    if type(fmt) is not dict:
        raise type_error("text.format", "an object", fmt)
    t = fmt.get("type")
    if t == "text":
        return {"format": {"type": "text"}, **echoed}, None
    if t == "json_object":
        return {"format": {"type": "json_object"}, **echoed}, {"type": "json_object"}
    if t != "json_schema":
        raise invalid_value("text.format.type", t, ("text", "json_object", "json_schema"))
    name = fmt.get("name")
    if type(name) is not str:
        raise (
            missing("text.format.name") if name is None else type_error("text.format.name", "a string", name)
        )
    schema = fmt.get("schema")
    if type(schema) is not dict:
        raise (
            missing("text.format.schema")
            if schema is None
            else type_error("text.format.schema", "an object", schema)
        )
    strict = boolean(fmt, "strict", "text.format.strict")
    description = string(fmt, "description", "text.format.description")
    js: dict[str, Any] = {"name": name, "schema": schema}
    if strict is not None:
        js["strict"] = strict
    if description is not None:
        js["description"] = description
    echo = {
        "type": "json_schema",
        "name": name,
        "schema": schema,
        "strict": strict,
        "description": description,
    }
    return {"format": echo, **echoed}, {"type": "json_schema", "json_schema": js}


def _reasoning(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {"effort": None, "summary": None}
    if type(raw) is not dict:
        raise type_error("reasoning", "an object", raw)
    effort = raw.get("effort")
    if effort is not None and effort not in _EFFORTS:
        raise invalid_value("reasoning.effort", effort, _EFFORTS)
    summary = raw.get("summary")
    if summary is not None and summary not in ("auto", "concise", "detailed"):
        raise invalid_value("reasoning.summary", summary, ("auto", "concise", "detailed"))
    return {"effort": effort, "summary": summary}


def _metadata(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if type(raw) is not dict:
        raise type_error("metadata", "an object", raw)
    if len(raw) > 16:
        raise invalid_request(
            f"Invalid 'metadata': too many properties. Expected an object with at most 16 properties, but got "
            f"an object with {len(raw)} properties instead.",
            param="metadata",
            code="object_above_max_properties",
        )
    for k, v in raw.items():
        if type(v) is not str:
            raise type_error(f"metadata.{k}", "a string", v)
        if len(k) > 64 or len(v) > 512:
            raise invalid_request(
                "Invalid 'metadata': keys are at most 64 characters and values at most 512.", param="metadata"
            )
    return dict(raw)
