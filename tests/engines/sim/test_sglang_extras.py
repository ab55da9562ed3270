"""engines/sim/sglang_extras.py in this process, on virtual time (tests/virtual_time.py)."""

from __future__ import annotations

import asyncio

import pytest

from tests.engines.sim.helpers import USER
from tests.engines.sim.inprocess import sim_app, sim_client
from tests.virtual_time import on_virtual_time


@on_virtual_time
async def test_health_answers_while_the_engine_is_busy() -> None:
    """Like SGLang's `health_generate`, any output since the probe began means healthy: a probe queued
    behind a long request (40 tokens at 100 ms: 4 s) answers at its first look, a second after it
    began, not after the queue (a gateway's 3 s probe failed)."""
    app = sim_app("sglang", "--max-num-seqs", "1", "--itl-ms", "100", "--min-output-tokens", "40")
    loop = asyncio.get_running_loop()
    async with sim_client(app) as client:
        body = {"messages": USER, "max_tokens": 40, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
            chunks = stream.aiter_raw()
            await anext(chunks)  # the request runs
            asked = loop.time()
            assert (await client.get("/health")).status_code == 200
            answered = loop.time() - asked
            assert not stream.is_closed  # the long request is still streaming
    assert answered == pytest.approx(1.0), answered
