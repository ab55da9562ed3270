"""The batching engine in the running simulators (batch_runner.py over step_model.py): first tokens
that grow with the uncached prompt, inter-token latency that grows with the batch, and engine metrics
that show the batch. Wall-clock figures on a shared 2-core machine: costs are set so the effect is
hundreds of milliseconds, and the bounds allow tens of milliseconds of noise."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import httpx
import pytest

from engines.sim.launcher import SimProcess
from gateway.cli import build_parser
from tests.engines.sim.helpers import metric, stats
from tests.support import measured_async

pytestmark = pytest.mark.processes

CHAT = "/v1/chat/completions"


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


async def first_token(client: httpx.AsyncClient, text: str, max_tokens: int = 2) -> float:
    """Seconds from sending to the first content chunk."""
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "stream": True}
    t0 = time.perf_counter()
    async with client.stream("POST", CHAT, json=body) as r:
        async for line in r.aiter_lines():
            if '"content":"' in line and '"content":""' not in line:
                return time.perf_counter() - t0
    raise AssertionError("no content chunk")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_ttft_grows_linearly_with_uncached_prompt_tokens(engine: str) -> None:
    """b = 400 µs per prefill token, chunks of 8,192: cold prompts of ~100, ~1,100 and ~2,100 tokens
    take ~0.04, ~0.44 and ~0.84 s to the first token (one step each, a = 2 ms). Each extra 1,000
    tokens adds ~0.4 s, within 0.3-0.5 s; a warm repeat of the longest skips nearly all of it."""
    flags = ["--itl-ms", "2", "--prefill-us-per-token", "400", "--decode-us-per-seq", "0"]

    def linear(times: tuple[list[float], float]) -> bool:
        cold, warm = times
        step1, step2 = cold[1] - cold[0], cold[2] - cold[1]
        return (
            0.3 < step1 < 0.5
            and 0.3 < step2 < 0.5
            and abs(step1 - step2) < 0.1  # linear: equal tokens, equal time
            and warm < cold[0] + 0.1  # the cached prefix is not prefilled again
        )

    with SimProcess(engine, extra=flags) as p:
        async with httpx.AsyncClient(base_url=p.base_url, timeout=20) as client:
            await first_token(client, "warm up the connection")
            tries = itertools.count()

            async def times() -> tuple[list[float], float]:
                k = next(tries)  # new prompts each try: the last try's are cached
                sizes = ((f"a{k}_", 100), (f"b{k}_", 1100), (f"c{k}_", 2100))
                cold = [await first_token(client, words(tag, n)) for tag, n in sizes]
                return cold, await first_token(client, words(f"c{k}_", 2100))

            # a stall of this process or the simulator's moves a first token by its length (`measured`)
            taken = await measured_async(times, linear)
    assert linear(taken[-1]), taken


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_inter_token_latency_rises_with_the_batch(engine: str) -> None:
    """c = 5 ms per decoding sequence, a = 5 ms: one stream alone gets a token every ~10 ms; with 15
    more requests decoding beside it every ~85 ms."""
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

    async def gaps(client: httpx.AsyncClient) -> list[float]:
        stamps = []
        async with client.stream("POST", CHAT, json=body) as r:
            async for line in r.aiter_lines():
                if '"content":"' in line and '"content":""' not in line:
                    stamps.append(time.perf_counter())
        return [b - a for a, b in itertools.pairwise(stamps)]

    def median(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    def rises(mid: tuple[float, float]) -> bool:
        return 0.008 < mid[0] < 0.03 and 0.07 < mid[1] < 0.12 and mid[1] > 4 * mid[0]

    with SimProcess(engine, extra=flags) as p:
        async with httpx.AsyncClient(base_url=p.base_url, timeout=30) as client:
            await gaps(client)

            async def mids() -> tuple[float, float]:
                """The median gap of a stream alone, then of one with 15 others decoding beside it."""
                alone = await gaps(client)
                others = {**body, "stream": False, "max_tokens": 60}  # ~5 s of decoding, the measured ~2 s
                background = [asyncio.create_task(client.post(CHAT, json=others)) for _ in range(15)]
                for _ in range(200):  # until the others are decoding
                    if (await client.get("/sim/stats")).json()["running"] >= 15:
                        break
                    await asyncio.sleep(0.01)
                crowded = await gaps(client)
                await asyncio.gather(*background)
                return median(alone), median(crowded)

            # a stall of this process or the simulator's moves the gaps it overlaps (`measured`)
            taken = await measured_async(mids, rises, tries=3)
    assert rises(taken[-1]), taken


def scrape(base: str) -> str:
    return httpx.get(base + "/metrics", timeout=5).text


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
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
    with SimProcess(engine, extra=flags) as p:
        async with httpx.AsyncClient(base_url=p.base_url, timeout=30) as client:
            body = {"messages": [{"role": "user", "content": words("x", 200)}], "max_tokens": 30}
            jobs = [asyncio.create_task(client.post(CHAT, json=body)) for _ in range(5)]
            seen: dict[str, Any] = {}
            for _ in range(300):
                st = (await client.get("/sim/stats")).json()
                if st["running"] == 3 and st["waiting"] == 2:
                    seen = st
                    text = (await client.get("/metrics")).text
                    break
                await asyncio.sleep(0.005)
            assert seen, "never saw 3 running and 2 waiting"
            assert metric(text, names[0]) == 3 and metric(text, names[1]) == 2
            assert 0 < metric(text, names[2]) <= 1 and seen["kv_cache_usage"] > 0
            await asyncio.gather(*jobs)
            text = (await client.get("/metrics")).text
    assert metric(text, names[0]) == 0 and metric(text, names[2]) == 0


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_small_kv_cache_preempts_and_counts_it(engine: str) -> None:
    """24 blocks of 16 tokens, four concurrent ~30-token prompts decoding 200 tokens each (14 blocks
    more each), 4 ms a step: their KV outgrows the pool, so the engine preempts (vLLM) or retracts
    (SGLang: its admission reserves only 0.7 x 200 tokens of output a request, so two start and run
    out), counts it in its metric, and still answers every request in full."""
    flags = ["--itl-ms", "4", "--prefill-us-per-token", "0", "--num-cache-blocks", "24", "--enable-metrics"]
    with SimProcess(engine, extra=flags) as p:

        async def go() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=p.base_url, timeout=60) as client:
                bodies = [
                    {
                        "messages": [{"role": "user", "content": words(f"y{k}_", 20)}],
                        "max_tokens": 200,
                        "ignore_eos": True,
                    }
                    for k in range(4)
                ]
                return await asyncio.gather(*(client.post(CHAT, json=body) for body in bodies))

        answers = asyncio.run(go())
        assert all(r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 200 for r in answers)
        name = "vllm:num_preemptions_total" if engine == "vllm" else "sglang:num_retracted_requests_total"
        assert metric(scrape(p.base_url), name) > 0
        assert stats(p.base_url)["preemptions_total"] > 0  # type: ignore[operator]


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
