"""When a prefix block becomes a hit: the real vLLM 0.32 server against the vLLM simulator.

vLLM caches a full block when it *schedules* the step that computes it (`KVCacheManager.allocate_slots`
caches up to the tokens the step computes), so a request scheduled later in the same step already hits
the blocks an earlier one is computing. Four identical prompts sent together (one request of four
prompts) while the engine is busy with a long prefill wait and are scheduled together: one computes
the prompt, the three others hit its full blocks - on the real engine and on the simulator alike. A
simulator that cached a block only after its step had run would count 0 hits for the three. (Whether
the real engine ran the four in one step depends on how fast its API server hands them on, which a
busy machine changes: the real engine's test checks the hits, not the step.)
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import httpx
import pytest

from engines.sim.launcher import SimProcess, free_port
from gateway.demo import SERVED, sim_flags
from tests.real_engines.rig import ENGINE_HEADERS, engine_metric, running
from tests.real_engines.servers import VllmServer
from tests.support import wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.timeout(300),
]  # the first test may wait for the server's startup

BLOCK = 32  # the real server's --block-size (the CPU attention backend wants a multiple of 32)


def words(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(
        rng.choice(("alpha", "beta", "gamma", "delta")) + str(rng.randrange(900)) for _ in range(n)
    )


async def burst(base: str, model: str, seed: int) -> int:
    """A long prompt, then (while its prefill runs) four identical short ones in one request, so that
    they reach the engine together however busy the machine: the four's prompt tokens, each."""
    async with httpx.AsyncClient(base_url=base, headers=ENGINE_HEADERS, timeout=120) as client:

        async def complete(prompt: str | list[str]) -> int:
            body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
            r = await client.post("/v1/completions", json=body)
            r.raise_for_status()
            return int(r.json()["usage"]["prompt_tokens"])

        busy = asyncio.create_task(complete(words(seed, 700)))
        await asyncio.sleep(0.05)  # the long prompt reaches the engine first (no signal of its prefill)
        four = await complete([words(seed + 1, 150)] * 4)
        await busy
        return four // 4


def hit_tokens(base: str) -> float:
    """The engine's prefix-cache hits so far, in tokens (`vllm:prefix_cache_hits`; a request of
    several prompts reports one prompt's cached tokens in its usage, so the counter tells the four's)."""
    r = httpx.get(base + "/metrics", headers=ENGINE_HEADERS, timeout=10, trust_env=False)
    r.raise_for_status()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in r.text.splitlines()
        if line.startswith("vllm:prefix_cache_hits") and not line.startswith("vllm:prefix_cache_hits_created")
    )


def assert_followers_hit(base: str, model: str, seed: int) -> None:
    """One of the four computes the prompt; the three others hit all its full blocks."""
    before = hit_tokens(base)
    n = asyncio.run(burst(base, model, seed))
    full = (n - 1) // BLOCK * BLOCK  # the last prompt token is always computed
    assert full >= 4 * BLOCK, n
    assert hit_tokens(base) - before == 3 * full, (n, full)


def wait_idle(server: VllmServer) -> None:
    """Until nothing runs or waits on the engine (an earlier test's request would add steps)."""
    wait_until(
        lambda: running(server) + engine_metric(server, "vllm:num_requests_waiting") == 0,
        timeout=30,
        what="the real vLLM idle",
    )


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    # a step of the long prompt takes ~0.2 s (200 us a token), long enough for the four to queue
    flags = [*sim_flags("vllm"), "--block-size", str(BLOCK), "--prefill-us-per-token", "200"]
    with SimProcess("vllm", free_port(), flags) as process:
        yield process


def test_real_vllm_hits_the_blocks_of_prompts_sent_together(real_vllm: VllmServer) -> None:
    wait_idle(real_vllm)
    assert_followers_hit(real_vllm.base_url, real_vllm.served_model_name, seed=1)


def test_the_simulator_hits_blocks_computed_in_the_same_step(sim: SimProcess) -> None:
    assert_followers_hit(sim.base_url, SERVED["vllm"], seed=1)
