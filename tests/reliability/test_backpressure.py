"""A client that stops reading must slow the engine down, never fill the gateway's memory.

The stream here is ~16 MB (60 000 tokens from a simulator with no latency at all). The client asks
for a 4 KiB receive buffer and then reads nothing for 3-4 s. If the gateway buffered without bound,
the engine would finish generating in that time and the gateway's RSS would grow by roughly the
stream's size. With backpressure (uvicorn waits for the socket to drain before `send` returns, the
relay then stops reading the engine, aiohttp stops reading its socket), the engine's stream stays
open and what is in flight is what the kernel's socket buffers hold — bounded, and once they are
full the same at the start and the end of the pause. Then the client reads everything: every byte
arrives, `[DONE]` last.
"""

from __future__ import annotations

import time

import pytest

from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.reliability.support import (
    RawClient,
    chat,
    http_request,
    kernel_queued_bytes,
    rss_mb,
    sim_stats,
)
from tests.support import GatewayProcess, wait_until

pytestmark = pytest.mark.processes

TOKENS = 60_000


def settled_queued_bytes(ports: set[int], timeout: float = 15.0) -> int:
    """The bytes the kernel holds for `ports` once they stop growing (two reads 0.5 s apart within
    64 KiB): the socket buffers fill in about a second on an idle machine, in several under load
    (5.2 MB after 1 s, 7.3 MB after 3.5 s once in `make test`). Never settling within `timeout` - an
    unbounded buffer - fails."""
    deadline = time.monotonic() + timeout
    last = kernel_queued_bytes(ports)
    while time.monotonic() < deadline:
        time.sleep(0.5)  # still growing? two reads some time apart tell
        now = kernel_queued_bytes(ports)
        if abs(now - last) < 64 * 1024:
            return now
        last = now
    raise AssertionError(f"the kernel's queues did not settle in {timeout} s (last {last} B)")


def test_slow_reader_pauses_the_engine_and_bounds_gateway_memory() -> None:
    with fast_sim("vllm", "--max-model-len", "100000", "--itl-ms", "0", "--ttft-ms", "0") as sim:
        config = single_pool_config(
            "vllm",
            [sim.base_url],
            models=[{"name": MODEL, "context_length": 100000}],
            upstream={"health": {"interval_s": 3600}, "timeouts": {"idle_s": 60}},
        )
        with GatewayProcess(config) as gw:
            body = chat(max_tokens=TOKENS, min_tokens=TOKENS, stream=True)
            rss_before = rss_mb(gw.pid)
            with RawClient(gw.port, rcvbuf=4096, timeout=30) as client:
                client.send(http_request("/v1/chat/completions", body))
                wait_until(lambda: sim_stats(sim.base_url)["running"] == 1, timeout=5, what="stream started")
                queued_early = settled_queued_bytes({gw.port, sim.port})
                time.sleep(2.5)  # that nothing moves shows only over time
                queued_late = kernel_queued_bytes({gw.port, sim.port})
                stats = sim_stats(sim.base_url)
                rss_paused = rss_mb(gw.pid)

                print(
                    f"\nbackpressure: rss {rss_before:.1f} -> {rss_paused:.1f} MB, kernel queues {queued_early} -> {queued_late} B"
                )
                # The engine is held back: its stream is still open, nothing completed.
                assert stats["running"] == 1 and stats["completed_total"] == 0, stats
                # The gateway holds no copy of the stream: its RSS barely moved.
                assert rss_paused - rss_before < 8, (rss_before, rss_paused)
                # What is in flight sits in socket buffers, bounded (the stream is ~16 MB) and static.
                assert queued_late < 12 * 1024 * 1024, queued_late
                assert abs(queued_late - queued_early) < 1024 * 1024, (queued_early, queued_late)

                data = client.read_until(b"data: [DONE]")
            assert data.startswith(b"HTTP/1.1 200")
            assert b"data: [DONE]" in data[-100:]
            assert data.count(b'"chat.completion.chunk"') >= TOKENS
            wait_until(lambda: sim_stats(sim.base_url)["completed_total"] == 1, timeout=5, what="completion")
