"""A client that goes away mid-stream cancels the real engine's request, through the gateway.

A long streamed generation (`ignore_eos`, thousands of tokens: seconds of work for the engine) runs
through a gateway in front of one real server; once the engine's running-requests gauge shows it
(`vllm:num_requests_running`, `sglang:num_running_reqs`), the client closes the connection. The
gauge must be back to 0 within 1 s — long before the generation could have ended by itself — and
the engine must count the request as aborted (`vllm:request_success_total{finished_reason="abort"}`,
`sglang:num_aborted_requests_total`), so the 0 is an abort, not a finish.

SGLang's gauges refresh only when its scheduler logs stats (ENGINES.md). Measured here (0.5.23 with
`--sleep-on-idle`): it moved to 0 within ~0.15 s of the disconnect, because the scheduler logs when
it goes idle; the abort counter is the engine-side evidence either way.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.real_engines.rig import aborted, chat, engine_metric, real_pool_config, running
from tests.real_engines.servers import EngineServer
from tests.support import GatewayProcess, wait_until

pytestmark = pytest.mark.timeout(300)  # the first test may wait for a server's startup

LONG = 3800  # tokens: with a short prompt, near the 4096 context; ≥ 4 s of decoding on this machine
GENERATED = {"vllm": "vllm:generation_tokens_total", "sglang": "sglang:generation_tokens_total"}


@pytest.fixture(scope="module")
def gateway(real_engine: EngineServer) -> Iterator[GatewayProcess]:
    config = real_pool_config(real_engine.engine, [real_engine.base_url], real_engine.served_model_name)
    with GatewayProcess(config) as gw:
        yield gw


def test_client_disconnect_aborts_the_engine_request(
    gateway: GatewayProcess, real_engine: EngineServer
) -> None:
    wait_until(lambda: running(real_engine) == 0, 10, 0.1, "the engine idle before the test")
    aborted_before = aborted(real_engine)
    generated_before = engine_metric(real_engine, GENERATED[real_engine.engine])
    body = chat("Write for a long time.", max_tokens=LONG, ignore_eos=True, stream=True)
    with (
        httpx.Client(base_url=gateway.base_url, timeout=60, trust_env=False) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        while not next(lines).startswith("data: {"):  # the first chunk: the engine is generating
            pass
        wait_until(lambda: running(real_engine) == 1, 5, 0.02, "the engine's running gauge at 1")
        started = time.monotonic()
    # the `with` closed the connection mid-stream
    wait_until(lambda: running(real_engine) == 0, 1.0, 0.02, "the running gauge back to 0 within 1 s")
    took = time.monotonic() - started
    wait_until(lambda: aborted(real_engine) == aborted_before + 1, 5, 0.05, "the engine's abort counter")
    generated = engine_metric(real_engine, GENERATED[real_engine.engine]) - generated_before
    assert generated < LONG / 2, f"{generated} tokens generated: the request ran on ({took:.2f}s)"
