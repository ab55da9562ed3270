"""A simple ChatML-style chat template, so system prompts and tool schemas are part of the prompt.

Rendering order (what the prefix cache sees): the system block (system message text, then the tool
schemas when tools are rendered), then every other message in order, then the generation prompt:

    <|im_start|>system\\n{system}\\n\\n# Tools\\n<tools>\\n{tool json}\\n</tools><|im_end|>\\n
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def content_text(content: Any) -> str:
    """Text of a message's `content` (a string, or a list of parts whose `text` is joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif part.get("type") in _MEDIA_TYPES:
                    parts.append(f"<|{part['type']} {_media_id(part)}|>")
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return str(content)


#: content parts that carry media; a medium enters the prompt as a placeholder naming its content, so
#: different images never share cached blocks (as SGLang pads an image's tokens with its hash)
_MEDIA_TYPES = ("image_url", "input_audio", "audio_url", "video_url")


def _media_id(part: dict[str, Any]) -> str:
    value = part.get(part["type"])
    if isinstance(value, dict):
        value = value.get("url", value.get("data"))
    return hashlib.blake2b(str(value).encode(), digest_size=6).hexdigest()


def render_chat(messages: list[Any], tools: list[Any] | None, add_generation_prompt: bool = True) -> str:
    """The prompt text the engine would tokenize."""
    system: list[str] = []
    rest: list[str] = []
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        role = str(msg.get("role", "user"))
        text = content_text(msg.get("content"))
        if role in ("system", "developer") and not rest:
            system.append(text)
            continue
        for call in msg.get("tool_calls") or ():
            fn = call.get("function", {}) if isinstance(call, dict) else {}
            text += f'\n<tool_call>\n{{"name": "{fn.get("name", "")}", "arguments": {fn.get("arguments", "{}")}}}\n</tool_call>'
        if role == "tool":
            text = f"<tool_response>\n{text}\n</tool_response>"
        rest.append(f"<|im_start|>{role}\n{text}<|im_end|>\n")
    if tools:
        schemas = "\n".join(json.dumps(t, sort_keys=True) for t in tools)
        system.append(f"# Tools\n<tools>\n{schemas}\n</tools>")
    head = f"<|im_start|>system\n{chr(10).join(system)}<|im_end|>\n" if system else ""
    tail = "<|im_start|>assistant\n" if add_generation_prompt else ""
    return head + "".join(rest) + tail


def last_user_text(messages: list[Any]) -> str:
    """Text of the last user message ("" if none)."""
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get("role") == "user":
            return content_text(msg.get("content"))
    return ""


def last_role(messages: list[Any]) -> str:
    """Role of the last message."""
    for msg in reversed(messages):
        if isinstance(msg, dict):
            return str(msg.get("role", ""))
    return ""
