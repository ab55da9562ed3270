"""The cost model: prefix-cache hits shorten TTFT and show in each engine's metrics; queueing; eviction;
a stream's schedule. The simulators run in this process on virtual time (tests/virtual_time.py), so
every time asserted is the model's own, exact; the model's calibration is `make bench`'s."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from tests.engines.sim.helpers import metric
from tests.engines.sim.inprocess import SimClient, content_times, sim_app, sim_client
from tests.virtual_time import elapse, on_virtual_time

CHAT = "/v1/chat/completions"
SYSTEM = "You are a meticulous assistant. " + " ".join(f"rule{i} applies to case{i}." for i in range(300))


async def ttft(client: SimClient, question: str) -> tuple[float, dict[str, Any]]:
    """Seconds (of the loop's clock) to the first streamed chunk of content, and the final usage."""
    body = {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    first = 0.0
    usage: dict[str, Any] = {}
    async with client.stream("POST", CHAT, json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and not first:
                first = loop.time() - t0
            if '"usage":{' in line:
                import orjson

                usage = orjson.loads(line[6:])["usage"]
    return first, usage


def slow_prefill_flags(engine: str) -> list[str]:
    flags = ["--ttft-ms", "2", "--prefill-us-per-token", "150", "--itl-ms", "1"]
    if engine == "sglang":
        return [*flags, "--enable-cache-report", "--enable-metrics"]
    return [*flags, "--enable-prompt-tokens-details"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@on_virtual_time
async def test_repeated_prefix_is_faster_and_counted(engine: str) -> None:
    async with sim_client(sim_app(engine, *slow_prefill_flags(engine))) as client:
        cold, cold_usage = await ttft(client, "first question")
        warm, warm_usage = await ttft(client, "second question")
        # both report 0 cached tokens (as vLLM 0.32 and SGLang 0.5.23 with --enable-cache-report do)
        assert cold_usage["prompt_tokens_details"]["cached_tokens"] == 0
        cached = warm_usage["prompt_tokens_details"]["cached_tokens"]
        assert cached >= 0.9 * int(warm_usage["prompt_tokens"])
        text = (await client.get("/metrics")).text
        if engine == "vllm":
            assert metric(text, "vllm:prefix_cache_hits_total") == cached
            assert metric(text, "vllm:prefix_cache_queries_total") == int(cold_usage["prompt_tokens"]) + int(
                warm_usage["prompt_tokens"]
            )
        else:
            assert metric(text, "sglang:cached_tokens_total") == cached
            assert metric(text, "sglang:cache_hit_rate") > 0.9
        assert (await client.get("/sim/stats")).json()["cached_tokens_total"] == cached
    # ~300 ms of prefill (150 µs a token) against that of the few uncached tokens
    assert cold > 0.2 and warm < cold / 10, (cold, warm)


@pytest.mark.parametrize("scheduler", ["batching", "serial"])
@on_virtual_time
async def test_lru_eviction_is_bounded(scheduler: str) -> None:
    """20 blocks of 16 tokens; each prompt needs ~13. The batching engine's pool evicts the blocks
    released longest ago, a request's last block first (vLLM's free-block queue), so the second prompt
    leaves the first a shorter cached prefix; the serial cache evicts in acquisition order, the first
    prompt's first block first, which leaves it nothing."""
    flags = ["--fast", "--num-cache-blocks", "20", "--enable-prompt-tokens-details", "--scheduler", scheduler]
    async with sim_client(sim_app("vllm", *flags)) as client:

        async def cached(text: str) -> int:
            r = await client.post(
                CHAT, json={"messages": [{"role": "user", "content": text}], "max_tokens": 1}
            )
            return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

        a = " ".join(f"alpha{i}" for i in range(200))
        b = " ".join(f"beta{i}" for i in range(200))
        await cached(a)
        full = await cached(a)
        assert full > 150
        assert await cached(b) == 0  # needs 13 of the 20 blocks: evicts a's
        again = await cached(a)
        if scheduler == "serial":
            assert again == 0
        else:
            assert 0 < again < full and again % 16 == 0, (again, full)
        st = (await client.get("/sim/stats")).json()["prefix_cache"]
    assert st["blocks_used"] <= 20 and st["evictions"] > 0


@on_virtual_time
async def test_queue_beyond_max_num_seqs() -> None:
    async with sim_client(
        sim_app("vllm", "--ttft-ms", "1", "--itl-ms", "30", "--max-num-seqs", "1")
    ) as client:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        jobs = [asyncio.create_task(client.post(CHAT, json=body)) for _ in range(2)]
        await elapse(0.1)  # both have arrived; the first runs for ~ 210 ms
        st = (await client.get("/sim/stats")).json()
        text = (await client.get("/metrics")).text
        assert (st["running"], st["waiting"]) == (1, 1)
        assert metric(text, "vllm:num_requests_waiting") == 1
        assert (await client.get("/load")).json() == {"server_load": 2}
        await asyncio.gather(*jobs)
        text = (await client.get("/metrics")).text
    assert metric(text, "vllm:request_queue_time_seconds_sum") > 0.1  # the second waited ~ 210 ms
    assert metric(text, "vllm:num_requests_running") == 0


#: the virtual time a streamed chunk's write takes: the engine's schedule must not drift by it
SEND_S = 0.002


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@on_virtual_time
async def test_stream_takes_ttft_plus_itl_per_later_token(engine: str) -> None:
    """Serial scheduler: n tokens stream in ttft + (n - 1) x ITL: the first comes with the prefill (the
    role chunk with it), and the shared decode tick keeps its period while the stream sends its chunks.
    (A stream that waited one more ITL, or a tick that drifted by the chunk's send time, would run the
    routing benchmark's fleet above its nominal load.)"""
    flags = ["--scheduler", "serial", "--ttft-ms", "1", "--itl-ms", "150", "--load-slowdown", "0"]
    app = sim_app(engine, *flags, "--min-output-tokens", "6", "--max-output-tokens", "6")
    async with sim_client(app, send_s=SEND_S) as client:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True}
        stamps = await content_times(client, body)
    assert len(stamps) == 6, stamps
    assert stamps[0] < 0.01, stamps  # with the prefill (1 ms and a few prompt tokens), not an ITL later
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    # the tick is armed once the first chunk is written; from then on it keeps to its grid
    assert gaps == pytest.approx([0.150 + SEND_S, *[0.150] * 4], abs=1e-9), gaps


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@on_virtual_time
async def test_batching_steps_keep_their_period(engine: str) -> None:
    """Batching scheduler, one stream: each later token is one step (a = --itl-ms 80 ms, plus
    microseconds of c and d), and the steps keep to a grid while the stream sends its chunks (each
    write costs `SEND_S` here), so the first to the sixth token take 5 steps of 80 ms and those
    microseconds, less the one write before the first."""
    flags = ["--ttft-ms", "1", "--itl-ms", "80", "--min-output-tokens", "6", "--max-output-tokens", "6"]
    async with sim_client(sim_app(engine, *flags), send_s=SEND_S) as client:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True}
        stamps = await content_times(client, body)
    assert len(stamps) == 6, stamps
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    # the first content chunk follows the role chunk's write; from then on one step a token, each
    # longer than the one before by d x one more token of context (nanoseconds)
    assert gaps[0] == pytest.approx(gaps[1] - SEND_S, abs=1e-5), gaps
    assert all(0.080 < gap < 0.081 for gap in gaps[1:]), gaps
    assert max(gaps[1:]) - min(gaps[1:]) < 1e-5, gaps
