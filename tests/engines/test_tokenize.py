"""engines.tokenize: the upstream requests per dialect, both engines' answers, vLLM's shapes."""

from __future__ import annotations

import orjson
import pytest

from engines.errors import ApiError
from engines.sglang import DIALECT as SGLANG
from engines.tokenize import (
    Tokens,
    build_detokenize_request,
    build_tokenize_request,
    decode_text,
    decode_tokens,
    encode_text,
    encode_tokens,
)
from engines.vllm import DIALECT as VLLM


def test_tokenize_request_per_dialect() -> None:
    body = {"model": "public", "prompt": "hi", "add_special_tokens": None, "return_token_strs": True}
    assert orjson.loads(build_tokenize_request(body, "served", "vllm")) == {
        "model": "served",
        "prompt": "hi",
        "return_token_strs": True,
    }
    with pytest.raises(ApiError) as err:  # SGLang has no token strings
        build_tokenize_request(body, "served", "sglang")
    assert err.value.status == 400 and err.value.param == "return_token_strs"
    quiet = {"model": "public", "prompt": "hi", "return_token_strs": False}
    assert orjson.loads(build_tokenize_request(quiet, "s", "sglang")) == {"model": "s", "prompt": "hi"}


def test_detokenize_keeps_special_tokens_on_both() -> None:
    body = {"model": "public", "tokens": [1, 2]}
    assert orjson.loads(build_detokenize_request(body, "s", "vllm")) == {"model": "s", "tokens": [1, 2]}
    assert orjson.loads(build_detokenize_request(body, "s", "sglang")) == {
        "model": "s",
        "tokens": [1, 2],
        "skip_special_tokens": False,
    }
    asked = {**body, "skip_special_tokens": True}
    assert orjson.loads(build_detokenize_request(asked, "s", "sglang"))["skip_special_tokens"] is True
    with pytest.raises(ApiError) as err:
        build_detokenize_request(asked, "s", "vllm")
    assert err.value.param == "skip_special_tokens"
    kept = {**body, "skip_special_tokens": False}
    assert "skip_special_tokens" not in orjson.loads(build_detokenize_request(kept, "s", "vllm"))


def test_the_dialects_paths_and_builders() -> None:
    assert VLLM.paths["tokenize"] == "/tokenize" and SGLANG.paths["tokenize"] == "/v1/tokenize"
    assert VLLM.paths["detokenize"] == "/detokenize" and SGLANG.paths["detokenize"] == "/v1/detokenize"
    body = {"model": "public", "prompt": "hi"}
    assert orjson.loads(VLLM.build_request("tokenize", body, "s")) == {"model": "s", "prompt": "hi"}
    assert (
        orjson.loads(SGLANG.build_request("detokenize", {"tokens": [3]}, "s"))["skip_special_tokens"] is False
    )


def test_answers_of_both_engines_in_vllms_shape() -> None:
    vllm = b'{"count":2,"max_model_len":4096,"tokens":[5,6],"token_strs":["a","b"]}'
    sglang = b'{"tokens":[5,6],"count":2,"max_model_len":1000000000000000019884624838656}'
    assert decode_tokens(vllm) == Tokens([5, 6], ["a", "b"])
    assert decode_tokens(sglang) == Tokens([5, 6])
    assert orjson.loads(encode_tokens(decode_tokens(sglang), 8192)) == {
        "count": 2,
        "max_model_len": 8192,
        "tokens": [5, 6],
        "token_strs": None,
    }
    assert decode_text(b'{"prompt":"hi"}') == decode_text(b'{"text":"hi"}') == "hi"
    assert encode_text("hi") == b'{"prompt":"hi"}'


@pytest.mark.parametrize("data", [b"not json", b"[1]", b'{"tokens":["a"]}', b'{"count":1}', b'{"text":[1]}'])
def test_an_answer_of_another_shape_is_the_generic_upstream_error(data: bytes) -> None:
    with pytest.raises(ApiError) as err:
        decode_text(data) if b"text" in data else decode_tokens(data)
    assert err.value.status == 500 and "processing your request" in err.value.message
