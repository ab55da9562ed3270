"""The simulators' rerank and score, in each engine's dialect (real simulator processes)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engines.sim import tokenizer
from engines.sim.scoring import relevance
from tests.conftest import fast_sim
from tests.support import HTTP

pytestmark = pytest.mark.processes

QUERY = "What is the capital of France?"
DOCS = ["Berlin is the capital of Germany.", "Paris is the capital of France.", "Bananas are yellow."]


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, str]]:
    with (
        fast_sim("vllm", "--reranker", "--model", "rr") as v,
        fast_sim("sglang", "--reranker", "--model", "rr") as s,
        fast_sim("vllm") as plain_v,
        fast_sim("sglang") as plain_s,
    ):
        yield {
            "vllm": v.base_url,
            "sglang": s.base_url,
            "plain_vllm": plain_v.base_url,
            "plain_sglang": plain_s.base_url,
        }


def _post(url: str, body: dict[str, Any]) -> httpx.Response:
    return HTTP.post(url, json=body, timeout=10)


def _tokens(*texts: str) -> int:
    return sum(len(tokenizer.encode(t)) for t in texts)


def test_the_score_ranks_the_answer_first_and_is_deterministic() -> None:
    scores = [relevance(QUERY, d) for d in DOCS]
    assert scores[1] > scores[0] > scores[2] and all(0 <= s < 1 for s in scores)
    assert scores == [relevance(QUERY, d) for d in DOCS]


def test_vllm_rerank(sims: dict[str, str]) -> None:
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        r = _post(sims["vllm"] + path, {"model": "rr", "query": QUERY, "documents": DOCS, "top_n": 2})
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"id", "model", "usage", "results"} and body["id"].startswith("score-")
        assert [x["index"] for x in body["results"]] == [1, 0]
        assert body["results"][0] == {
            "index": 1,
            "document": {"text": DOCS[1], "multi_modal": None},
            "relevance_score": relevance(QUERY, DOCS[1]),
        }
        n = sum(_tokens(QUERY, d) for d in DOCS)
        assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}


def test_sglang_rerank(sims: dict[str, str]) -> None:
    r = _post(sims["sglang"] + "/v1/rerank", {"query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body, list) and [x["index"] for x in body] == [1, 0, 2]
    assert body[0]["score"] == relevance(QUERY, DOCS[1]) and body[0]["document"] == DOCS[1]
    assert body[0]["meta_info"]["prompt_tokens"] == _tokens(QUERY, DOCS[1])
    quiet = _post(
        sims["sglang"] + "/v1/rerank",
        {"query": QUERY, "documents": DOCS, "top_n": 1, "return_documents": False},
    )
    assert [set(x) for x in quiet.json()] == [{"score", "index", "meta_info"}]


def test_vllm_score_pairs(sims: dict[str, str]) -> None:
    one_to_n = _post(sims["vllm"] + "/score", {"text_1": QUERY, "text_2": DOCS}).json()
    assert one_to_n["object"] == "list" and one_to_n["id"].startswith("score-")
    assert [d["score"] for d in one_to_n["data"]] == [relevance(QUERY, d) for d in DOCS]
    assert one_to_n["data"][0] == {"index": 0, "object": "score", "score": relevance(QUERY, DOCS[0])}
    assert one_to_n["usage"]["completion_tokens"] == 0
    n_to_n = _post(sims["vllm"] + "/v1/score", {"queries": DOCS, "documents": DOCS}).json()
    assert [d["score"] for d in n_to_n["data"]] == [relevance(d, d) for d in DOCS]
    r = _post(sims["vllm"] + "/score", {"text_1": DOCS[:2], "text_2": DOCS})
    assert r.status_code == 400 and "1:1, 1:N or N:N" in r.json()["error"]["message"]


def test_sglang_score(sims: dict[str, str]) -> None:
    body = _post(sims["sglang"] + "/v1/score", {"query": QUERY, "items": DOCS}).json()
    assert body["object"] == "scoring" and body["scores"] == [[relevance(QUERY, d)] for d in DOCS]
    assert body["usage"]["prompt_tokens"] == sum(_tokens(QUERY, d) for d in DOCS)
    # a generation model scores label tokens, and needs them
    r = _post(sims["plain_sglang"] + "/v1/score", {"query": QUERY, "items": DOCS})
    assert (
        r.status_code == 400
        and r.json()["message"] == "label_token_ids is required for generation (CausalLM) models."
    )
    labels = _post(
        sims["plain_sglang"] + "/v1/score",
        {"query": QUERY, "items": DOCS, "label_token_ids": [5, 6], "apply_softmax": True},
    )
    assert all(len(row) == 2 and abs(sum(row) - 1) < 1e-5 for row in labels.json()["scores"])


def test_without_a_reranker(sims: dict[str, str]) -> None:
    for path in ("/rerank", "/score"):
        assert _post(sims["plain_vllm"] + path, {"query": QUERY, "documents": DOCS}).status_code == 404
    r = _post(sims["plain_sglang"] + "/v1/rerank", {"query": QUERY, "documents": DOCS})
    assert r.status_code == 400 and "embedding model" in r.json()["message"]
    assert (
        _post(sims["vllm"] + "/rerank", {"model": "other", "query": QUERY, "documents": DOCS}).status_code
        == 404
    )
