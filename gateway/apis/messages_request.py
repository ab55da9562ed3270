"""An Anthropic Messages request → the neutral chat request every later stage works on (pure).

`translate(body, count_only=False)` validates the request as Anthropic's API does (unknown fields
are refused, `max_tokens` is required except for count_tokens) and writes the chat request:

    system (a string or text blocks)       → a system message first
    user: text, image blocks               → a user message (images as image_url parts)
    user: tool_result blocks               → tool messages, before the user's other blocks; each
                                             must answer a tool_use of the previous assistant
                                             message (else 400, Anthropic's wording)
    assistant: text, tool_use blocks       → an assistant message with tool calls (`input` as the
                                             arguments' JSON); thinking blocks are dropped
    tools (custom: name, input_schema)     → function tools; server tools (web search, bash, …) → 400
    tool_choice auto | any | tool | none   → auto | required | the named function | none;
                                             `disable_parallel_tool_use` → parallel_tool_calls false
    stop_sequences → stop; max_tokens, temperature (0–1), top_p, top_k → the same;
    metadata.user_id → user; thinking {type: disabled} → chat_template_kwargs.enable_thinking false

Messages name fields as Anthropic does (`messages.2.content.0: …`). `cache_control` is accepted
and ignored (the engines cache prefixes by themselves); a final assistant message is sent as
history, not continued (no prefill).
"""

from __future__ import annotations

from typing import Any

import orjson

from engines.errors import ApiError, invalid_request

_FIELDS = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "metadata",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "service_tier",
    }
)
_REFUSED = {"container": "Containers", "mcp_servers": "MCP servers", "output_format": "output_format"}
_IGNORED_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def _err(path: str, problem: str) -> ApiError:
    return invalid_request(f"{path}: {problem}", param=path)


def _type(path: str, expected: str) -> ApiError:
    return _err(path, f"Input should be {expected}")


def translate(body: dict[str, Any], *, count_only: bool = False) -> dict[str, Any]:
    for key in body:
        if key in _REFUSED:
            if body[key] is not None:
                raise _err(key, f"{_REFUSED[key]} are not supported by this gateway")
        elif key not in _FIELDS:
            raise _err(key, "Extra inputs are not permitted")
    messages = body.get("messages")
    if messages is None:
        raise _err("messages", "Field required")
    if type(messages) is not list:
        raise _type("messages", "a valid list")
    chat_messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        text = _system_text(system)
        if text:
            chat_messages.append({"role": "system", "content": text})
    chat_messages.extend(_messages(messages))
    chat: dict[str, Any] = {"model": body["model"], "messages": chat_messages}
    max_tokens = body.get("max_tokens")
    if not count_only:
        if max_tokens is None:
            raise _err("max_tokens", "Field required")
        if type(max_tokens) is not int:
            raise _type("max_tokens", "a valid integer")
        if max_tokens < 1:
            raise _err("max_tokens", "Input should be greater than or equal to 1")
        chat["max_tokens"] = max_tokens
    if body.get("stream") is not None:
        if type(body["stream"]) is not bool:
            raise _type("stream", "a valid boolean")
        if body["stream"] and not count_only:
            chat["stream"] = True
    for key, hi in (("temperature", 1.0), ("top_p", 1.0)):
        v = body.get(key)
        if v is not None:
            if type(v) not in (int, float):
                raise _type(key, "a valid number")
            if not 0 <= v <= hi:
                raise _err(key, f"Input should be between 0 and {hi:g}")
            chat[key] = v
    top_k = body.get("top_k")
    if top_k is not None:
        if type(top_k) is not int or top_k < 0:
            raise _type("top_k", "a valid non-negative integer")
        chat["top_k"] = top_k
    stops = body.get("stop_sequences")
    if stops is not None:
        if type(stops) is not list or not all(type(s) is str for s in stops):
            raise _type("stop_sequences", "a valid list of strings")
        if stops:
            chat["stop"] = stops
    metadata = body.get("metadata")
    if metadata is not None:
        if type(metadata) is not dict:
            raise _type("metadata", "a valid dictionary")
        user = metadata.get("user_id")
        if user is not None and type(user) is not str:
            raise _type("metadata.user_id", "a valid string")
        if user:
            chat["user"] = user
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    _tool_choice(body.get("tool_choice"), tools, chat)
    _thinking(body.get("thinking"), chat)
    return chat


def _system_text(system: Any) -> str:
    if type(system) is str:
        return system
    if type(system) is not list:
        raise _type("system", "a valid string or a list of text blocks")
    texts = []
    for j, block in enumerate(system):
        if type(block) is not dict or block.get("type") != "text" or type(block.get("text")) is not str:
            raise _err(f"system.{j}", "Input should be a text block")
        texts.append(block["text"])
    return "\n".join(texts)


def _blocks(content: Any, path: str) -> list[dict[str, Any]]:
    if type(content) is str:
        return [{"type": "text", "text": content}]
    if type(content) is not list:
        raise _type(path, "a valid string or a list of content blocks")
    for j, block in enumerate(content):
        if type(block) is not dict:
            raise _type(f"{path}.{j}", "a valid dictionary")
        if type(block.get("type")) is not str:
            raise _err(f"{path}.{j}.type", "Field required")
    return content


def _messages(messages: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # tool_use ids of the previous assistant message
    pending_at = -1
    for i, m in enumerate(messages):
        p = f"messages.{i}"
        if type(m) is not dict:
            raise _type(p, "a valid dictionary")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise _err(f"{p}.role", "Input should be 'user' or 'assistant'")
        if "content" not in m:
            raise _err(f"{p}.content", "Field required")
        blocks = _blocks(m["content"], f"{p}.content")
        answered: set[str] = set()
        if role == "user":
            texts: list[dict[str, Any]] = []
            for j, b in enumerate(blocks):
                q = f"{p}.content.{j}"
                t = b["type"]
                if t == "tool_result":
                    tid = b.get("tool_use_id")
                    if type(tid) is not str:
                        raise _err(f"{q}.tool_use_id", "Field required")
                    if tid not in pending:
                        raise _err(
                            q,
                            f"unexpected `tool_use_id` found in `tool_result` blocks: {tid[:64]}. Each "
                            "`tool_result` block must have a corresponding `tool_use` block in the previous message.",
                        )
                    answered.add(tid)
                    out.append({"role": "tool", "tool_call_id": tid, "content": _tool_result_text(b, q)})
                elif t == "text":
                    texts.append(_text_block(b, q))
                elif t == "image":
                    texts.append(_image_block(b, q))
                else:
                    raise _err(
                        f"{q}.type", f"content blocks of type '{t[:64]}' are not supported by this gateway"
                    )
            if texts:
                if all(b["type"] == "text" for b in texts):
                    out.append({"role": "user", "content": "\n".join(b["text"] for b in texts)})
                else:
                    out.append({"role": "user", "content": texts})
        else:
            text_parts: list[str] = []
            calls: list[dict[str, Any]] = []
            for j, b in enumerate(blocks):
                q = f"{p}.content.{j}"
                t = b["type"]
                if t == "text":
                    text_parts.append(_text_block(b, q)["text"])
                elif t == "tool_use":
                    tid, name, args = b.get("id"), b.get("name"), b.get("input", {})
                    if type(tid) is not str or not tid:
                        raise _err(f"{q}.id", "Field required")
                    if type(name) is not str or not name:
                        raise _err(f"{q}.name", "Field required")
                    if type(args) is not dict:
                        raise _type(f"{q}.input", "a valid dictionary")
                    calls.append(
                        {
                            "id": tid,
                            "type": "function",
                            "function": {"name": name, "arguments": orjson.dumps(args).decode()},
                        }
                    )
                elif t not in _IGNORED_BLOCKS:
                    raise _err(
                        f"{q}.type", f"content blocks of type '{t[:64]}' are not supported by this gateway"
                    )
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(text_parts) or None}
            if calls:
                msg["tool_calls"] = calls
            elif msg["content"] is None:
                msg["content"] = ""
            out.append(msg)
        missing = [tid for tid in pending if tid not in answered]
        if missing:
            raise _err(
                f"messages.{pending_at}",
                f"`tool_use` ids were found without `tool_result` blocks immediately after: {', '.join(missing)[:256]}. "
                "Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
            )
        pending = [c["id"] for c in out[-1].get("tool_calls", ())] if role == "assistant" else []
        pending_at = i
    return out


def _text_block(b: dict[str, Any], q: str) -> dict[str, Any]:
    text = b.get("text")
    if type(text) is not str:
        raise _type(f"{q}.text", "a valid string")
    return {"type": "text", "text": text}


def _image_block(b: dict[str, Any], q: str) -> dict[str, Any]:
    src = b.get("source")
    if type(src) is not dict:
        raise _err(f"{q}.source", "Field required")
    if src.get("type") == "base64":
        media, data = src.get("media_type"), src.get("data")
        if type(media) is not str or type(data) is not str:
            raise _err(f"{q}.source", "base64 images need media_type and data")
        url = f"data:{media};base64,{data}"
    elif src.get("type") == "url" and type(src.get("url")) is str:
        url = src["url"]
    else:
        raise _err(f"{q}.source.type", "Input should be 'base64' or 'url'")
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_result_text(b: dict[str, Any], q: str) -> str:
    content = b.get("content", "")
    if type(content) is str:
        return content
    if type(content) is not list:
        raise _type(f"{q}.content", "a valid string or a list of text blocks")
    texts = []
    for k, part in enumerate(content):
        if type(part) is not dict or part.get("type") != "text" or type(part.get("text")) is not str:
            raise _err(f"{q}.content.{k}", "only text blocks are supported in tool results by this gateway")
        texts.append(part["text"])
    return "\n".join(texts)


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if type(raw) is not list:
        raise _type("tools", "a valid list")
    out = []
    for i, tool in enumerate(raw):
        p = f"tools.{i}"
        if type(tool) is not dict:
            raise _type(p, "a valid dictionary")
        t = tool.get("type")
        if t not in (None, "custom"):
            raise _err(f"{p}.type", f"tools of type '{str(t)[:64]}' are not supported by this gateway")
        name = tool.get("name")
        if type(name) is not str or not name:
            raise _err(f"{p}.name", "Field required")
        schema = tool.get("input_schema")
        if type(schema) is not dict:
            raise _err(f"{p}.input_schema", "Field required")
        fn: dict[str, Any] = {"name": name, "parameters": schema}
        description = tool.get("description")
        if description is not None:
            if type(description) is not str:
                raise _type(f"{p}.description", "a valid string")
            fn["description"] = description
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(raw: Any, tools: list[dict[str, Any]], chat: dict[str, Any]) -> None:
    if raw is None:
        return
    if type(raw) is not dict:
        raise _type("tool_choice", "a valid dictionary")
    t = raw.get("type")
    if t not in ("auto", "any", "tool", "none"):
        raise _err("tool_choice.type", "Input should be 'auto', 'any', 'tool' or 'none'")
    if raw.get("disable_parallel_tool_use") is True and tools:
        chat["parallel_tool_calls"] = False
    if t == "none":
        chat["tool_choice"] = "none"
        return
    if not tools:
        if t == "auto":
            return
        raise _err("tool_choice", f"tool_choice of type '{t}' needs tools")
    if t == "auto":
        chat["tool_choice"] = "auto"
    elif t == "any":
        chat["tool_choice"] = "required"
    else:
        name = raw.get("name")
        if type(name) is not str:
            raise _err("tool_choice.name", "Field required")
        if not any(tool["function"]["name"] == name for tool in tools):
            raise _err("tool_choice.name", f"Tool '{name[:64]}' not found in tools")
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}


def _thinking(raw: Any, chat: dict[str, Any]) -> None:
    if raw is None:
        return
    if type(raw) is not dict:
        raise _type("thinking", "a valid dictionary")
    t = raw.get("type")
    if t == "disabled":
        chat["chat_template_kwargs"] = {"enable_thinking": False}
    elif t not in ("enabled", "adaptive"):
        raise _err("thinking.type", "Input should be 'enabled', 'disabled' or 'adaptive'")
