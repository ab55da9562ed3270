"""`POST /v1/embeddings` of a simulated embedding model, in each engine's dialect.

A simulator started with `--embedding-dim N` is an embedding model (vLLM `--runner pooling`, SGLang
`--is-embedding`) with vectors of N floats; without it, the endpoint answers as each engine does
for a generation model: vLLM 404 `{"detail": "Not Found"}`, SGLang 400 "This model does not
appear to be an embedding model". (The chat endpoints keep answering either way.)

Vectors are deterministic and L2-normalised: each token id (engines.sim.tokenizer) seeds a fixed
Gaussian vector, an input's vector is the sum of its tokens' vectors, normalised — so the same text
gets the same vector on every simulator and in every process, and texts that share words are
close (cosine similarity), which is enough for a RAG pipeline to be tried end to end. `dimensions`
keeps the first d components and normalises again (as a Matryoshka model does), d in [1, N].

Wire shapes (read from each engine's `/v1/embeddings` server):
- vLLM: `{"id": "embd-<hex>", "object": "list", "created", "model": <served name>, "data":
  [{"index", "object": "embedding", "embedding"}], "usage": {"prompt_tokens", "total_tokens",
  "completion_tokens": 0, "prompt_tokens_details": null}}`; unknown model 404; `dimensions` out of
  range: "Model 'M' only supports dimensions in range [1, N], got d.";
- SGLang: `{"data": [...], "model": <model path>, "object": "list", "usage": {…,
  "reasoning_tokens": 0, "completion_tokens_details": null}}` (no id, no created); any model name
  is served; empty or whitespace-only input: 400 "Input cannot be empty or whitespace only";
  `dimensions` > N: "Provided dimensions are greater than max embedding dimension: N".
Both: `encoding_format` float or base64 (little-endian float32); the cost is one prefill; the fault
flags apply as on chat (`engines.sim.pooling`).
"""

from __future__ import annotations

import base64
import math
import random
import struct
import time
from typing import Any

import orjson

from engines.sim import asgi, tokenizer
from engines.sim.asgi import Receive, Scope, Send
from engines.sim.config import SimConfig
from engines.sim.engine import Engine
from engines.sim.plan import hex_id
from engines.sim.pooling import ErrorBody, PoolingEndpoint
from engines.sim.request import RequestError

_VECTORS_MAX = 200_000


class _Vectors:
    """One fixed Gaussian vector per token id (bounded memo)."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._memo: dict[int, list[float]] = {}

    def token(self, tid: int) -> list[float]:
        v = self._memo.get(tid)
        if v is None:
            rng = random.Random(tid * 1_000_003 + self.dim)
            v = [rng.gauss(0.0, 1.0) for _ in range(self.dim)]
            if len(self._memo) < _VECTORS_MAX:
                self._memo[tid] = v
        return v

    def embed(self, ids: list[int], dimensions: int | None) -> list[float]:
        acc = [0.0] * self.dim
        for tid in ids or [0]:
            acc = [a + b for a, b in zip(acc, self.token(tid), strict=True)]
        if dimensions is not None:
            acc = acc[:dimensions]
        norm = math.sqrt(sum(x * x for x in acc)) or 1.0
        return [x / norm for x in acc]


def _inputs(raw: Any) -> list[list[int]] | None:
    """Token ids of each input (None: not a valid input)."""
    if isinstance(raw, str):
        return [tokenizer.encode(raw)]
    if not isinstance(raw, list) or not raw:
        return None
    if all(isinstance(x, str) for x in raw):
        return [tokenizer.encode(x) for x in raw]
    if all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        return [list(raw)]
    if all(isinstance(x, list) and all(isinstance(t, int) for t in x) for x in raw):
        return [list(x) for x in raw]
    return None


class EmbeddingsEndpoint(PoolingEndpoint):
    """The `/v1/embeddings` handler of one simulator app."""

    def __init__(self, cfg: SimConfig, engine: Engine, error_body: ErrorBody) -> None:
        super().__init__(cfg, engine, error_body)
        self._vectors = _Vectors(cfg.embedding_dim) if cfg.embedding_dim > 0 else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = await self.begin(scope, receive, send)
        if raw is None:
            return
        if self._vectors is None:
            if self.cfg.engine == "vllm":
                await self.not_found(send)
            else:
                await self.refuse(
                    send,
                    RequestError(
                        "This model does not appear to be an embedding model by default. Please add "
                        "`--is-embedding` when launching the server or try another model."
                    ),
                )
            return
        try:
            body = orjson.loads(raw)
            if not isinstance(body, dict):
                raise RequestError(
                    "1 validation error:\n  Input should be a valid dictionary", err_type="Bad Request"
                )
            ids, fmt, dims = self._check(body)
        except orjson.JSONDecodeError as exc:
            await self.refuse(send, RequestError(f"JSON decode error: {exc}", err_type="Bad Request"))
            return
        except RequestError as err:
            await self.refuse(send, err)
            return
        flat = [t for one in ids for t in one]
        if not await self.prefill(receive, flat):
            return
        vectors = [self._vectors.embed(one, dims) for one in ids]
        await asgi.send_bytes(send, 200, self._body(body, vectors, fmt, len(flat)))

    def _check(self, body: dict[str, Any]) -> tuple[list[list[int]], str, int | None]:
        cfg = self.cfg
        vllm = cfg.engine == "vllm"
        model = body.get("model")
        if vllm and model is not None and model != cfg.served_model_name:
            raise RequestError(
                f"The model `{model}` does not exist.", status=404, param="model", err_type="NotFoundError"
            )
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise RequestError(f"encoding_format must be either 'float' or 'base64', got {fmt!r}")
        raw = body.get("input")
        if not vllm:
            texts = [raw] if isinstance(raw, str) else raw if isinstance(raw, list) else []
            if not raw or any(isinstance(t, str) and not t.strip() for t in texts):
                raise RequestError("Input cannot be empty or whitespace only")
        ids = _inputs(raw)
        if ids is None:
            raise RequestError(
                "1 validation error:\n  input: Input should be a valid list", err_type="Bad Request"
            )
        for one in ids:
            if len(one) > cfg.max_model_len:
                raise RequestError(
                    f"This model's maximum context length is {cfg.max_model_len} tokens. However, you requested "
                    f"{len(one)} tokens in the input for embedding generation. Please reduce the length of the input."
                )
        dims = body.get("dimensions")
        if dims is not None:
            dim = cfg.embedding_dim
            if not isinstance(dims, int):
                raise RequestError("1 validation error:\n  dimensions: Input should be a valid integer")
            if vllm and not 1 <= dims <= dim:
                raise RequestError(
                    f"Model '{cfg.served_model_name}' only supports dimensions in range [1, {dim}], got {dims}."
                )
            if not vllm and dims < 1:
                raise RequestError("Requested dimensions must be greater than 0")
            if not vllm and dims > dim:
                raise RequestError(f"Provided dimensions are greater than max embedding dimension: {dim}")
        return ids, fmt, dims

    def _body(self, body: dict[str, Any], vectors: list[list[float]], fmt: str, tokens: int) -> bytes:
        data = [
            {
                "index": i,
                "object": "embedding",
                "embedding": _b64(v) if fmt == "base64" else v,
            }
            for i, v in enumerate(vectors)
        ]
        usage: dict[str, Any] = {
            "prompt_tokens": tokens,
            "total_tokens": tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
        }
        if self.cfg.engine == "vllm":
            return orjson.dumps(
                {
                    "id": f"embd-{hex_id()}",
                    "object": "list",
                    "created": int(time.time()),
                    "model": self.cfg.served_model_name,
                    "data": data,
                    "usage": usage,
                }
            )
        usage.update(reasoning_tokens=0, completion_tokens_details=None)
        return orjson.dumps({"data": data, "model": self.cfg.model, "object": "list", "usage": usage})


def _b64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
