"""Shared fixtures: real engine simulators, real gateways and a real redis-server on loopback."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from engines.sim.launcher import SimProcess, free_port
from gateway.demo import SERVED, sim_flags
from tests.support import GatewayProcess, RedisServer

MODEL = "test-model"
ENGINES = ("vllm", "sglang")


def single_pool_config(engine: str, urls: list[str], **overrides: Any) -> dict[str, Any]:
    """A gateway config with one pool of `engine` backends serving MODEL."""
    config: dict[str, Any] = {
        "server": {"graceful_shutdown_s": 5},
        "models": [{"name": MODEL, "context_length": 8192}],
        "pools": [
            {
                "name": engine,
                "dialect": engine,
                "models": {MODEL: SERVED[engine]},
                "backends": [{"name": f"{engine}-{i}", "url": u} for i, u in enumerate(urls)],
            }
        ],
        "upstream": {"health": {"interval_s": 0.5, "failure_threshold": 2, "open_s": 1.0}},
        "routing": {"scrape_interval_s": 0.5},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key].update(value)
        else:
            config[key] = value
    return config


def fast_sim(engine: str, *extra: str) -> SimProcess:
    """A simulator with the demo's engine flags and small latencies (tests stay quick)."""
    flags = [*sim_flags(engine), "--ttft-ms", "2", "--prefill-us-per-token", "0", "--itl-ms", "1", *extra]
    # 90 s to listen: in the side run the real engines' starts (torch in three servers) saturate the
    # two cores, and a simulator's start can then take over 30 s
    return SimProcess(engine, free_port(), flags, start_timeout=90.0)


@pytest.fixture(scope="module", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def pool_gateway(engine: str) -> Iterator[GatewayProcess]:
    """One gateway in front of two simulators of `engine` (module-scoped, per engine)."""
    with contextlib.ExitStack() as stack:
        a, b = stack.enter_context(fast_sim(engine)), stack.enter_context(fast_sim(engine))
        yield stack.enter_context(GatewayProcess(single_pool_config(engine, [a.base_url, b.base_url])))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        os.environ.setdefault("TEST_REDIS_URL", server.url)
        yield server
