"""Property checks every dialect must pass: whatever an engine sends, decoders raise only `ApiError`."""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.base import Delta, Dialect, Usage
from engines.errors import ApiError
from tests.support import examples

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=10),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=5),
    max_leaves=20,
)
_keys = st.sampled_from(
    [
        "choices",
        "usage",
        "error",
        "object",
        "delta",
        "message",
        "index",
        "tool_calls",
        "function",
        "content",
        "reasoning",
        "reasoning_content",
        "finish_reason",
        "logprobs",
        "text",
        "id",
        "name",
        "arguments",
        "prompt_tokens_details",
        "completion_tokens_details",
        "cached_tokens",
        "prompt_tokens",
        "code",
        "message",
    ]
)
# Shaped like a chunk, with arbitrary values in the places decoders look.
_shaped = st.recursive(
    _json,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(_keys, kids, max_size=6),
    max_leaves=30,
)


def check_dialect_robust(dialect: Dialect) -> None:
    @settings(max_examples=examples(300), deadline=None)
    @given(
        data=st.binary(max_size=64) | _shaped.map(orjson.dumps),
        endpoint=st.sampled_from(["chat", "completions"]),
    )
    def feed_never_raises(data: bytes, endpoint: Any) -> None:
        dec = dialect.stream_decoder(endpoint)
        for _ in range(2):
            for ev in dec.feed(data):
                assert isinstance(ev, (Delta, Usage, ApiError))

    @settings(max_examples=examples(300), deadline=None)
    @given(
        data=st.binary(max_size=64) | _shaped.map(orjson.dumps),
        endpoint=st.sampled_from(["chat", "completions"]),
    )
    def decode_response_raises_only_api_error(data: bytes, endpoint: Any) -> None:
        with contextlib.suppress(ApiError):
            dialect.decode_response(endpoint, data)

    @settings(max_examples=examples(200), deadline=None)
    @given(status=st.integers(100, 599), data=st.binary(max_size=64) | _shaped.map(orjson.dumps))
    def decode_error_never_raises(status: int, data: bytes) -> None:
        err = dialect.decode_error(status, data)
        assert 400 <= err.status <= 599
        assert set(orjson.loads(err.body())["error"]) == {"message", "type", "param", "code"}

    @settings(max_examples=examples(200), deadline=None)
    @given(text=st.text(max_size=300))
    def metrics_never_raise(text: str) -> None:
        dialect.parse_metrics(text)

    feed_never_raises()
    decode_response_raises_only_api_error()
    decode_error_never_raises()
    metrics_never_raise()
