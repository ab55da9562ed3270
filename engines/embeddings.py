"""`/v1/embeddings` on the engine side, and OpenAI's embeddings answer.

Request (`build_embeddings_request`), for a body the gateway has validated (input, encoding_format):
- `model` becomes the served name; top-level nulls are dropped (SGLang rejects some);
- `encoding_format` (`float` | `base64`) and `dimensions` are passed on: both engines honour
  `dimensions` only for Matryoshka models and answer a 400 otherwise, which is passed back;
- base64 is little-endian float32 on both engines (SGLang always; vLLM is told so with
  `embed_dtype: float32`, `endianness: little` unless the client chose them);
- each engine's own fields pass through to it and are refused (400) on the other: vLLM's
  `truncate_prompt_tokens`, `use_activation`, `embed_dtype`, `endianness`, `padding`,
  `truncation_side`, `add_special_tokens`; SGLang's `lora_path`, `embed_override_token_id`,
  `embed_overrides`; `rid` / `request_id` are dropped (the gateway owns request ids).

Answer (`encode_embeddings`): OpenAI's `{"object": "list", "data": [{"object": "embedding", "index",
"embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}` — the public model name, no
engine id, `created`, or null details. A vector in the other encoding than the client asked for
(an engine that ignored `encoding_format`) is converted.
"""

from __future__ import annotations

import base64
import struct
import sys
from array import array
from typing import Any, Literal

import orjson

from engines.base import Embeddings
from engines.request import unsupported

EngineName = Literal["vllm", "sglang"]

VLLM_ONLY = (
    "truncate_prompt_tokens",
    "use_activation",
    "embed_dtype",
    "endianness",
    "padding",
    "truncation_side",
    "add_special_tokens",
)
SGLANG_ONLY = ("lora_path", "embed_override_token_id", "embed_overrides")
_DROPPED = ("rid", "request_id")
_ENGINE = {"vllm": "vLLM", "sglang": "SGLang"}


def build_embeddings_request(body: dict[str, Any], served_model: str, engine: EngineName) -> bytes:
    """The engine's `/v1/embeddings` body for a validated OpenAI embeddings request."""
    out = {k: v for k, v in body.items() if v is not None and k not in _DROPPED}
    out["model"] = served_model
    foreign = SGLANG_ONLY if engine == "vllm" else VLLM_ONLY
    for field in foreign:
        if field in out:
            raise unsupported(field, _ENGINE[engine])
    if engine == "vllm" and out.get("encoding_format") == "base64":
        out.setdefault("embed_dtype", "float32")
        out.setdefault("endianness", "little")
    return orjson.dumps(out)


def floats_to_base64(vector: list[float]) -> str:
    """OpenAI's base64 embedding: the little-endian float32 values, base64-encoded."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def base64_to_floats(text: str) -> list[float]:
    """The inverse of `floats_to_base64` (raises ValueError on a malformed string)."""
    raw = base64.b64decode(text, validate=True)
    if len(raw) % 4:
        raise ValueError("not a whole number of float32 values")
    values = array("f")
    values.frombytes(raw)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


def encode_embeddings(result: Embeddings, *, model: str, encoding_format: str) -> bytes:
    """OpenAI's embeddings body for `result`, every vector in `encoding_format` (float | base64)."""
    want_base64 = encoding_format == "base64"
    data = []
    for i, vec in enumerate(result.vectors):
        if want_base64 and type(vec) is list:
            vec = floats_to_base64(vec)
        elif not want_base64 and type(vec) is str:
            vec = base64_to_floats(vec)
        data.append({"object": "embedding", "index": i, "embedding": vec})
    n = result.usage.prompt_tokens
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": n, "total_tokens": n},
        }
    )
