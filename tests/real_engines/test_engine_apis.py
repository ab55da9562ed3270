"""The engines' own APIs through the gateway, against the real vLLM 0.32 and SGLang 0.5.23 servers.

Tokenize and detokenize on the servers every real-engine test shares (the tiny model): the gateway's
answer is each engine's own tokenization in vLLM's shape, and detokenizing keeps the special tokens
on both (SGLang drops them unless told not to). Rerank and score on a cross-encoder of the tiny model
(`build_reranker.py`), one server per engine started here: vLLM serves it as a pooling model, SGLang
with `--is-embedding`. Their weights are random, so the tests compare the gateway's answer with the
engine's own: order, indexes, token counts; each engine's scores are its own (vLLM applies the
model's sigmoid, SGLang gives the raw logit: docs/engines.md). Speech to text is not here: neither CPU
build serves a Whisper model without downloading one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import MODEL
from tests.real_engines.conftest import SERVED_MODEL
from tests.real_engines.rig import ENGINE_KEY, real_pool_config
from tests.real_engines.servers import (
    ENGINES_DIR,
    EngineServer,
    SglangServer,
    VllmServer,
    build_tiny_model,
    build_tiny_reranker,
)
from tests.support import GatewayProcess

pytestmark = [
    pytest.mark.processes,
    pytest.mark.timeout(300),
]  # the first test may wait for a server's startup

TEXT = "The quick brown fox jumps over the lazy dog."
QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital of France.", "Bananas are yellow.", "Berlin is in Germany."]
RERANK_MODEL = "tiny-rerank"


def _post(
    base: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> httpx.Response:
    return httpx.post(base + path, json=body, headers=headers, timeout=60, trust_env=False)


def _own(engine: EngineServer, path: str, body: dict[str, Any]) -> Any:
    """The engine's own answer, asked directly (with its `--api-key`)."""
    return _post(engine.base_url, path, body, engine.headers).json()


@pytest.fixture(scope="module")
def gateway(real_engine: EngineServer) -> Iterator[tuple[GatewayProcess, EngineServer]]:
    config = real_pool_config(real_engine.engine, [real_engine.base_url], SERVED_MODEL)
    with GatewayProcess(config) as gw:
        yield gw, real_engine


def test_tokenize_is_the_engines_own(gateway: tuple[GatewayProcess, EngineServer]) -> None:
    gw, engine = gateway
    own = _own(engine, "/tokenize", {"model": SERVED_MODEL, "prompt": TEXT})
    r = _post(gw.base_url, "/tokenize", {"model": MODEL, "prompt": TEXT})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "count": own["count"],
        "max_model_len": 4096,
        "tokens": own["tokens"],
        "token_strs": None,
    }
    chat = {"model": MODEL, "messages": [{"role": "user", "content": TEXT}]}
    via = _post(gw.base_url, "/v1/tokenize", chat).json()
    assert via["tokens"] == _own(engine, "/tokenize", {**chat, "model": SERVED_MODEL})["tokens"]
    assert via["count"] > own["count"]
    strs = _post(gw.base_url, "/tokenize", {"model": MODEL, "prompt": TEXT, "return_token_strs": True})
    if engine.engine == "vllm":
        assert strs.status_code == 200 and len(strs.json()["token_strs"]) == own["count"]
    else:
        assert strs.status_code == 400 and strs.json()["error"]["param"] == "return_token_strs"


def test_detokenize_keeps_special_tokens_on_both(gateway: tuple[GatewayProcess, EngineServer]) -> None:
    gw, _ = gateway
    chat = {"model": MODEL, "messages": [{"role": "user", "content": TEXT}]}
    ids = _post(gw.base_url, "/tokenize", chat).json()["tokens"]
    r = _post(gw.base_url, "/detokenize", {"model": MODEL, "tokens": ids})
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": f"<|im_start|>user\n{TEXT}<|im_end|>\n<|im_start|>assistant\n"}
    text_ids = _post(gw.base_url, "/tokenize", {"model": MODEL, "prompt": TEXT}).json()["tokens"]
    assert _post(gw.base_url, "/v1/detokenize", {"model": MODEL, "tokens": text_ids}).json() == {
        "prompt": TEXT
    }


def test_an_unknown_model_never_reaches_the_engine(gateway: tuple[GatewayProcess, EngineServer]) -> None:
    gw, _ = gateway  # SGLang would tokenize for any model name
    r = _post(gw.base_url, "/tokenize", {"model": "other", "prompt": TEXT})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def reranker(request: pytest.FixtureRequest) -> Iterator[tuple[GatewayProcess, EngineServer]]:
    """A real server of the tiny cross-encoder, and a gateway whose model `tiny-rerank` it serves."""
    engine = str(request.param)
    model = build_tiny_reranker(build_tiny_model())
    logs = ENGINES_DIR / "logs" / "reranker"
    server: EngineServer = (
        VllmServer(model, served_model_name=RERANK_MODEL, log_dir=logs, api_key=ENGINE_KEY)
        if engine == "vllm"
        else SglangServer(
            model, served_model_name=RERANK_MODEL, log_dir=logs, api_key=ENGINE_KEY, extra=["--is-embedding"]
        )
    )
    with server:
        config = real_pool_config(engine, [server.base_url], RERANK_MODEL)
        config["models"] = [{"name": RERANK_MODEL, "task": "score", "context_length": 4096}]
        config["pools"][0]["models"] = {RERANK_MODEL: RERANK_MODEL}
        with GatewayProcess(config) as gw:
            yield gw, server


def _own_scores(engine: EngineServer, query: str, docs: list[str]) -> tuple[list[float], int]:
    """The engine's own score of each (query, document), and the prompt tokens it counted."""
    if engine.engine == "vllm":
        own = _own(engine, "/score", {"model": RERANK_MODEL, "text_1": query, "text_2": docs})
        return [d["score"] for d in own["data"]], own["usage"]["prompt_tokens"]
    own = _own(engine, "/v1/score", {"model": RERANK_MODEL, "query": query, "items": docs})
    return [row[0] for row in own["scores"]], own["usage"]["prompt_tokens"]


def test_rerank_is_the_engines_order_in_vllms_shape(reranker: tuple[GatewayProcess, EngineServer]) -> None:
    gw, engine = reranker
    scores, tokens = _own_scores(engine, QUERY, DOCS)
    r = _post(
        gw.base_url, "/v1/rerank", {"model": RERANK_MODEL, "query": QUERY, "documents": DOCS, "top_n": 2}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "model", "usage", "results"} and body["model"] == RERANK_MODEL
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    ranked = sorted(range(len(DOCS)), key=lambda i: (-scores[i], i))[:2]
    assert [x["index"] for x in body["results"]] == ranked
    for x in body["results"]:
        assert x["document"] == {"text": DOCS[x["index"]], "multi_modal": None}
        assert math.isclose(x["relevance_score"], scores[x["index"]], abs_tol=1e-6)


def test_score_in_vllms_shape(reranker: tuple[GatewayProcess, EngineServer]) -> None:
    gw, engine = reranker
    scores, tokens = _own_scores(engine, QUERY, DOCS)
    r = _post(gw.base_url, "/v1/score", {"model": RERANK_MODEL, "text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["usage"]["prompt_tokens"] == tokens
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(math.isclose(d["score"], s, abs_tol=1e-6) for d, s in zip(body["data"], scores, strict=True))
    n_to_n = _post(gw.base_url, "/v1/score", {"model": RERANK_MODEL, "text_1": DOCS, "text_2": DOCS})
    assert n_to_n.status_code == (200 if engine.engine == "vllm" else 400), n_to_n.text


def test_a_cross_encoder_path_the_engine_serves_under_every_client_path(
    reranker: tuple[GatewayProcess, EngineServer],
) -> None:
    gw, _ = reranker  # vLLM serves /rerank and /score, SGLang /v1/rerank and /v1/score
    body = {"model": RERANK_MODEL, "query": QUERY, "documents": DOCS}
    assert _post(gw.base_url, "/rerank", body).status_code == 200
    assert (
        _post(
            gw.base_url, "/v1/score", {"model": RERANK_MODEL, "queries": [QUERY], "items": DOCS}
        ).status_code
        == 200
    )
