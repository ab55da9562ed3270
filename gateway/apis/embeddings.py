"""`POST /v1/embeddings`: OpenAI's embeddings request, checked once so both engines answer alike.

    EmbeddingsIntake   after the parse stage (which refuses a model whose task is not `embed`):
                       `input` a non-empty string, an array of them (≤ 2048), an array of token ids
                       or of token-id arrays; `encoding_format` float | base64; `dimensions` ≥ 1;
                       each input within the model's context (the gateway's estimate, with the
                       sanitiser's slack; token arrays exactly), at most 300,000 tokens in all.
                       It sets the routing features (`prompt_tokens` = all inputs, counted by
                       admission; the first input keys the backend choice) and `ctx.answer`.
    EmbeddingsAnswer   the engine's answer → OpenAI's shape (`engines.embeddings`)

Strings that are empty or only whitespace are refused (SGLang refuses them, vLLM does not: the
gateway answers alike for both).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from engines.base import Dialect, StreamWriter, Usage
from engines.embeddings import encode_embeddings
from engines.errors import ApiError, above_max_length, invalid_request, server_error
from engines.upstream_errors import GENERIC_UPSTREAM
from engines.validate import token_ids
from gateway.apis.checks import integer, invalid_value, missing, type_error
from gateway.core.context import RequestContext, session_header
from gateway.core.responses import JSON, Response
from policies.features import FeatureConfig, extract_features

MAX_INPUTS = 2048
MAX_TOKENS_PER_REQUEST = 300_000


class EmbeddingsAnswer:
    """`gateway.core.answer.Answer` for one embeddings request (never streamed)."""

    __slots__ = ("_format", "_model")
    #: an embedding has no finish reason
    finish_reasons: tuple[str, ...] = ()
    content_type = JSON

    def __init__(self, model: str, encoding_format: str) -> None:
        self._model = model
        self._format = encoding_format

    def body(self, dialect: Dialect, data: bytes) -> tuple[bytes, Usage]:
        result = dialect.decode_embeddings(data)
        try:
            return encode_embeddings(result, model=self._model, encoding_format=self._format), result.usage
        except ValueError:
            raise server_error(GENERIC_UPSTREAM) from None

    def stream(self) -> StreamWriter:  # pragma: no cover - the intake never sets ctx.stream
        raise invalid_request("The embeddings endpoint does not stream.", param="stream")

    async def complete(self) -> None:
        return None


def too_long(context_length: int, tokens: int, param: str) -> ApiError:
    return ApiError(
        400,
        f"This model's maximum context length is {context_length} tokens, however you requested about "
        f"{tokens} tokens ({tokens} in your prompt; 0 for the completion). Please reduce your prompt.",
        type="invalid_request_error",
        param=param,
        code="context_length_exceeded",
    )


def input_token_counts(raw: Any, bytes_per_token: int) -> list[int]:
    """Each input's token count (exact for token ids, estimated for text); 400 for a bad `input`."""
    if raw is None:
        raise missing("input")
    if type(raw) is str:
        return [_text_tokens(raw, "input", bytes_per_token)]
    if type(raw) is not list or not raw:
        if type(raw) is list:
            raise invalid_request(
                "Invalid 'input': empty array. Expected an array with minimum length 1, but got an empty array instead.",
                param="input",
                code="empty_array",
            )
        raise type_error("input", "a string, an array of strings or an array of token arrays", raw)
    if len(raw) > MAX_INPUTS:
        raise above_max_length("input", MAX_INPUTS, len(raw), "array")
    first = raw[0]
    if type(first) is str:
        out = []
        for i, s in enumerate(raw):
            if type(s) is not str:
                raise type_error(f"input[{i}]", "a string", s)
            out.append(_text_tokens(s, f"input[{i}]", bytes_per_token))
        return out
    if type(first) is int:
        token_ids(raw, "input")
        return [len(raw)]
    if type(first) is list:
        out = []
        for i, ids in enumerate(raw):
            if type(ids) is not list or not ids:
                raise type_error(f"input[{i}]", "a non-empty array of token ids", ids)
            token_ids(ids, f"input[{i}]")
            out.append(len(ids))
        return out
    raise type_error("input", "a string, an array of strings or an array of token arrays", raw)


def _text_tokens(s: str, param: str, bytes_per_token: int) -> int:
    if not s.strip():
        raise invalid_request(
            f"Invalid '{param}': the input must not be empty or only whitespace.",
            param=param,
            code="invalid_value",
        )
    return -(-len(s.encode()) // bytes_per_token)


class EmbeddingsIntake:
    name = "embeddings"

    def __init__(self, features: FeatureConfig, context_slack: float) -> None:
        self._features = features
        self._slack = context_slack

    async def __call__(self, ctx: RequestContext) -> Response | None:
        body = ctx.body
        model = ctx.model
        assert model is not None, "the parse stage resolves the model"
        counts = input_token_counts(body.get("input"), self._features.bytes_per_token)
        fmt = body.get("encoding_format")
        if fmt is None:
            fmt = "float"
        elif fmt not in ("float", "base64"):
            raise invalid_value("encoding_format", fmt, ("float", "base64"))
        integer(body, "dimensions", 1)
        user = body.get("user")
        if user is not None and type(user) is not str:
            raise type_error("user", "a string", user)
        if body.get("stream") is not None:
            raise invalid_request("Unrecognized request argument supplied: stream", param="stream")
        allowed = model.context_length * (1 + self._slack)
        for i, n in enumerate(counts):
            if n > allowed:
                raise too_long(model.context_length, n, "input" if len(counts) == 1 else f"input[{i}]")
        total = sum(counts)
        if total > MAX_TOKENS_PER_REQUEST:
            raise invalid_request(
                f"Requested about {total} tokens, max {MAX_TOKENS_PER_REQUEST} tokens per request.",
                param="input",
            )
        first = extract_features(
            {"model": model.name, "prompt": body["input"]}, self._features, session_key=session_header(ctx)
        )
        ctx.extras["features"] = dataclasses.replace(first, prompt_tokens=total)
        ctx.stream = False
        ctx.answer = EmbeddingsAnswer(model.name, fmt)
        return None
