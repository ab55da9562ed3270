"""`/tokenize` and `/detokenize` on the engine side, and their answers in vLLM's shapes.

Requests, for a body the gateway has validated (`gateway/apis/tokenize.py`):
- `model` becomes the served name; top-level nulls are dropped;
- detokenizing keeps special tokens on both engines, as vLLM does: SGLang is sent
  `skip_special_tokens: false` unless the client set it; vLLM cannot skip them (`true` is a 400);
- `return_token_strs` (vLLM's) is a 400 on SGLang, which has no token strings.

Answers (SGLang's differ; vLLM's are the reference, OpenAI has none):
- tokenize: `{"count", "max_model_len", "tokens", "token_strs"}`, `token_strs` null unless asked;
  `max_model_len` is the model's context length as the gateway enforces it (SGLang reports its
  tokenizer's `model_max_length` there, not the context);
- detokenize: `{"prompt": text}` (SGLang's `{"text"}`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from engines.errors import server_error
from engines.request import unsupported
from engines.upstream_errors import GENERIC_UPSTREAM

_ENGINE = {"vllm": "vLLM", "sglang": "SGLang"}


@dataclass(slots=True)
class Tokens:
    """A tokenize answer: the prompt's token ids, and their strings when the engine gave them."""

    ids: list[int]
    strs: list[str] | None = None


def build_tokenize_request(body: dict[str, Any], served_model: str, engine: str) -> bytes:
    out = {k: v for k, v in body.items() if v is not None}
    out["model"] = served_model
    if engine == "sglang":
        if out.get("return_token_strs") is True:
            raise unsupported("return_token_strs", _ENGINE[engine])
        out.pop("return_token_strs", None)
    return orjson.dumps(out)


def build_detokenize_request(body: dict[str, Any], served_model: str, engine: str) -> bytes:
    out = {k: v for k, v in body.items() if v is not None}
    out["model"] = served_model
    if engine == "sglang":
        out.setdefault("skip_special_tokens", False)
    elif out.pop("skip_special_tokens", False) is not False:
        raise unsupported("skip_special_tokens", _ENGINE[engine], "It keeps special tokens.")
    return orjson.dumps(out)


def decode_tokens(data: bytes) -> Tokens:
    """Either engine's tokenize answer (raises the generic upstream `ApiError` on another shape)."""
    obj = _object(data)
    ids = obj.get("tokens")
    strs = obj.get("token_strs")
    if type(ids) is not list or any(type(t) is not int for t in ids):
        raise server_error(GENERIC_UPSTREAM)
    if type(strs) is not list or any(type(s) is not str for s in strs):
        strs = None
    return Tokens(ids, strs)


def decode_text(data: bytes) -> str:
    """Either engine's detokenize answer: vLLM's `prompt`, SGLang's `text`."""
    obj = _object(data)
    text = obj.get("prompt", obj.get("text"))
    if type(text) is not str:
        raise server_error(GENERIC_UPSTREAM)
    return text


def encode_tokens(tokens: Tokens, max_model_len: int) -> bytes:
    return orjson.dumps(
        {
            "count": len(tokens.ids),
            "max_model_len": max_model_len,
            "tokens": tokens.ids,
            "token_strs": tokens.strs,
        }
    )


def encode_text(text: str) -> bytes:
    return orjson.dumps({"prompt": text})


def _object(data: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise server_error(GENERIC_UPSTREAM) from None
    if type(obj) is not dict:
        raise server_error(GENERIC_UPSTREAM)
    return obj
