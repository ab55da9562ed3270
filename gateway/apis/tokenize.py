"""`POST /tokenize` and `POST /detokenize` (also `/v1/tokenize`, `/v1/detokenize`, as SGLang serves
them): the engines' own tokenizer, for a model of any task, in vLLM's shapes (`engines.tokenize`).

    TokenizeIntake     after the parse stage: exactly one of `prompt` (a string) and `messages`
                       (checked as chat's, with `tools`; their media go through the media stage next);
                       `add_special_tokens`, `add_generation_prompt`, `continue_final_message` and
                       `return_token_strs` booleans. Admission counts the text's estimate, reconciled
                       with the engine's count.
    DetokenizeIntake   `tokens`: token ids in 0..2³¹−1, counted exactly.

Neither streams; both reserve no output tokens (`engines.base.INPUT_ONLY`).
"""

from __future__ import annotations

import dataclasses

from engines.base import Dialect, StreamWriter, Usage
from engines.errors import invalid_request
from engines.tokenize import decode_text, decode_tokens, encode_text, encode_tokens
from engines.validate import token_ids, validate_request
from gateway.apis.checks import boolean, missing, type_error
from gateway.apis.plain import hand_over
from gateway.core.context import RequestContext, session_header
from gateway.core.responses import JSON, Response
from policies.features import FeatureConfig, extract_features

_FLAGS = ("add_special_tokens", "add_generation_prompt", "continue_final_message", "return_token_strs")


class TokenizeAnswer:
    """`gateway.core.answer.Answer` for one tokenize request (never streamed)."""

    __slots__ = ("_max_len",)
    finish_reasons: tuple[str, ...] = ()
    content_type = JSON

    def __init__(self, max_model_len: int) -> None:
        self._max_len = max_model_len

    def body(self, dialect: Dialect, data: bytes) -> tuple[bytes, Usage]:
        tokens = decode_tokens(data)
        return encode_tokens(tokens, self._max_len), Usage(prompt_tokens=len(tokens.ids))

    def stream(self) -> StreamWriter:  # pragma: no cover - the intake never sets ctx.stream
        raise invalid_request("The tokenize endpoint does not stream.", param="stream")

    async def complete(self) -> None:
        return None


class DetokenizeAnswer:
    """`gateway.core.answer.Answer` for one detokenize request: billed its token ids."""

    __slots__ = ("_count",)
    finish_reasons: tuple[str, ...] = ()
    content_type = JSON

    def __init__(self, count: int) -> None:
        self._count = count

    def body(self, dialect: Dialect, data: bytes) -> tuple[bytes, Usage]:
        return encode_text(decode_text(data)), Usage(prompt_tokens=self._count)

    def stream(self) -> StreamWriter:  # pragma: no cover - the intake never sets ctx.stream
        raise invalid_request("The detokenize endpoint does not stream.", param="stream")

    async def complete(self) -> None:
        return None


class TokenizeIntake:
    name = "tokenize"

    def __init__(self, features: FeatureConfig) -> None:
        self._features = features

    async def __call__(self, ctx: RequestContext) -> Response | None:
        body = ctx.body
        model = ctx.model
        assert model is not None, "the parse stage resolves the model"
        prompt, messages = body.get("prompt"), body.get("messages")
        if (prompt is None) == (messages is None):
            raise invalid_request("Exactly one of 'prompt' or 'messages' must be provided.", param="prompt")
        if messages is not None:
            validate_request("chat", body)  # messages and tools, as on chat
        elif type(prompt) is not str:
            raise type_error("prompt", "a string", prompt)
        for flag in _FLAGS:
            boolean(body, flag)
        features = extract_features(body, self._features, session_key=session_header(ctx))
        hand_over(ctx, features)
        ctx.answer = TokenizeAnswer(model.context_length)
        return None


class DetokenizeIntake:
    name = "detokenize"

    def __init__(self, features: FeatureConfig) -> None:
        self._features = features

    async def __call__(self, ctx: RequestContext) -> Response | None:
        body = ctx.body
        model = ctx.model
        assert model is not None, "the parse stage resolves the model"
        tokens = body.get("tokens")
        if tokens is None:
            raise missing("tokens")
        if type(tokens) is not list:
            raise type_error("tokens", "an array of token ids", tokens)
        token_ids(tokens, "tokens")
        boolean(body, "skip_special_tokens")
        features = extract_features(
            {"model": model.name, "prompt": tokens}, self._features, session_key=session_header(ctx)
        )
        hand_over(ctx, dataclasses.replace(features, prompt_tokens=len(tokens)))
        ctx.answer = DetokenizeAnswer(len(tokens))
        return None
