"""Rerank and score of a simulated cross-encoder, in each engine's dialect.

A simulator started with `--reranker` is a cross-encoder (vLLM `--runner pooling` on a sequence
classification model, SGLang `--is-embedding`): each (query, document) pair gets a relevance score in
[0, 1) made from the texts alone: the share of the query's words the document holds, plus a sliver
of a hash of the pair — deterministic in every process, and a document that answers the query ranks
above one that does not. A pair's cost is one prefill of its tokens (`engines.sim.pooling`); usage
counts each pair's query and document tokens.

Wire shapes (read from each engine's server):
- vLLM: `/rerank` (also `/v1/rerank`, `/v2/rerank`) `{query, documents, top_n (0: all)}` →
  `{"id": "score-…", "model", "usage": {"prompt_tokens", "total_tokens"}, "results": [{"index",
  "document": {"text", "multi_modal": null}, "relevance_score"}]}`, best first; `/score` (also
  `/v1/score`) takes `text_1`/`text_2` (or `queries` with `documents` or `items`, or `data_1`/
  `data_2`), 1:1, 1:N or N:N → `{"id", "object": "list", "created", "model", "data": [{"index",
  "object": "score", "score"}], "usage"}`. Without `--reranker` neither route exists (404).
- SGLang: `/v1/rerank` `{query, documents (a list), top_n (≥ 1), return_documents}` → a bare list
  `[{"score", "document", "index", "meta_info"}]`, best first; `/v1/score` `{query, items,
  label_token_ids}` → `{"scores": [[s], …], "model", "usage", "object": "scoring"}`. Without
  `--reranker`, rerank is a 400 and score needs `label_token_ids` (a generation model's label
  probabilities, also made from a hash).
"""

from __future__ import annotations

import re
import time
import zlib
from typing import Any

import orjson

from engines.sim import asgi, tokenizer
from engines.sim.asgi import Receive, Scope, Send
from engines.sim.plan import hex_id
from engines.sim.pooling import PoolingEndpoint
from engines.sim.request import RequestError

_WORD = re.compile(r"\w+")
_PAIR_FORMS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))


def relevance(query: str, document: str) -> float:
    """The simulated cross-encoder's score of one pair, in [0, 1)."""
    asked = {w.lower() for w in _WORD.findall(query)}
    held = {w.lower() for w in _WORD.findall(document)}
    share = len(asked & held) / len(asked) if asked else 0.0
    jitter = zlib.crc32(f"{query}\0{document}".encode()) / 2**32
    return round(0.98 * share + 0.01 * jitter, 6)


def _texts(value: Any, param: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(t, str) for t in items):
        raise RequestError(
            f"1 validation error:\n  {param}: Input should be a valid string", err_type="Bad Request"
        )
    return items


def _label_probabilities(query: str, item: str, labels: list[Any], softmax: bool) -> list[float]:
    raw = [zlib.crc32(f"{query}\0{item}\0{label}".encode()) / 2**32 / len(labels) for label in labels]
    total = sum(raw)
    return [round(p / total if softmax and total else p, 6) for p in raw]


class ScoringEndpoints(PoolingEndpoint):
    """`rerank` and `score` handlers of one simulator app."""

    async def rerank(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._answer(scope, receive, send, self._rerank)

    async def score(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._answer(scope, receive, send, self._score)

    async def _answer(self, scope: Scope, receive: Receive, send: Send, work: Any) -> None:
        raw = await self.begin(scope, receive, send)
        if raw is None:
            return
        if self.cfg.engine == "vllm" and not self.cfg.reranker:
            await self.not_found(send)
            return
        try:
            body = orjson.loads(raw)
            if not isinstance(body, dict):
                raise RequestError(
                    "1 validation error:\n  Input should be a valid dictionary", err_type="Bad Request"
                )
            pairs, answer = work(body)
        except orjson.JSONDecodeError as exc:
            await self.refuse(send, RequestError(f"JSON decode error: {exc}", err_type="Bad Request"))
            return
        except RequestError as err:
            await self.refuse(send, err)
            return
        tokens = [t for q, d in pairs for t in tokenizer.encode(q) + tokenizer.encode(d)]
        for q, d in pairs:
            n = len(tokenizer.encode(q)) + len(tokenizer.encode(d))
            if n > self.cfg.max_model_len:
                await self.refuse(send, self._too_long(n))
                return
        if not await self.prefill(receive, tokens):
            return
        await asgi.send_bytes(send, 200, orjson.dumps(answer(len(tokens))))

    def _too_long(self, n: int) -> RequestError:
        if self.cfg.engine == "vllm":
            return RequestError(
                f"This model's maximum context length is {self.cfg.max_model_len} tokens. However, you "
                f"requested {n} tokens in the input for scoring. Please reduce the length of the input."
            )
        return RequestError(
            f"The input ({n} tokens) is longer than the model's context length ({self.cfg.max_model_len} tokens)."
        )

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if self.cfg.engine == "vllm" and model is not None and model != self.cfg.served_model_name:
            raise RequestError(
                f"The model `{model}` does not exist.", status=404, param="model", err_type="NotFoundError"
            )

    # -- rerank -----------------------------------------------------------------------------------
    def _rerank(self, body: dict[str, Any]) -> tuple[list[tuple[str, str]], Any]:
        self._check_model(body)
        if self.cfg.engine == "sglang":
            return self._sglang_rerank(body)
        query = body.get("query")
        if not isinstance(query, str):
            raise RequestError("1 validation error:\n  query: Field required", err_type="Bad Request")
        docs = _texts(body.get("documents"), "documents")
        top_n = body.get("top_n", 0)
        if not isinstance(top_n, int) or top_n < 0:
            raise RequestError(
                "1 validation error:\n  top_n: Input should be greater than or equal to 0",
                err_type="Bad Request",
            )
        pairs = [(query, d) for d in docs]

        def answer(tokens: int) -> dict[str, Any]:
            order = sorted(range(len(docs)), key=lambda i: relevance(query, docs[i]), reverse=True)
            results = [
                {
                    "index": i,
                    "document": {"text": docs[i], "multi_modal": None},
                    "relevance_score": relevance(query, docs[i]),
                }
                for i in order
            ]
            if 0 < top_n < len(results):
                results = results[:top_n]
            return {
                "id": f"score-{hex_id()}",
                "model": self.cfg.served_model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                "results": results,
            }

        return pairs, answer

    def _sglang_rerank(self, body: dict[str, Any]) -> tuple[list[tuple[str, str]], Any]:
        if not self.cfg.reranker:
            raise RequestError(
                "This model does not appear to be an embedding model by default. Please add "
                "`--is-embedding` when launching the server or try another model."
            )
        query = body.get("query")
        docs = body.get("documents")
        if not query:
            raise RequestError("Query cannot be empty")
        if isinstance(query, str) and not query.strip():
            raise RequestError("Query cannot be empty or whitespace only")
        if not isinstance(docs, list) or not docs:
            raise RequestError("Documents cannot be empty")
        for d in docs:
            if not isinstance(d, str) or not d.strip():
                raise RequestError("Each document cannot be empty or whitespace only")
        top_n = body.get("top_n")
        if top_n is not None and (not isinstance(top_n, int) or top_n < 1):
            raise RequestError("Value error, parameter top_n should be larger than 0.")
        keep = body.get("return_documents", True) is not False
        text = str(query)
        pairs = [(text, str(d)) for d in docs]

        def answer(tokens: int) -> list[dict[str, Any]]:
            out = []
            for i, d in enumerate(docs):
                item: dict[str, Any] = {"score": relevance(text, d), "index": i}
                if keep:
                    item["document"] = d
                n = len(tokenizer.encode(text)) + len(tokenizer.encode(d))
                item["meta_info"] = {"id": hex_id(), "prompt_tokens": n, "weight_version": "default"}
                out.append(item)
            out.sort(key=lambda r: r["score"], reverse=True)
            return out[:top_n] if top_n is not None else out

        return pairs, answer

    # -- score ------------------------------------------------------------------------------------
    def _score(self, body: dict[str, Any]) -> tuple[list[tuple[str, str]], Any]:
        self._check_model(body)
        if self.cfg.engine == "sglang":
            return self._sglang_score(body)
        form = next((f for f in _PAIR_FORMS if f[0] in body and f[1] in body), None)
        if form is None:
            raise RequestError("1 validation error:\n  text_1: Field required", err_type="Bad Request")
        left, right = _texts(body[form[0]], form[0]), _texts(body[form[1]], form[1])
        if len(left) > 1 and len(left) != len(right):
            raise RequestError("Input lengths must be either 1:1, 1:N or N:N")
        if not left:
            raise RequestError("At least one text element must be given")
        if not right:
            raise RequestError("At least one text_pair element must be given")
        pairs = (
            list(zip(left * len(right), right, strict=True))
            if len(left) == 1
            else list(zip(left, right, strict=True))
        )
        created = int(time.time())

        def answer(tokens: int) -> dict[str, Any]:
            return {
                "id": f"score-{hex_id()}",
                "object": "list",
                "created": created,
                "model": self.cfg.served_model_name,
                "data": [
                    {"index": i, "object": "score", "score": relevance(q, d)}
                    for i, (q, d) in enumerate(pairs)
                ],
                "usage": {
                    "prompt_tokens": tokens,
                    "total_tokens": tokens,
                    "completion_tokens": 0,
                    "prompt_tokens_details": None,
                    "completion_tokens_details": None,
                },
            }

        return pairs, answer

    def _sglang_score(self, body: dict[str, Any]) -> tuple[list[tuple[str, str]], Any]:
        labels = body.get("label_token_ids")
        if not self.cfg.reranker and labels is None:
            raise RequestError("label_token_ids is required for generation (CausalLM) models.")
        items = body.get("items")
        if items is None:
            raise RequestError("items must be provided")
        query = body.get("query") or ""
        texts = _texts(items, "items")
        q = query if isinstance(query, str) else tokenizer.decode(list(query))
        pairs = [(q, t) for t in texts]

        def answer(tokens: int) -> dict[str, Any]:
            if labels is None:
                scores = [[relevance(q, t)] for t in texts]
            else:  # a generation model: each label token's probability after the pair
                scores = [
                    _label_probabilities(q, t, labels, body.get("apply_softmax") is True) for t in texts
                ]
            return {
                "scores": scores,
                "pooled_hidden_states": None,
                "token_logprobs": None,
                "model": body.get("model", "default"),
                "usage": {
                    "prompt_tokens": tokens,
                    "total_tokens": tokens,
                    "completion_tokens": 0,
                    "prompt_tokens_details": None,
                    "reasoning_tokens": 0,
                    "completion_tokens_details": None,
                },
                "object": "scoring",
            }

        return pairs, answer
