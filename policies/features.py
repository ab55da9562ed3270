"""Routing features of one OpenAI request, computed without tokenizing.

Rendering. The request is rendered into one canonical byte string, in the order an engine's chat
template puts it into the prompt: the tool schemas first, then every message in order, then (only for
chat) `response_format` last. Each part is compact JSON with sorted keys (orjson), so key order, spacing
and `content` given as a string or as a list of text parts do not change the bytes; a message's bytes
do not depend on later messages, so a conversation that grows turn by turn keeps its rendered prefix.
`response_format` goes last because engines do not put it into the prompt: it must not move the
prefix, yet it still differs between JSON-mode and plain requests in the final blocks.

Media. An image, audio or video item is rendered as its digest (`policies.media.media_digest`)
repeated over as many bytes as its estimated tokens take (`policies.media.MEDIA_TOKENS`), as an engine
puts a run of placeholder tokens keyed by the item's hash into the prompt: conversations that differ
only in an image share their blocks up to the image and differ from it on, and the estimate counts the
item by its tokens, not by its URL's base64 length.

Token estimate. `prompt_tokens = ceil(len(rendered_bytes) / bytes_per_token)` (default 4 bytes per
token; English text and JSON come out within roughly ±30 %, CJK text is underestimated). Token-id
prompts of `/v1/completions` are counted exactly. No per-token Python objects are created.

Block hashes. The rendered bytes are cut into blocks of `block_tokens * bytes_per_token` bytes (only
full blocks; at most `max_blocks`, so the cost is bounded). `block_hashes[i]` is a 64-bit value: the
high 32 bits are `i + 1` (the prefix length in blocks), the low 32 bits the CRC-32 of the whole prefix
up to the end of block `i`, computed as a chain `crc_i = crc32(block_i, crc_{i-1})`. CRC-32 is
standardised (zlib), so every gateway replica computes the same values; two different prefixes collide
only if they have the same length and the same CRC (about 2^-32 per pair), which for an approximate
routing index costs at most one misrouted request.

Anchor. `anchor_hash` identifies the opening of a conversation: the tool schemas, the system and
developer messages and the first message after them (normally the first user message). Every later
turn of the same conversation repeats these bytes unchanged, so the anchor is identical across turns,
while conversations that share a system prompt but start with different user messages get different
anchors. Openings longer than `anchor_max_bytes` are hashed as their head plus their last
`anchor_tail_bytes` bytes plus their length, so the cost stays bounded.
"""

from __future__ import annotations

import json
import zlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from policies.hashing import mix64
from policies.media import MEDIA_TOKENS, media_digest, media_refs
from policies.types import RequestFeatures, ToolChoice

_SORT = orjson.OPT_SORT_KEYS
_PREAMBLE_ROLES = frozenset(("system", "developer"))
_STRUCTURED_TYPES = frozenset(("json_object", "json_schema", "structural_tag", "regex", "ebnf"))
# Engine-specific request fields that constrain the output (vLLM, SGLang extras).
_STRUCTURED_FIELDS = (
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "regex",
    "ebnf",
    "json_schema",
)


#: estimated tokens per prefix block (128 bytes of text): a shared prefix is seen to within 32
#: tokens, and a prompt's hash chain (at most `max_blocks`) covers its first 4,096 tokens. Every
#: routing process must use the same value
BLOCK_TOKENS = 32
#: a preamble (tool schemas, system prompt) at least this many blocks long (~1k tokens) is shared by
#: a prefix group: prefix affinity keys the group by it, and routing rules' `shared_preamble` see it
LONG_PREAMBLE_BLOCKS = 32


@dataclass(frozen=True, slots=True)
class FeatureConfig:
    """How requests are rendered and hashed. Every gateway replica must use the same values."""

    block_tokens: int = BLOCK_TOKENS
    bytes_per_token: int = 4
    max_blocks: int = 128
    anchor_max_bytes: int = 65536
    anchor_tail_bytes: int = 256

    def __post_init__(self) -> None:
        if min(self.block_tokens, self.bytes_per_token, self.max_blocks) < 1:
            raise ValueError("block_tokens, bytes_per_token and max_blocks must be >= 1")
        if self.anchor_tail_bytes < 0 or self.anchor_max_bytes < 1:
            raise ValueError("anchor_max_bytes must be >= 1 and anchor_tail_bytes >= 0")

    @property
    def block_bytes(self) -> int:
        return self.block_tokens * self.bytes_per_token


DEFAULT_FEATURE_CONFIG = FeatureConfig()


def extract_features(
    body: Mapping[str, Any],
    config: FeatureConfig = DEFAULT_FEATURE_CONFIG,
    *,
    session_key: str | None = None,
) -> RequestFeatures:
    """Features of a parsed, validated chat-completions or completions request body.

    `session_key` is the session the request's headers name (`x-session-id`); the conversation's
    session is the body's `prompt_cache_key`, else that header's, else `metadata.session_id`, else
    the body's `user` (what agent harnesses and SDKs send), else None.
    """
    exact_tokens: int | None = None
    batch: tuple[int, ...] = ()
    if "messages" in body:
        rendered, preamble_end, anchor_end, history_end = _render_chat(body, config.bytes_per_token)
    else:
        prompt = body.get("prompt")
        rendered, exact_tokens = render_prompt(prompt)
        preamble_end, anchor_end, history_end = 0, len(rendered), 0
        batch = batch_tokens(prompt, config.bytes_per_token)
    prompt_tokens = exact_tokens if exact_tokens is not None else -(-len(rendered) // config.bytes_per_token)
    tools = body.get("tools")
    return RequestFeatures(
        model=str(body.get("model", "")),
        prompt_tokens=prompt_tokens,
        block_hashes=block_hashes(rendered, config.block_bytes, config.max_blocks),
        anchor_hash=anchor_hash(rendered, anchor_end, config),
        preamble_blocks=min(preamble_end // config.block_bytes, config.max_blocks),
        history_blocks=min(history_end // config.block_bytes, config.max_blocks),
        anchor_blocks=min(anchor_end // config.block_bytes, config.max_blocks),
        has_tools=bool(tools),
        tool_choice=_tool_choice(body.get("tool_choice"), bool(tools)),
        structured_output=_structured_output(body),
        session_key=_session_key(body, session_key),
        max_tokens=_max_tokens(body),
        batch_tokens=batch,
        reasoning=_reasoning(body),
    )


def render_chat(
    body: Mapping[str, Any], bytes_per_token: int = DEFAULT_FEATURE_CONFIG.bytes_per_token
) -> tuple[bytes, int, int]:
    """The canonical bytes of a chat request and the byte offsets where its preamble (tool schemas,
    system and developer messages) and its anchor (preamble + first other message) end."""
    rendered, preamble_end, anchor_end, _ = _render_chat(body, bytes_per_token)
    return rendered, preamble_end, anchor_end


def _render_chat(body: Mapping[str, Any], bytes_per_token: int) -> tuple[bytes, int, int, int]:
    """`render_chat` plus the offset where the last message starts (the end of the history an earlier
    turn of the same conversation has already sent; the preamble's end for a first turn)."""
    parts: list[bytes] = []
    size = 0
    tools = body.get("tools")
    if tools:
        part = b"T" + _dumps(tools)
        parts.append(part)
        size += len(part)
    preamble_end = anchor_end = last_start = -1
    for message in body.get("messages") or ():
        part = b"\n" + _render_message(message, bytes_per_token)
        if anchor_end < 0 and message.get("role") not in _PREAMBLE_ROLES:
            preamble_end = size
            anchor_end = size + len(part)
        last_start = size
        parts.append(part)
        size += len(part)
    response_format = body.get("response_format")
    if response_format:
        parts.append(b"\nR" + _dumps(response_format))
    rendered = b"".join(parts)
    if anchor_end < 0:
        return rendered, size, size, size
    return rendered, preamble_end, anchor_end, max(last_start, preamble_end)


def _render_message(message: Mapping[str, Any], bytes_per_token: int) -> bytes:
    content = message.get("content")
    if isinstance(content, list):
        content = _flatten_text_parts(content)
        if isinstance(content, list):
            content = _media_by_digest(content, bytes_per_token)
    return _dumps(
        (
            message.get("role"),
            message.get("name"),
            content,
            message.get("tool_calls") or None,
            message.get("tool_call_id"),
        )
    )


def _media_by_digest(content: list[Any], bytes_per_token: int) -> list[Any]:
    """`content` with each media item's URL replaced by its digest, repeated over the bytes of the
    item's estimated tokens (see the module docstring)."""
    out: list[Any] = []
    for part in content:
        refs = media_refs(part) if isinstance(part, dict) else []
        if not refs:
            out.append(part)
            continue
        marked = dict(part)
        for ref in refs:
            digest = media_digest(ref.url) if ref.url is not None else str(part.get("uuid"))
            size = MEDIA_TOKENS[ref.kind] * bytes_per_token
            marked[ref.key] = (digest * (size // len(digest) + 1))[:size]
        out.append(marked)
    return out


def _dumps(value: Any) -> bytes:
    """Compact JSON with sorted keys; values orjson cannot encode (integers beyond 64 bits, non-string
    keys) fall back to the standard library, so extraction never fails on a validated body."""
    try:
        return orjson.dumps(value, option=_SORT)
    except TypeError:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()


def _flatten_text_parts(content: list[Any]) -> str | list[Any]:
    """`[{"type": "text", "text": a}, ...]` -> `a\\n...`, so string and part forms render alike."""
    texts: list[str] = []
    for item in content:
        if not (isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str)):
            return content
        texts.append(item["text"])
    return "\n".join(texts)


def render_prompt(prompt: Any) -> tuple[bytes, int | None]:
    """Bytes of a `/v1/completions` prompt and its exact token count when given as token ids.

    A batch (list of strings or list of token lists) is routed by its first prompt.
    """
    if isinstance(prompt, str):
        return prompt.encode(), None
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int):
            return _token_bytes(prompt), len(prompt)
        if isinstance(first, str):
            return first.encode(), None
        if isinstance(first, list):
            return _token_bytes(first), len(first)
    return b"", None


def batch_tokens(prompt: Any, bytes_per_token: int) -> tuple[int, ...]:
    """Each prompt's tokens in a `/v1/completions` batch (a list of strings: estimated like
    `prompt_tokens`; a list of token-id lists: exact); `()` for a single prompt (a string, one list of
    token ids) or no list at all."""
    if not isinstance(prompt, list) or not prompt or isinstance(prompt[0], int):
        return ()
    out: list[int] = []
    for p in prompt:
        if isinstance(p, str):
            out.append(-(-len(p.encode()) // bytes_per_token))
        elif isinstance(p, list):
            out.append(len(p))
        else:
            return ()
    return tuple(out)


def _token_bytes(ids: list[Any]) -> bytes:
    try:
        return array("I", ids).tobytes()
    except (OverflowError, TypeError):
        return _dumps(ids)


def block_hashes(rendered: bytes, block_bytes: int, max_blocks: int) -> tuple[int, ...]:
    """Chained hashes of the full blocks of `rendered` (see the module docstring), at most `max_blocks`."""
    count = min(len(rendered) // block_bytes, max_blocks)
    out: list[int] = []
    crc32 = zlib.crc32
    view = memoryview(rendered)
    crc = 0
    start = 0
    for tag in range(1 << 32, (count + 1) << 32, 1 << 32):
        end = start + block_bytes
        crc = crc32(view[start:end], crc)
        out.append(tag | crc)
        start = end
    return tuple(out)


def anchor_hash(rendered: bytes, anchor_end: int, config: FeatureConfig) -> int:
    """A 64-bit hash of `rendered[:anchor_end]` (head, tail and length when it is long)."""
    view = memoryview(rendered)
    head = view[: min(anchor_end, config.anchor_max_bytes)]
    crc = zlib.crc32(head)
    adler = zlib.adler32(head)
    if anchor_end > config.anchor_max_bytes and config.anchor_tail_bytes:
        tail = view[max(0, anchor_end - config.anchor_tail_bytes) : anchor_end]
        crc = zlib.crc32(tail, crc)
        adler = zlib.adler32(tail, adler)
    return mix64(((crc << 32) | adler) ^ mix64(anchor_end))


def _tool_choice(value: Any, has_tools: bool) -> ToolChoice | None:
    if value is None:
        return None
    if isinstance(value, dict):
        return "named"
    if value in ("none", "auto", "required"):
        choice: ToolChoice = value
        return choice
    return "auto" if has_tools else None


def _structured_output(body: Mapping[str, Any]) -> bool:
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type") in _STRUCTURED_TYPES:
        return True
    return any(body.get(name) is not None for name in _STRUCTURED_FIELDS)


def _session_key(body: Mapping[str, Any], header: str | None) -> str | None:
    cache_key = body.get("prompt_cache_key")
    if isinstance(cache_key, str) and cache_key:
        return cache_key
    if header:
        return header
    metadata = body.get("metadata")
    session = metadata.get("session_id") if isinstance(metadata, Mapping) else None
    if isinstance(session, str) and session:
        return session
    user = body.get("user")
    return user if isinstance(user, str) and user else None


def _reasoning(body: Mapping[str, Any]) -> bool:
    """Thinking asked for: a `reasoning_effort` other than none, or `enable_thinking` (`thinking`)
    true in `chat_template_kwargs` (Qwen3's and DeepSeek's templates read them)."""
    effort = body.get("reasoning_effort")
    if isinstance(effort, str) and effort not in ("none", "minimal"):
        return True
    kwargs = body.get("chat_template_kwargs")
    return isinstance(kwargs, Mapping) and (
        kwargs.get("enable_thinking") is True or kwargs.get("thinking") is True
    )


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


__all__: Sequence[str] = (
    "DEFAULT_FEATURE_CONFIG",
    "FeatureConfig",
    "anchor_hash",
    "block_hashes",
    "extract_features",
    "render_chat",
    "render_prompt",
)
