"""Micro-benchmark of the dialect adapters: µs per streamed chunk (decode + encode) per engine, and
µs per non-streamed body (decode + encode). Run: `.venv/bin/python -m bench.adapters`."""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson

from engines.base import Dialect
from engines.openai import StreamEncoder, encode_completion, new_completion_id, new_tool_call_id
from engines.registry import get_dialect
from engines.validate import validate_request

_WORDS = [" the", " model", " answers", " questions", " about", " data", ",", " and", " systems", "."]


def vllm_chunk(i: int) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-9f2c",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "served-llama",
            "choices": [
                {"index": 0, "delta": {"content": _WORDS[i % 10]}, "logprobs": None, "finish_reason": None}
            ],
        }
    )


def sglang_chunk(i: int) -> bytes:
    return orjson.dumps(
        {
            "id": "5c1e8fdd0a8e4a7c",
            "object": "chat.completion.chunk",
            "created": 1700000001,
            "model": "default",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "role": None,
                        "content": _WORDS[i % 10],
                        "reasoning_content": None,
                        "tool_calls": None,
                    },
                    "logprobs": None,
                    "finish_reason": None,
                    "matched_stop": None,
                }
            ],
            "usage": None,
        }
    )


def bench(label: str, fn: Callable[[], None], n: int) -> float:
    fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    print(f"{label:<52} {best:8.2f} µs")
    return best


def stream(dialect: Dialect, chunks: list[bytes]) -> Callable[[], None]:
    def run() -> None:
        dec = dialect.stream_decoder("chat")
        enc = StreamEncoder(
            endpoint="chat",
            id="chatcmpl-x",
            created=1,
            model="m",
            include_usage=True,
            tool_choice_named=False,
        )
        for c in chunks:
            enc.encode(dec.feed(c))
        enc.finish()

    return run


def main() -> None:
    n_chunks = 256
    print(f"streamed chunk = decode + encode, per chunk ({n_chunks}-chunk streams, best of 5)")
    for name, make in (("vllm", vllm_chunk), ("sglang", sglang_chunk)):
        chunks = [make(i) for i in range(n_chunks)]
        t = bench(f"  {name}: one {n_chunks}-chunk stream", stream(get_dialect(name), chunks), 200)
        print(f"  {name}: per chunk{'':<37} {t / n_chunks:8.2f} µs")
    print("non-streamed body = decode + encode")
    from tests.engines.payloads import BODIES  # literal engine bodies

    for sc in BODIES[:2]:
        for name, raw in (("vllm", sc.vllm), ("sglang", sc.sglang)):
            d = get_dialect(name)

            def body(d: Dialect = d, raw: bytes = raw) -> None:
                encode_completion(
                    d.decode_response("chat", raw),
                    endpoint="chat",
                    id="chatcmpl-x",
                    created=1,
                    model="m",
                    tool_choice_named=False,
                )

            bench(f"  {name}: {sc.name} body", body, 20000)
    req = {
        "model": "m",
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.7,
        "max_tokens": 64,
    }
    bench("validate_request (chat, 2 messages)", lambda: validate_request("chat", req), 50000)
    for name in ("vllm", "sglang"):
        d = get_dialect(name)
        bench(f"  {name}: build_request", lambda d=d: d.build_request("chat", req, "served"), 50000)  # type: ignore[misc]
    bench("new_completion_id", lambda: new_completion_id("chat"), 100000)
    bench("new_tool_call_id", lambda: new_tool_call_id(), 100000)


if __name__ == "__main__":
    main()
