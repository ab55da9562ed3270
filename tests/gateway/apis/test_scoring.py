"""`/v1/rerank` (and `/rerank`) and `/v1/score` through a gateway, over both engines' reranker
simulators: vLLM's shapes from either engine, texts alone, admitted, limited and metered."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from engines.sim import tokenizer
from engines.sim.scoring import relevance
from tests.conftest import MODEL
from tests.gateway.apis.conftest import RERANK_MODEL, TIGHT_TOKENS_PER_MINUTE, EngineRig

pytestmark = pytest.mark.processes

QUERY = "What is the capital of France?"
DOCS = ["Berlin is the capital of Germany.", "Paris is the capital of France.", "Bananas are yellow."]


def _pair_tokens(query: str, docs: list[str]) -> int:
    return sum(len(tokenizer.encode(query)) + len(tokenizer.encode(d)) for d in docs)


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_rerank(engine_rig: EngineRig, path: str) -> None:
    r = engine_rig.post(path, {"model": RERANK_MODEL, "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-pool"] == f"{engine_rig.engine}-rerank"
    body = r.json()
    assert set(body) == {"id", "model", "usage", "results"}
    assert body["id"].startswith("rerank-") and body["model"] == RERANK_MODEL
    assert [x["index"] for x in body["results"]] == [1, 0, 2]
    assert body["results"][0] == {
        "index": 1,
        "document": {"text": DOCS[1], "multi_modal": None},
        "relevance_score": relevance(QUERY, DOCS[1]),
    }
    n = _pair_tokens(QUERY, DOCS)  # the engine's count (SGLang's: summed from each pair's meta_info)
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}


def test_rerank_top_n_and_without_documents(engine_rig: EngineRig) -> None:
    body = {"model": RERANK_MODEL, "query": QUERY, "documents": DOCS, "top_n": 1, "return_documents": False}
    r = engine_rig.post("/v1/rerank", body)
    assert r.status_code == 200, r.text
    assert r.json()["results"] == [{"index": 1, "relevance_score": relevance(QUERY, DOCS[1])}]
    one = engine_rig.post("/v1/rerank", {"model": RERANK_MODEL, "query": QUERY, "documents": DOCS[1]})
    assert [x["index"] for x in one.json()["results"]] == [0]  # a single document, as vLLM takes it


def test_rerank_instruction_in_each_engines_spelling(engine_rig: EngineRig) -> None:
    for key in ("instruction", "instruct"):
        body = {"model": RERANK_MODEL, "query": QUERY, "documents": DOCS, key: "Find the capital."}
        assert engine_rig.post("/v1/rerank", body).status_code == 200


@pytest.mark.parametrize(
    ("pair", "expected"),
    [
        ({"text_1": QUERY, "text_2": DOCS}, [(QUERY, d) for d in DOCS]),
        ({"queries": [QUERY], "documents": DOCS}, [(QUERY, d) for d in DOCS]),
        ({"query": QUERY, "items": DOCS}, [(QUERY, d) for d in DOCS]),  # SGLang's names
        ({"data_1": QUERY, "data_2": DOCS[1]}, [(QUERY, DOCS[1])]),
    ],
)
def test_score(engine_rig: EngineRig, pair: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    r = engine_rig.post("/v1/score", {"model": RERANK_MODEL, **pair})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["id"].startswith("score-") and body["model"] == RERANK_MODEL
    assert body["data"] == [
        {"index": i, "object": "score", "score": relevance(q, d)} for i, (q, d) in enumerate(expected)
    ]
    n = sum(len(tokenizer.encode(q)) + len(tokenizer.encode(d)) for q, d in expected)
    assert body["usage"] == {
        "prompt_tokens": n,
        "total_tokens": n,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def test_score_n_to_n(engine_rig: EngineRig) -> None:
    r = engine_rig.post("/v1/score", {"model": RERANK_MODEL, "text_1": DOCS, "text_2": DOCS})
    if engine_rig.engine == "vllm":
        assert r.status_code == 200 and [d["score"] for d in r.json()["data"]] == [
            relevance(d, d) for d in DOCS
        ]
    else:  # SGLang scores one text against many
        assert r.status_code == 400 and r.json()["error"]["param"] == "text_1"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/rerank", {"model": RERANK_MODEL, "documents": DOCS}, "query"),
        ("/v1/rerank", {"model": RERANK_MODEL, "query": "  ", "documents": DOCS}, "query"),
        ("/v1/rerank", {"model": RERANK_MODEL, "query": QUERY, "documents": []}, "documents"),
        ("/v1/rerank", {"model": RERANK_MODEL, "query": QUERY, "documents": ["a", ""]}, "documents[1]"),
        (
            "/v1/rerank",
            {
                "model": RERANK_MODEL,
                "query": QUERY,
                "documents": [{"content": [{"type": "text", "text": "x"}]}],
            },
            "documents[0]",
        ),
        ("/v1/rerank", {"model": RERANK_MODEL, "query": QUERY, "documents": DOCS, "top_n": -1}, "top_n"),
        ("/v1/rerank", {"model": RERANK_MODEL, "query": QUERY, "documents": ["word " * 600]}, "documents[0]"),
        ("/v1/rerank", {"model": MODEL, "query": QUERY, "documents": DOCS}, "model"),
        ("/v1/score", {"model": RERANK_MODEL, "text_1": QUERY}, "text_1"),
        ("/v1/score", {"model": RERANK_MODEL, "text_1": DOCS[:2], "text_2": DOCS}, "text_2"),
        ("/v1/score", {"model": RERANK_MODEL, "text_1": QUERY, "text_2": DOCS, "items": DOCS}, "items"),
        (
            "/v1/score",
            {"model": RERANK_MODEL, "query": QUERY, "items": DOCS, "label_token_ids": [1]},
            "label_token_ids",
        ),
    ],
)
def test_refused_alike_for_both_engines(
    engine_rig: EngineRig, path: str, body: dict[str, Any], param: str
) -> None:
    r = engine_rig.post(path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"


def test_a_chat_model_or_an_unknown_one(engine_rig: EngineRig) -> None:
    r = engine_rig.post("/v1/score", {"model": "no-such", "text_1": "a", "text_2": "b"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = engine_rig.post(
        "/v1/chat/completions", {"model": RERANK_MODEL, "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 400 and "scoring model" in r.json()["error"]["message"]
    tokens = engine_rig.post("/tokenize", {"model": RERANK_MODEL, "prompt": QUERY})
    assert tokens.status_code == 200  # the tokenizer takes a model of any task


def test_limited_by_the_pairs_tokens(engine_rig: EngineRig) -> None:
    small = engine_rig.post(
        "/v1/rerank", {"model": RERANK_MODEL, "query": "a b", "documents": ["c"]}, user=engine_rig.tight
    )
    assert small.status_code == 200, small.text
    assert small.headers["x-ratelimit-limit-tokens"] == str(TIGHT_TOKENS_PER_MINUTE)
    # the query counts once per document: 40 pairs of ~40 tokens is over the tier's minute
    big = {"model": RERANK_MODEL, "query": "word " * 30, "documents": ["doc " * 10] * 40}
    r = engine_rig.post("/v1/rerank", big, user=engine_rig.tight)
    assert r.status_code == 429 and r.json()["error"]["type"] == "tokens"


def test_metered_under_their_own_endpoints(engine_rig: EngineRig) -> None:
    engine_rig.post("/v1/rerank", {"model": RERANK_MODEL, "query": QUERY, "documents": DOCS})
    engine_rig.post("/v1/score", {"model": RERANK_MODEL, "text_1": QUERY, "text_2": DOCS})
    text = httpx.get(engine_rig.base_url + "/metrics", trust_env=False).text
    pool = f"{engine_rig.engine}-rerank"
    for endpoint in ("rerank", "score"):
        line = f'gateway_requests_total{{endpoint="{endpoint}",model="{RERANK_MODEL}",pool="{pool}",status="200"}}'
        assert line in text
