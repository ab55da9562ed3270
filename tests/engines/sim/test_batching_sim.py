"""The batching engine in the simulators (batch_runner.py over step_model.py), served in this process on
virtual time (tests/virtual_time.py): first tokens that grow with the uncached prompt, inter-token
latency that grows with the batch, and engine metrics that show the batch. The times asserted are the
cost model's own, exact: nothing here reads a stopwatch (its calibration is `make bench`'s)."""

from __future__ import annotations

import asyncio
import itertools
import statistics
from typing import Any

import pytest

from gateway.cli import build_parser
from tests.engines.sim.helpers import metric
from tests.engines.sim.inprocess import SimClient, content_times, sim_app, sim_client
from tests.virtual_time import elapse, on_virtual_time

CHAT = "/v1/chat/completions"


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


async def first_token(client: SimClient, text: str, max_tokens: int = 2) -> float:
    """Seconds (of the loop's clock) from sending to the first content chunk."""
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "stream": True}
    return (await content_times(client, body))[0]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@on_virtual_time
async def test_ttft_grows_linearly_with_uncached_prompt_tokens(engine: str) -> None:
    """b = 400 µs per prefill token, chunks of 8,192: cold prompts of ~100, ~1,100 and ~2,100 tokens
    take ~0.04, ~0.44 and ~0.84 s to the first token (one step each, a = 2 ms). Each extra 1,000
    tokens adds ~0.4 s; a warm repeat of the longest skips nearly all of it."""
    flags = ["--itl-ms", "2", "--prefill-us-per-token", "400", "--decode-us-per-seq", "0"]
    async with sim_client(sim_app(engine, *flags)) as client:
        cold = [await first_token(client, words(tag, n)) for tag, n in (("a", 100), ("b", 1100), ("c", 2100))]
        warm = await first_token(client, words("c", 2100))
    step1, step2 = cold[1] - cold[0], cold[2] - cold[1]
    assert 0.3 < step1 < 0.5 and 0.3 < step2 < 0.5, cold
    assert abs(step1 - step2) < 0.02, cold  # linear: about equal tokens, equal time
    assert warm < cold[0] + 0.01, (warm, cold)  # the cached prefix is not prefilled again


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@on_virtual_time
async def test_inter_token_latency_rises_with_the_batch(engine: str) -> None:
    """c = 5 ms per decoding sequence, a = 5 ms: one stream alone gets a token every 10 ms; with 15
    more requests decoding beside it every 85 ms."""
    flags = [
        "--itl-ms",
        "5",
        "--decode-us-per-seq",
        "5000",
        "--prefill-us-per-token",
        "0",
        "--context-ns-per-token",
        "0",
    ]
    body = {
        "messages": [{"role": "user", "content": "tell me"}],
        "max_tokens": 24,
        "stream": True,
        "ignore_eos": True,
    }

    async def median_gap(client: SimClient) -> float:
        stamps = await content_times(client, body)
        return statistics.median(b - a for a, b in itertools.pairwise(stamps))

    async with sim_client(sim_app(engine, *flags)) as client:
        alone = await median_gap(client)
        others = {**body, "stream": False, "max_tokens": 60}
        background = [asyncio.create_task(client.post(CHAT, json=others)) for _ in range(15)]
        await elapse(0.05)  # their first tokens are out: they decode
        assert (await client.get("/sim/stats")).json()["running"] == 15
        crowded = await median_gap(client)
        await asyncio.gather(*background)
    assert alone == pytest.approx(0.010, abs=1e-6)
    assert crowded == pytest.approx(0.085, abs=1e-6)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@on_virtual_time
async def test_metrics_show_the_running_batch_the_queue_and_kv_use(engine: str) -> None:
    """--max-num-seqs 3 with 5 long requests: 3 run, 2 wait, KV in use, in each engine's own metric
    names; after they finish nothing runs and the KV use is back to 0."""
    flags = [
        "--itl-ms",
        "20",
        "--max-num-seqs",
        "3",
        "--enable-metrics",
        "--min-output-tokens",
        "30",
        "--max-output-tokens",
        "30",
    ]
    names = (
        ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
        if engine == "vllm"
        else ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage")
    )
    async with sim_client(sim_app(engine, *flags)) as client:
        body = {"messages": [{"role": "user", "content": words("x", 200)}], "max_tokens": 30}
        jobs = [asyncio.create_task(client.post(CHAT, json=body)) for _ in range(5)]
        await elapse(0.1)  # all five have arrived; the first three decode (30 tokens take 0.6 s)
        seen: dict[str, Any] = (await client.get("/sim/stats")).json()
        text = (await client.get("/metrics")).text
        assert (seen["running"], seen["waiting"]) == (3, 2)
        assert metric(text, names[0]) == 3 and metric(text, names[1]) == 2
        assert 0 < metric(text, names[2]) <= 1 and seen["kv_cache_usage"] > 0
        await asyncio.gather(*jobs)
        text = (await client.get("/metrics")).text
    assert metric(text, names[0]) == 0 and metric(text, names[2]) == 0


@on_virtual_time
async def test_a_frozen_engine_takes_no_step_until_thawed() -> None:
    """The `freeze` fault: the running request stops mid-answer and newcomers wait, for as long as it
    lasts (an hour of the clock here); thawed, everything is answered in full."""
    flags = ["--itl-ms", "20", "--max-num-seqs", "1", "--min-output-tokens", "10", "--max-output-tokens", "10"]  # fmt: skip
    async with sim_client(sim_app("vllm", *flags)) as client:
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 10}
        first = asyncio.create_task(client.post(CHAT, json=body))
        await elapse(0.05)  # a few of its tokens are out
        assert (await client.post("/sim/faults", json={"freeze": True})).json()["freeze"] is True
        later = [asyncio.create_task(client.post(CHAT, json=body)) for _ in range(2)]
        await elapse(3600)
        stats = (await client.get("/sim/stats")).json()
        assert (stats["running"], stats["waiting"]) == (1, 2) and not first.done()
        assert (await client.post("/sim/faults", json={"freeze": False})).status_code == 200
        answers = await asyncio.gather(first, *later)
    assert [a.json()["usage"]["completion_tokens"] for a in answers] == [10, 10, 10]


async def test_freeze_needs_the_batching_scheduler() -> None:
    async with sim_client(sim_app("vllm", "--scheduler", "serial")) as client:
        refused = await client.post("/sim/faults", json={"freeze": True})
    assert refused.status_code == 400 and "batching" in refused.json()["error"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@on_virtual_time
async def test_a_small_kv_cache_preempts_and_counts_it(engine: str) -> None:
    """24 blocks of 16 tokens, four concurrent ~30-token prompts decoding 200 tokens each (14 blocks
    more each), 4 ms a step: their KV outgrows the pool, so the engine preempts (vLLM) or retracts
    (SGLang: its admission reserves only 0.7 x 200 tokens of output a request, so two start and run
    out), counts it in its metric, and still answers every request in full."""
    flags = ["--itl-ms", "4", "--prefill-us-per-token", "0", "--num-cache-blocks", "24", "--enable-metrics"]
    async with sim_client(sim_app(engine, *flags)) as client:
        bodies = [
            {
                "messages": [{"role": "user", "content": words(f"y{k}_", 20)}],
                "max_tokens": 200,
                "ignore_eos": True,
            }
            for k in range(4)
        ]
        answers = await asyncio.gather(*(client.post(CHAT, json=body) for body in bodies))
        assert all(r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 200 for r in answers)
        name = "vllm:num_preemptions_total" if engine == "vllm" else "sglang:num_retracted_requests_total"
        assert metric((await client.get("/metrics")).text, name) > 0
        assert (await client.get("/sim/stats")).json()["preemptions_total"] > 0


def test_gateway_sim_help_lists_the_engine_flags() -> None:
    help_text = next(
        a
        for a in build_parser()._subparsers._group_actions[0].choices.values()
        if a.prog.endswith("sim")  # type: ignore[union-attr]
    ).format_help()
    for flag in (
        "--scheduler",
        "--max-num-seqs",
        "--max-running-requests",
        "--max-num-batched-tokens",
        "--chunked-prefill-size",
        "--max-prefill-tokens",
        "--schedule-policy",
        "--num-gpu-blocks-override",
        "--max-total-tokens",
        "--page-size",
        "--prefix-caching-hash-algo",
        "--kv-events-config",
    ):
        assert flag in help_text, flag
