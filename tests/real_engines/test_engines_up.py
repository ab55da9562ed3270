"""The real vLLM and SGLang servers come up and speak their own HTTP APIs: chat (whole and streamed),
`/v1/models`, `/metrics`, the prefix cache, and vLLM's KV-cache events over ZMQ.

The model has random weights, so its *text* is noise: nothing here asserts what it says (no wording,
no stop at a sensible place, no valid tool arguments unless a grammar forces them). What is asserted is
what the servers do whatever the weights: shapes, statuses, token accounting (`ignore_eos` makes the
completion length exact), streaming framing, metrics, cache hits and the events.
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engines.sim.block_hashes import SglangBlockHasher
from tests.real_engines.rig import kv_event_batches
from tests.real_engines.servers import EngineServer, SglangServer, VllmServer
from tests.support import HTTP, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.timeout(300),
]  # the first test may wait for a server's startup

RUNNING_METRIC = {"vllm": "vllm:num_requests_running", "sglang": "sglang:num_running_reqs"}
GENERATED_METRIC = {"vllm": "vllm:generation_tokens_total", "sglang": "sglang:generation_tokens_total"}
MAX_TOKENS = 8


def chat(server: EngineServer, content: str, **extra: Any) -> httpx.Response:
    body = {
        "model": server.served_model_name,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": MAX_TOKENS,
        # Random weights may pick the end-of-turn token at any step; ignore_eos makes the length exact.
        "ignore_eos": True,
        **extra,
    }
    return HTTP.post(server.base_url + "/v1/chat/completions", json=body, headers=server.headers, timeout=60)


def metric(text: str, name: str, model: str) -> float:
    """The sum of a metric's samples for `model` (several label sets may exist, e.g. per cache source)."""
    pattern = re.compile(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", re.MULTILINE)
    values = [float(v) for labels, v in pattern.findall(text) if f'model_name="{model}"' in labels]
    assert values, f"{name} for model {model} not in /metrics"
    return sum(values)


def scrape(server: EngineServer) -> str:
    response = HTTP.get(server.base_url + "/metrics", timeout=10)
    assert response.status_code == 200
    return response.text


def test_models_lists_the_served_name(real_engine: EngineServer) -> None:
    response = HTTP.get(real_engine.base_url + "/v1/models", headers=real_engine.headers, timeout=10)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [real_engine.served_model_name]
    assert body["data"][0]["object"] == "model"


def test_chat_answers_with_exact_usage(real_engine: EngineServer) -> None:
    response = chat(real_engine, "Say something.")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == real_engine.served_model_name
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)  # its words are random
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == MAX_TOKENS
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_same_prompt_same_prompt_tokens_on_both(real_vllm: VllmServer, real_sglang: SglangServer) -> None:
    """One tokenizer and one chat template, rendered by each engine: the same prompt length."""
    counts = {
        s.engine: chat(s, "How many tokens is this?").json()["usage"]["prompt_tokens"]
        for s in (real_vllm, real_sglang)
    }
    assert counts["vllm"] == counts["sglang"], counts


def test_chat_streams_sse(real_engine: EngineServer) -> None:
    body = {
        "model": real_engine.served_model_name,
        "messages": [{"role": "user", "content": "Stream something."}],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events: list[str] = []
    url = real_engine.base_url + "/v1/chat/completions"
    with HTTP.stream("POST", url, json=body, headers=real_engine.headers, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line:
                assert line.startswith("data: "), line
                events.append(line.removeprefix("data: "))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    with_choices = [c for c in chunks if c["choices"]]
    assert with_choices[0]["choices"][0]["delta"]["role"] == "assistant"
    finishes = [c["choices"][0]["finish_reason"] for c in with_choices if c["choices"][0]["finish_reason"]]
    assert finishes == ["length"]
    pieces = [c["choices"][0]["delta"].get("content") or "" for c in with_choices]
    assert 1 <= sum(1 for p in pieces if p) <= MAX_TOKENS  # one piece per token at most
    usage_chunks = [c for c in chunks if not c["choices"]]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1]
    assert usage_chunks[0]["usage"]["completion_tokens"] == MAX_TOKENS


def test_metrics_count_running_and_generated(real_engine: EngineServer) -> None:
    model = real_engine.served_model_name
    before = scrape(real_engine)
    assert metric(before, RUNNING_METRIC[real_engine.engine], model) >= 0
    generated = metric(before, GENERATED_METRIC[real_engine.engine], model)
    assert chat(real_engine, "Count my tokens.").status_code == 200
    wait_until(  # SGLang refreshes its counters when it logs stats
        lambda: (
            metric(scrape(real_engine), GENERATED_METRIC[real_engine.engine], model) >= generated + MAX_TOKENS
        ),
        timeout=15,
        what="generation_tokens_total to count the request",
    )
    assert metric(scrape(real_engine), RUNNING_METRIC[real_engine.engine], model) == 0  # idle again


def test_repeated_prompt_hits_the_prefix_cache(real_engine: EngineServer) -> None:
    # ~600 tokens (many vLLM blocks of 32), unique per run so earlier runs' cache entries do not count.
    prompt = f"{uuid.uuid4()} " + " ".join(f"cache block {i} of the repeated prompt." for i in range(80))
    first = chat(real_engine, prompt)
    assert first.status_code == 200
    model = real_engine.served_model_name
    if real_engine.engine == "vllm":
        hits_before = metric(scrape(real_engine), "vllm:prefix_cache_hits_total", model)
        second = chat(real_engine, prompt).json()["usage"]
        cached = second["prompt_tokens_details"]["cached_tokens"]  # --enable-prompt-tokens-details
        # Whole blocks of 32, all but the block holding the last prompt token (it is recomputed).
        assert cached % 32 == 0 and second["prompt_tokens"] - 32 <= cached < second["prompt_tokens"]

        def hits() -> float:
            return metric(scrape(real_engine), "vllm:prefix_cache_hits_total", model) - hits_before

        assert wait_until(hits, timeout=15, what="vllm:prefix_cache_hits_total to move") == cached
    else:
        cached_before = metric(scrape(real_engine), "sglang:cached_tokens_total", model)
        second = chat(real_engine, prompt).json()["usage"]

        def moved() -> float:
            return metric(scrape(real_engine), "sglang:cached_tokens_total", model) - cached_before

        cached = wait_until(moved, timeout=15, what="sglang:cached_tokens_total to move")
        # The radix cache (page size 1) reuses all but the last prompt token.
        assert second["prompt_tokens"] - 2 <= cached < second["prompt_tokens"]


def test_vllm_publishes_kv_cache_events(real_vllm: VllmServer) -> None:
    prompt = f"{uuid.uuid4()} " + " ".join(f"event block {i}." for i in range(40))
    tokenized = HTTP.post(
        real_vllm.base_url + "/tokenize",
        json={"model": real_vllm.served_model_name, "messages": [{"role": "user", "content": prompt}]},
        headers=real_vllm.headers,
        timeout=10,
    ).json()
    prompt_ids: list[int] = tokenized["tokens"]
    full_blocks = len(prompt_ids) // 32
    assert full_blocks >= 3
    stored: list[dict[str, Any]] = []
    seqs: list[int] = []
    for events in batches(real_vllm, prompt, seqs):
        stored += [
            e for e in events if e["type"] == "BlockStored" and e["token_ids"][:32] in _blocks(prompt_ids)
        ]
        if sum(len(e["token_ids"]) for e in stored) >= full_blocks * 32:
            break
    else:
        pytest.fail(f"no BlockStored for the prompt's blocks; got {stored}")
    assert seqs == sorted(seqs)
    assert all(e["block_size"] == 32 for e in stored)
    assert all(len(e["block_hashes"]) * 32 == len(e["token_ids"]) for e in stored)
    # The stored blocks are exactly the prompt's full blocks, in order (the last partial one is not).
    tokens = [t for e in stored for t in e["token_ids"]]
    assert tokens[: full_blocks * 32] == prompt_ids[: full_blocks * 32]


def _blocks(ids: list[int]) -> list[list[int]]:
    return [ids[i : i + 32] for i in range(0, len(ids) - 31, 32)]


def batches(server: EngineServer, prompt: str, seqs: list[int], timeout: float = 10) -> Iterator[list[Any]]:
    """`server`'s KV events (`rig.kv_event_batches`) after `prompt` is sent to it as a chat."""

    def send() -> None:
        assert chat(server, prompt).status_code == 200

    return kv_event_batches(server.kv_events_endpoint, send, seqs, timeout)


def test_sglang_publishes_kv_cache_events(real_sglang: SglangServer) -> None:
    """SGLang 0.5.23's events as its own source describes them (`sglang/srt/disaggregation/kv_events.py`),
    read from the server: the same frames and batch as vLLM's, `BlockStored` with 1-token pages (its
    default page size) and a hash per token, stored in chains (each event's parent the previous one's
    last hash), and the prompt's every token stored after its prefill (the answer's tokens but its
    last when the request finishes)."""
    prompt = f"{uuid.uuid4()} " + " ".join(f"event page {i}." for i in range(40))
    tokenized = HTTP.post(
        real_sglang.base_url + "/tokenize",
        json={"model": real_sglang.served_model_name, "messages": [{"role": "user", "content": prompt}],
              "add_generation_prompt": True},
        headers=real_sglang.headers,
        timeout=10,
    ).json()  # fmt: skip
    prompt_ids: list[int] = tokenized["tokens"]
    assert len(prompt_ids) >= 100
    stored: list[dict[str, Any]] = []
    offset = -1  # where the prompt's chain of new pages starts in prompt_ids
    seqs: list[int] = []
    for events in batches(real_sglang, prompt, seqs):
        for e in events:
            if e["type"] != "BlockStored":
                continue
            if stored:
                stored.append(e)
            elif (at := _find(prompt_ids, e["token_ids"])) >= 0:
                # the prompt's first new page: after whatever earlier requests left cached (the chat
                # template's first tokens are every chat's)
                offset = at
                stored.append(e)
        if offset >= 0 and offset + len(stored_tokens(stored)) >= len(prompt_ids):
            break
    else:
        pytest.fail(f"no BlockStored for the prompt; got {stored}")
    assert seqs == sorted(seqs)
    assert all(e.get("block_size", 1) == 1 for e in stored)  # omitted at its default
    assert all(len(e["block_hashes"]) == len(e["token_ids"]) for e in stored)
    # the chain hangs off the cached prefix (or is a root when nothing was cached)
    assert (stored[0].get("parent_block_hash") is None) == (offset == 0)
    for before, after in itertools.pairwise(stored):
        assert after["parent_block_hash"] == before["block_hashes"][-1]
    # every prompt token, in order (what follows them is the answer's)
    assert stored_tokens(stored)[: len(prompt_ids) - offset] == prompt_ids[offset:]
    # the hashes are the simulators' (engines/sim/block_hashes.py, read from SGLang's source): each
    # page's SHA-256 chained over the previous page's digest from the root, its first 8 bytes as a
    # signed int64
    hasher = SglangBlockHasher()
    digest: bytes | None = None
    expected: list[int] = []
    for token in prompt_ids:
        digest = hasher.digest(digest, [token])
        expected.append(hasher.external(digest))
    assert [h for e in stored for h in e["block_hashes"]][: len(expected) - offset] == expected[offset:]
    if offset:
        assert stored[0]["parent_block_hash"] == expected[offset - 1]


def _find(haystack: list[int], needle: list[int]) -> int:
    """Where `needle` (at least 8 tokens, so not a chance match) starts in `haystack`, or -1."""
    if len(needle) < 8:
        return -1
    for at in range(len(haystack) - len(needle) + 1):
        if haystack[at : at + len(needle)] == needle:
            return at
    return -1


def stored_tokens(stored: list[dict[str, Any]]) -> list[int]:
    return [t for e in stored for t in e["token_ids"]]


def test_sglang_never_reached_a_missing_kernel(real_sglang: SglangServer) -> None:
    """Runs after the SGLang tests above: the server is still up and never called an sgl_kernel op
    that has no stand-in (that raises StandInKernelMissing in its scheduler)."""
    assert real_sglang.alive()
    assert HTTP.get(real_sglang.base_url + "/health").status_code == 200
    assert "StandInKernelMissing" not in real_sglang.log_path.read_text(errors="replace")
