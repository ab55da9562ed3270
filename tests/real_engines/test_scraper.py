"""The gateway's view of real engines: its health probes pass, its scraper reads their `/metrics`
(running, waiting, KV-cache use, prefix-cache hits, shown by `GET /admin/pools`), and a repeated long
prompt shows `cached_tokens` in the usage the client gets (vLLM with `--enable-prompt-tokens-details`,
SGLang with `--enable-cache-report`).

Load is real: ten long requests at a time, sent to the engine, against servers that run at most eight at
once (vLLM `--max-num-seqs 8`, SGLang `--max-running-requests 8`), so two wait. SGLang's gauges refresh when
its scheduler logs stats (every 40 decode steps, and when it goes idle), so they are polled for.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from gateway.admission.tokens import mint_token
from tests.real_engines.rig import chat, engine_metric, metric, real_pool_config, running
from tests.real_engines.servers import EngineServer
from tests.support import HTTP, GatewayProcess, until, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.timeout(420),
]  # the first test may wait for a server's startup

SECRET = "test-secret-for-the-real-engine-scraper-0123"
ADMIN = {"Authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
USER = {"Authorization": "Bearer " + mint_token(SECRET, "alice")}
SLOTS = 8  # both servers' running-request limit (tests/real_engines/servers.py)
#: tokens per loading request: long enough to outlast a scrape. vLLM answers /metrics seconds late
#: while it decodes for 8 requests on 2 cores; with 1,500 tokens the 10 requests once finished before
#: any scrape showed more than 2 running (the test then cancels them as soon as it saw the load)
LONG = 3800
LOADED_S = 240  # bounds the engine's own admission of the load too, which is not under test
TOP_UP_S, TOP_UPS = 10.0, 6  # one more request that often, at most that many, while none waits
WAITING = {"vllm": "vllm:num_requests_waiting", "sglang": "sglang:num_queue_reqs"}


@pytest.fixture(scope="module")
def gateway(real_engine: EngineServer) -> Iterator[GatewayProcess]:
    config = real_pool_config(real_engine.engine, [real_engine.base_url], real_engine.served_model_name)
    # vLLM answers /metrics seconds late while it decodes for 8 requests on 2 cores shared with the
    # rest of the suite: once the engine's log said 8 running and 2 waiting while the gateway saw 0
    # all along — its scrapes (3 s at most by default) most likely timed out. Here they may take 15 s.
    config["upstream"]["health"].update(timeout_s=15.0, failure_threshold=50)
    with GatewayProcess(config, env={"GATEWAY_JWT_SECRET": SECRET}) as gw:
        yield gw


def backend(gateway: GatewayProcess) -> dict[str, Any]:
    (pool,) = HTTP.get(gateway.base_url + "/admin/pools", headers=ADMIN, timeout=10).json()["pools"]
    (one,) = pool["backends"]
    return dict(one)


def load(gateway: GatewayProcess) -> dict[str, Any]:
    scraped = backend(gateway)["load"]
    assert scraped is not None, "the scraper has not read the engine's /metrics"
    return dict(scraped)


def test_health_probes_pass_and_idle_load_is_read(gateway: GatewayProcess, real_engine: EngineServer) -> None:
    assert HTTP.get(gateway.base_url + "/readyz", timeout=10).status_code == 200
    wait_until(lambda: running(real_engine) == 0, 10, "the engine idle")
    wait_until(lambda: backend(gateway)["load"] is not None and load(gateway)["running"] == 0, 5, "a scrape")
    one = backend(gateway)
    assert one["healthy"] is True and one["circuit"] == "closed"
    idle = load(gateway)
    assert idle["waiting"] == 0 and 0 <= idle["kv_usage"] < 0.05 and idle["age_s"] < 2
    text = HTTP.get(gateway.base_url + "/metrics", timeout=10).text
    assert metric(text, "gateway_backend_healthy", f'backend="{real_engine.engine}-0"') == 1


async def test_running_waiting_and_kv_use_are_scraped(
    gateway: GatewayProcess, real_engine: EngineServer
) -> None:
    """Long requests (whole, not streamed: a stream per token would starve vLLM's API server, and its
    /metrics with it, on 2 cores) against 8 running slots: ten, and one more each time one is
    answered, so that two wait for as long as the test looks; cancelled once the scrape showed them.

    The load goes to the engine itself: what is under test is what the gateway's scraper reads of it."""
    seen: dict[str, float] = {"running": 0, "waiting": 0, "kv_usage": 0}
    wait_until(lambda: running(real_engine) == 0, 15, "the engine idle before the load")
    async with (
        httpx.AsyncClient(base_url=gateway.base_url, timeout=60, headers=USER) as client,
        # a connection per request: a kept one the engine's server closes as idle just as it is reused
        # fails that request with a ReadError
        httpx.AsyncClient(
            base_url=real_engine.base_url,
            headers=real_engine.headers,
            timeout=LOADED_S + 60,
            trust_env=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        ) as engine,
    ):

        def send() -> asyncio.Task[httpx.Response]:
            body = chat(f"{uuid.uuid4()} keep going", max_tokens=LONG, ignore_eos=True)
            body["model"] = real_engine.served_model_name
            return asyncio.create_task(engine.post("/v1/chat/completions", json=body))

        tasks = [send() for _ in range(SLOTS + 2)]
        answered = 0  # and replaced
        try:
            # each answered request is replaced at once, so two wait until the scrape has seen them: with
            # ten in all, the ten can be answered before a scrape, late on a stalled machine, shows one
            # waiting. A starved vLLM API server can hand the engine a few for minutes and hold the
            # rest: while the engine itself shows none waiting, one more is sent now and then
            loop = asyncio.get_running_loop()
            extra, topped_at, engine_waiting = 0, loop.time(), 0.0

            async def shown() -> bool:
                """Each answered request replaced, the gateway's view of the engine read again."""
                nonlocal answered, seen, extra, topped_at, engine_waiting
                for task in [t for t in tasks if t.done()]:
                    tasks.remove(task)
                    answer = task.result()  # a transport error fails the test here, a refusal below
                    assert answer.status_code == 200, (answer.status_code, answer.text[:300])
                    answered += 1
                    tasks.append(send())
                if extra < TOP_UPS and loop.time() - topped_at > TOP_UP_S:
                    topped_at = loop.time()
                    engine_waiting = await asyncio.to_thread(
                        engine_metric, real_engine, WAITING[real_engine.engine]
                    )
                    if not engine_waiting:
                        extra += 1
                        tasks.append(send())
                view = await client.get("/admin/pools", headers=ADMIN)
                assert view.status_code == 200, (view.status_code, view.text[:300])
                pools = view.json()["pools"]
                now = pools[0]["backends"][0]["load"] or {}
                seen = {k: max(seen[k], now.get(k) or 0) for k in seen}
                return bool(seen["running"] >= SLOTS and seen["waiting"] >= 1 and seen["kv_usage"] > 0)

            try:
                await until(
                    shown, LOADED_S, what=f"the scraper showing the load ({answered} answered and replaced)"
                )
            except AssertionError as e:
                raise AssertionError(
                    f"{e}; the most the gateway showed: {seen}; the engine's own waiting gauge at the"
                    f" last look: {engine_waiting}, {extra} more sent"
                ) from None
        finally:
            for task in tasks:
                task.cancel()  # closes their connections: the engine aborts the requests
            await asyncio.gather(*tasks, return_exceptions=True)
    assert seen["running"] == SLOTS  # never more than the engine's limit
    # the engine itself idle (it aborts the cancelled requests when it notices their connections
    # closed: on a loaded machine seconds later), then the scrape showing it, so that the next test's
    # first request does not meet this load and a 503
    wait_until(lambda: running(real_engine) == 0, 90, "the engine idle after the cancelled load")
    wait_until(lambda: load(gateway)["running"] == 0 and load(gateway)["waiting"] == 0, 15, "idle again")


def test_repeated_long_prompt_shows_cached_tokens(gateway: GatewayProcess, real_engine: EngineServer) -> None:
    # ~1.5k tokens, unique per run so earlier runs' cache entries do not count
    prompt = f"{uuid.uuid4()} " + " ".join(f"cache block {i} of the repeated prompt." for i in range(100))
    wait_until(lambda: running(real_engine) == 0, 90, "the engine idle")
    with httpx.Client(base_url=gateway.base_url, timeout=60, headers=USER) as client:
        answer = client.post("/v1/chat/completions", json=chat(prompt))
        assert answer.status_code == 200, (answer.status_code, answer.headers, answer.text)
        first = answer.json()["usage"]
        assert 1000 <= first["prompt_tokens"] <= 2000
        assert first["prompt_tokens_details"]["cached_tokens"] < 64  # nothing of it was cached
        before = HTTP.get(gateway.base_url + "/metrics", timeout=10).text
        answer = client.post("/v1/chat/completions", json=chat(prompt))
        assert answer.status_code == 200, (answer.status_code, answer.headers, answer.text)
        second = answer.json()["usage"]
        body = chat(prompt, stream=True, stream_options={"include_usage": True})
        answer = client.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200, (answer.status_code, answer.headers, answer.text)
        streamed = answer.text
    cached = second["prompt_tokens_details"]["cached_tokens"]
    n = second["prompt_tokens"]
    if real_engine.engine == "vllm":  # whole 32-token blocks, all but the one holding the last token
        assert cached % 32 == 0 and n - 32 <= cached < n
    else:  # SGLang's radix cache: all but the last token
        assert n - 2 <= cached < n
    usage = orjson.loads(streamed.rstrip().split("\n\n")[-2].removeprefix("data: "))["usage"]
    assert usage["prompt_tokens"] == n and n - 32 <= usage["prompt_tokens_details"]["cached_tokens"] < n
    after = HTTP.get(gateway.base_url + "/metrics", timeout=10).text
    assert (
        metric(after, "gateway_cached_tokens_total") - metric(before, "gateway_cached_tokens_total") >= cached
    )
    # the scraper's prefix-cache hit rate moved off zero: lifetime hits / queries on both engines (SGLang's
    # `cache_hit_rate` gauge is the last prefill batch's, and the gateway's own /health probe, a one-token
    # generation on SGLang, sets it back to 0: read that way, this failed in CI once)
    wait_until(lambda: (load(gateway)["prefix_cache_hit_rate"] or 0) > 0, 5, "a prefix-cache hit rate")
    if real_engine.engine == "sglang":  # and it stays there through a health probe and a scrape after it
        assert httpx.get(real_engine.base_url + "/health", timeout=30, trust_env=False).status_code == 200
        probed = time.monotonic()
        wait_until(lambda: load(gateway)["age_s"] < time.monotonic() - probed, 10, "a scrape after it")
        assert load(gateway)["prefix_cache_hit_rate"] > 0
