"""engines.scoring: rerank and score requests per dialect, both engines' answers, vLLM's shapes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from engines.errors import ApiError
from engines.scoring import (
    Scores,
    build_rerank_request,
    build_score_request,
    decode_rerank,
    decode_score,
    encode_rerank,
    encode_score,
    pair_form,
)
from engines.sglang import DIALECT as SGLANG
from engines.vllm import DIALECT as VLLM


def _sent(data: bytes) -> dict[str, Any]:
    out = orjson.loads(data)
    assert isinstance(out, dict)
    return out


def test_rerank_request_per_dialect() -> None:
    body = {"model": "public", "query": "q", "documents": "d", "top_n": 2, "return_documents": False}
    assert _sent(build_rerank_request({**body, "instruct": "i"}, "s", "vllm")) == {
        "model": "s",
        "query": "q",
        "documents": "d",
        "instruction": "i",
    }
    assert _sent(build_rerank_request({**body, "instruction": "i"}, "s", "sglang")) == {
        "model": "s",
        "query": "q",
        "documents": ["d"],
        "return_documents": False,
        "instruct": "i",
    }
    vllm_only = {**body, "max_tokens_per_doc": 10, "request_id": "x"}
    assert _sent(build_rerank_request(vllm_only, "s", "vllm"))["max_tokens_per_doc"] == 10
    assert "request_id" not in _sent(build_rerank_request(vllm_only, "s", "vllm"))
    with pytest.raises(ApiError) as err:
        build_rerank_request(vllm_only, "s", "sglang")
    assert err.value.param == "max_tokens_per_doc"


@pytest.mark.parametrize(
    ("pair", "vllm", "sglang"),
    [
        ({"text_1": "q", "text_2": ["a", "b"]}, ("q", ["a", "b"]), ("q", ["a", "b"])),
        ({"queries": ["q"], "documents": "a"}, (["q"], "a"), ("q", ["a"])),
        ({"queries": "q", "items": ["a"]}, ("q", ["a"]), ("q", ["a"])),
        ({"data_1": "q", "data_2": "a"}, ("q", "a"), ("q", ["a"])),
        ({"query": "q", "items": ["a"]}, ("q", ["a"]), ("q", ["a"])),
    ],
)
def test_score_request_pair_forms(
    pair: dict[str, Any], vllm: tuple[Any, Any], sglang: tuple[Any, Any]
) -> None:
    assert pair_form(pair) is not None
    v = _sent(build_score_request({"model": "p", **pair}, "s", "vllm"))
    assert v == {"model": "s", "text_1": vllm[0], "text_2": vllm[1]}
    g = _sent(build_score_request({"model": "p", **pair}, "s", "sglang"))
    assert g == {"model": "s", "query": sglang[0], "items": sglang[1]}


def test_n_to_n_is_vllms_only() -> None:
    body = {"model": "p", "queries": ["a", "b"], "documents": ["c", "d"]}
    assert _sent(build_score_request(body, "s", "vllm"))["text_1"] == ["a", "b"]
    with pytest.raises(ApiError) as err:
        build_score_request(body, "s", "sglang")
    assert err.value.status == 400 and err.value.param == "queries"


def test_the_dialects_route_them() -> None:
    assert (VLLM.paths["rerank"], VLLM.paths["score"]) == ("/rerank", "/score")
    assert (SGLANG.paths["rerank"], SGLANG.paths["score"]) == ("/v1/rerank", "/v1/score")
    assert _sent(SGLANG.build_request("score", {"text_1": "q", "text_2": "a"}, "s"))["items"] == ["a"]


def test_rerank_answers_of_both_engines() -> None:
    vllm = (
        b'{"id":"score-1","model":"s","usage":{"prompt_tokens":9,"total_tokens":9},"results":['
        b'{"index":1,"document":{"text":"b","multi_modal":null},"relevance_score":0.9},'
        b'{"index":0,"document":{"text":"a","multi_modal":null},"relevance_score":0.1}]}'
    )
    assert decode_rerank(vllm) == Scores([(1, 0.9), (0, 0.1)], 9)
    sglang = (
        b'[{"score":0.9,"index":1,"meta_info":{"prompt_tokens":5}},'
        b'{"score":0.1,"index":0,"meta_info":{"prompt_tokens":4}}]'
    )
    assert decode_rerank(sglang) == Scores([(1, 0.9), (0, 0.1)], 9)
    unsaid = b'[{"score":0.9,"index":1},{"score":0.1,"index":0,"meta_info":{"prompt_tokens":4}}]'
    assert decode_rerank(unsaid).prompt_tokens is None


def test_rerank_in_vllms_shape() -> None:
    scores = Scores([(0, 0.5), (1, 0.9), (2, 0.5)])
    body = orjson.loads(
        encode_rerank(scores, ["a", "b", "c"], model="m", top_n=2, with_documents=True, tokens=7)
    )
    assert body["id"].startswith("rerank-") and body["model"] == "m"
    assert body["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert body["results"] == [  # best first, ties by index, top_n
        {"index": 1, "document": {"text": "b", "multi_modal": None}, "relevance_score": 0.9},
        {"index": 0, "document": {"text": "a", "multi_modal": None}, "relevance_score": 0.5},
    ]
    bare = orjson.loads(
        encode_rerank(scores, ["a", "b", "c"], model="m", top_n=0, with_documents=False, tokens=7)
    )
    assert bare["results"][2] == {"index": 2, "relevance_score": 0.5}
    with pytest.raises(ApiError):  # an engine that skipped a document
        encode_rerank(Scores([(0, 0.5)]), ["a", "b"], model="m", top_n=0, with_documents=True, tokens=1)


def test_score_answers_of_both_engines_in_vllms_shape() -> None:
    vllm = (
        b'{"id":"score-1","object":"list","created":1,"model":"s","data":[{"index":0,"object":"score","score":0.25},'
        b'{"index":1,"object":"score","score":0.75}],"usage":{"prompt_tokens":6,"total_tokens":6}}'
    )
    sglang = b'{"scores":[[0.25],[0.75]],"model":"s","usage":{"prompt_tokens":6,"total_tokens":6},"object":"scoring"}'
    assert decode_score(vllm) == decode_score(sglang) == Scores([(0, 0.25), (1, 0.75)], 6)
    body = orjson.loads(encode_score(decode_score(sglang), 2, model="m", tokens=6))
    assert body["object"] == "list" and body["model"] == "m" and isinstance(body["created"], int)
    assert body["data"] == [
        {"index": 0, "object": "score", "score": 0.25},
        {"index": 1, "object": "score", "score": 0.75},
    ]
    assert body["usage"]["completion_tokens"] == 0


@pytest.mark.parametrize(
    "data",
    [
        b"nope",
        b"{}",
        b'{"results":[{"index":"0","relevance_score":1}]}',
        b'[{"index":0}]',
        b'{"scores":[[]]}',
    ],
)
def test_other_shapes_are_the_generic_upstream_error(data: bytes) -> None:
    with pytest.raises(ApiError) as err:
        decode_score(data) if b"scores" in data else decode_rerank(data)
    assert err.value.status == 500
