"""engines.embeddings: the upstream request per dialect, decoding both engines' answers, OpenAI's shape."""

from __future__ import annotations

import orjson
import pytest

from engines.base import Embeddings, Usage
from engines.decoding import decode_embeddings_body
from engines.embeddings import base64_to_floats, build_embeddings_request, encode_embeddings, floats_to_base64
from engines.errors import ApiError


def test_request_per_dialect() -> None:
    body = {"model": "public", "input": ["a"], "encoding_format": "base64", "dimensions": None, "rid": "x"}
    vllm = orjson.loads(build_embeddings_request(body, "served", "vllm"))
    assert vllm == {
        "model": "served",
        "input": ["a"],
        "encoding_format": "base64",
        "embed_dtype": "float32",
        "endianness": "little",
    }
    sglang = orjson.loads(build_embeddings_request(body, "served", "sglang"))
    assert sglang == {"model": "served", "input": ["a"], "encoding_format": "base64"}
    with pytest.raises(ApiError) as err:
        build_embeddings_request({"input": "a", "truncate_prompt_tokens": 5}, "s", "sglang")
    assert err.value.param == "truncate_prompt_tokens"
    with pytest.raises(ApiError):
        build_embeddings_request({"input": "a", "lora_path": "x"}, "s", "vllm")


def test_decoding_both_engines() -> None:
    vllm = (
        b'{"id":"embd-1","object":"list","created":1,"model":"s","data":[{"index":1,"object":"embedding",'
        b'"embedding":[0.5]},{"index":0,"object":"embedding","embedding":[0.25]}],"usage":{"prompt_tokens":3,'
        b'"total_tokens":3,"completion_tokens":0,"prompt_tokens_details":null}}'
    )
    got = decode_embeddings_body(vllm)
    assert got.vectors == [[0.25], [0.5]] and got.usage.prompt_tokens == 3
    sglang = b'{"data":[{"embedding":"AACAPw==","index":0,"object":"embedding"}],"model":"/p","object":"list","usage":{"prompt_tokens":2,"total_tokens":2,"completion_tokens":0,"prompt_tokens_details":null,"reasoning_tokens":0}}'
    assert decode_embeddings_body(sglang).vectors == ["AACAPw=="]
    with pytest.raises(ApiError) as err:
        decode_embeddings_body(b'{"object":"error","message":"boom","type":"BadRequest","code":400}')
    assert err.value.status == 400
    with pytest.raises(ApiError):
        decode_embeddings_body(b"[1]")


def test_openai_shape_and_conversion() -> None:
    result = Embeddings([[1.0, -2.0], floats_to_base64([0.5])], Usage(4))
    floats = orjson.loads(encode_embeddings(result, model="m", encoding_format="float"))
    assert floats == {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": [1.0, -2.0]},
            {"object": "embedding", "index": 1, "embedding": [0.5]},
        ],
        "model": "m",
        "usage": {"prompt_tokens": 4, "total_tokens": 4},
    }
    b64 = orjson.loads(encode_embeddings(result, model="m", encoding_format="base64"))
    assert [base64_to_floats(d["embedding"]) for d in b64["data"]] == [[1.0, -2.0], [0.5]]
    assert floats_to_base64([1.0]) == "AACAPw=="
