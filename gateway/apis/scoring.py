"""`POST /v1/rerank` (also `/rerank`) and `POST /v1/score` on a model whose `task` is `score` (a
cross-encoder), in vLLM's shapes from either engine (`engines.scoring`).

    RerankIntake   after the parse stage: `query` a string; `documents` a string or 1..2,048 strings;
                   `top_n` ≥ 0 (0: all); `return_documents`; `instruction` (or SGLang's `instruct`)
                   a string.
    ScoreIntake    one pair form (`engines.scoring.PAIR_FORMS`: `text_1`/`text_2`, …), each side a
                   string or 1..2,048 strings, paired 1:1, 1:N or N:N; SGLang's label scoring
                   (`label_token_ids`, …) is refused: its answer has no place in the score shape.

Texts alone, none empty or whitespace-only (SGLang refuses them, vLLM does not): both engines answer
alike, and no media URL reaches an engine. Each pair must fit the model's context (the gateway's
estimate, with the sanitiser's slack), at most 300,000 tokens in all. Admission reserves the pairs'
estimate (a query counts once per document it is paired with), reconciled with the engine's count;
routing keys on the query, so requests about one query meet the engine that cached its prefix.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from engines.base import Dialect, StreamWriter, Usage
from engines.errors import above_max_length, invalid_request
from engines.scoring import PAIR_FORMS, decode_rerank, decode_score, encode_rerank, encode_score, pair_form
from gateway.apis.checks import boolean, integer, missing, string, type_error, unsupported
from gateway.apis.embeddings import MAX_INPUTS, MAX_TOKENS_PER_REQUEST, too_long
from gateway.apis.plain import hand_over
from gateway.core.context import RequestContext, session_header
from gateway.core.responses import JSON, Response
from gateway.core.settings import ModelSettings
from policies.features import FeatureConfig, extract_features

#: SGLang's label scoring: a matrix per item, which vLLM's one score per pair cannot carry
LABEL_SCORING = (
    "label_token_ids",
    "apply_softmax",
    "item_first",
    "temperature",
    "return_token_logprobs",
    "return_pooled_hidden_states",
    "score_extraction_token",
    "embed_override_token_id",
    "query_embed_overrides",
    "item_embed_overrides",
)


class RerankAnswer:
    """`gateway.core.answer.Answer` for one rerank request (never streamed)."""

    __slots__ = ("_documents", "_estimate", "_model", "_top_n", "_with_documents")
    finish_reasons: tuple[str, ...] = ()
    content_type = JSON

    def __init__(
        self, model: str, documents: list[str], top_n: int, with_documents: bool, estimate: int
    ) -> None:
        self._model = model
        self._documents = documents
        self._top_n = top_n
        self._with_documents = with_documents
        self._estimate = estimate

    def body(self, dialect: Dialect, data: bytes) -> tuple[bytes, Usage]:
        scores = decode_rerank(data)
        tokens = scores.prompt_tokens if scores.prompt_tokens is not None else self._estimate
        out = encode_rerank(
            scores,
            self._documents,
            model=self._model,
            top_n=self._top_n,
            with_documents=self._with_documents,
            tokens=tokens,
        )
        return out, Usage(prompt_tokens=tokens)

    def stream(self) -> StreamWriter:  # pragma: no cover - the intake never sets ctx.stream
        raise invalid_request("The rerank endpoint does not stream.", param="stream")

    async def complete(self) -> None:
        return None


class ScoreAnswer:
    """`gateway.core.answer.Answer` for one score request (never streamed)."""

    __slots__ = ("_estimate", "_model", "_pairs")
    finish_reasons: tuple[str, ...] = ()
    content_type = JSON

    def __init__(self, model: str, pairs: int, estimate: int) -> None:
        self._model = model
        self._pairs = pairs
        self._estimate = estimate

    def body(self, dialect: Dialect, data: bytes) -> tuple[bytes, Usage]:
        scores = decode_score(data)
        tokens = scores.prompt_tokens if scores.prompt_tokens is not None else self._estimate
        return encode_score(scores, self._pairs, model=self._model, tokens=tokens), Usage(
            prompt_tokens=tokens
        )

    def stream(self) -> StreamWriter:  # pragma: no cover - the intake never sets ctx.stream
        raise invalid_request("The score endpoint does not stream.", param="stream")

    async def complete(self) -> None:
        return None


class _Texts:
    """The checks both intakes make, with the model's context and the feature config."""

    def __init__(self, features: FeatureConfig, context_slack: float) -> None:
        self.features = features
        self._slack = context_slack

    def one(self, value: Any, param: str) -> str:
        if value is None:
            raise missing(param)
        if type(value) is not str:
            raise type_error(param, "a string", value)
        if not value.strip():
            raise invalid_request(
                f"Invalid '{param}': the text must not be empty or only whitespace.",
                param=param,
                code="invalid_value",
            )
        return value

    def many(self, value: Any, param: str) -> list[str]:
        if type(value) is str:
            return [self.one(value, param)]
        if type(value) is not list:
            raise type_error(param, "a string or an array of strings", value)
        if not value:
            raise invalid_request(
                f"Invalid '{param}': empty array. Expected an array with minimum length 1, but got an "
                "empty array instead.",
                param=param,
                code="empty_array",
            )
        if len(value) > MAX_INPUTS:
            raise above_max_length(param, MAX_INPUTS, len(value), "array")
        return [self.one(v, f"{param}[{i}]") for i, v in enumerate(value)]

    def tokens(self, text: str) -> int:
        return -(-len(text.encode()) // self.features.bytes_per_token)

    def pairs(self, model: ModelSettings, pairs: list[tuple[int, int]], param: str, each: bool) -> int:
        """The pairs' tokens (each pair's two counts) after checking each against the context; a
        too long pair names `param[i]` (`each`) or `param`."""
        allowed = model.context_length * (1 + self._slack)
        total = 0
        for i, (a, b) in enumerate(pairs):
            if a + b > allowed:
                raise too_long(model.context_length, a + b, f"{param}[{i}]" if each else param)
            total += a + b
        if total > MAX_TOKENS_PER_REQUEST:
            raise invalid_request(
                f"Requested about {total} tokens, max {MAX_TOKENS_PER_REQUEST} tokens per request.",
                param=param,
            )
        return total


class RerankIntake:
    name = "rerank"

    def __init__(self, features: FeatureConfig, context_slack: float) -> None:
        self._texts = _Texts(features, context_slack)

    async def __call__(self, ctx: RequestContext) -> Response | None:
        body = ctx.body
        model = ctx.model
        assert model is not None, "the parse stage resolves the model"
        t = self._texts
        query = t.one(body.get("query"), "query")
        documents = t.many(body.get("documents"), "documents")
        top_n = integer(body, "top_n", 0) or 0
        keep = boolean(body, "return_documents") is not False
        for key in ("instruction", "instruct"):
            string(body, key)
        q = t.tokens(query)
        total = t.pairs(
            model, [(q, t.tokens(d)) for d in documents], "documents", type(body["documents"]) is list
        )
        features = extract_features(
            {"model": model.name, "prompt": query}, t.features, session_key=session_header(ctx)
        )
        hand_over(ctx, dataclasses.replace(features, prompt_tokens=total))
        ctx.answer = RerankAnswer(model.name, documents, top_n, keep, total)
        return None


class ScoreIntake:
    name = "score"

    def __init__(self, features: FeatureConfig, context_slack: float) -> None:
        self._texts = _Texts(features, context_slack)

    async def __call__(self, ctx: RequestContext) -> Response | None:
        body = ctx.body
        model = ctx.model
        assert model is not None, "the parse stage resolves the model"
        for field in LABEL_SCORING:
            if body.get(field) is not None:
                raise unsupported(field, f"'{field}' (label scoring)")
        form = pair_form(body)
        if form is None:
            raise missing("text_1")
        given = sorted({key for f in PAIR_FORMS for key in f if key in body} - set(form))
        if given:
            raise invalid_request(
                f"Give one pair of texts: '{form[0]}' and '{form[1]}', without '{given[0]}'.", param=given[0]
            )
        t = self._texts
        left = t.many(body[form[0]], form[0])
        right = t.many(body[form[1]], form[1])
        if len(left) > 1 and len(left) != len(right):
            raise invalid_request(
                f"Input lengths must be either 1:1, 1:N or N:N: '{form[0]}' has {len(left)} texts, "
                f"'{form[1]}' {len(right)}.",
                param=form[1],
            )
        a = [t.tokens(x) for x in left]
        b = [t.tokens(x) for x in right]
        pairs = [(a[0] if len(a) == 1 else a[i], n) for i, n in enumerate(b)]
        total = t.pairs(model, pairs, form[1], type(body[form[1]]) is list)
        features = extract_features(
            {"model": model.name, "prompt": left[0]}, t.features, session_key=session_header(ctx)
        )
        hand_over(ctx, dataclasses.replace(features, prompt_tokens=total))
        ctx.answer = ScoreAnswer(model.name, len(pairs), total)
        return None
