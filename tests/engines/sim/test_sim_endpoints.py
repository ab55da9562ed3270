"""Sim-only endpoints and client-disconnect handling."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.engines.sim.helpers import USER, post, sim, stats
from tests.support import HTTP, wait_until

pytestmark = pytest.mark.processes

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def base(request: pytest.FixtureRequest) -> Iterator[str]:
    with sim(request.param, "--request-log-size", "4", "--itl-ms", "20") as p:
        yield p.base_url


def test_request_log(base: str) -> None:
    HTTP.post(base + "/sim/reset")
    for i in range(6):  # (httpx's 5 s default once timed out while the real engines ran beside it)
        HTTP.post(
            base + CHAT,
            json={"messages": USER, "max_tokens": 1, "seed": i},
            headers={"x-test": str(i)},
        )
    log = HTTP.get(base + "/sim/requests").json()["requests"]
    assert len(log) == 4  # bounded
    last = log[-1]
    assert last["method"] == "POST" and last["path"] == CHAT
    assert last["body"] == {"messages": USER, "max_tokens": 1, "seed": 5}
    assert last["headers"]["x-test"] == "5" and last["arrival"] > time.time() - 60
    assert len(HTTP.get(base + "/sim/requests?limit=2").json()["requests"]) == 2


def test_stats_counters(base: str) -> None:
    HTTP.post(base + "/sim/reset")
    r = post(base, CHAT, {"messages": USER, "max_tokens": 3}).json()
    st = stats(base)
    assert st["requests_total"] == 1 and st["completed_total"] == 1 and st["cancelled_total"] == 0
    assert st["prompt_tokens_total"] == r["usage"]["prompt_tokens"] and st["generation_tokens_total"] == 3
    assert (st["running"], st["waiting"]) == (0, 0)
    post(base, CHAT, {"messages": "not a list"})
    assert stats(base)["errors_total"] == 1


def wait_cancelled(base: str, before: int) -> None:
    wait_until(lambda: stats(base)["cancelled_total"] != before, what="the request cancelled")


def test_stream_disconnect_is_cancelled_promptly(base: str) -> None:
    before, generated = stats(base)["cancelled_total"], stats(base)["generation_tokens_total"]
    with HTTP.stream("POST", base + CHAT, json={"messages": USER, "stream": True, "max_tokens": 200}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 3:
                break
    wait_cancelled(base, before)
    st = stats(base)
    assert st["cancelled_total"] == before + 1
    # promptly: it stopped generating long before the 200 tokens (nor went on for another request)
    assert st["running"] == 0 and st["generation_tokens_total"] - generated < 200


async def test_non_stream_disconnect_is_cancelled(base: str) -> None:
    before = stats(base)["cancelled_total"]
    # the read times out (the client goes away mid-generation); the connect may take long on a busy machine
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=0.2)) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(base + CHAT, json={"messages": USER, "max_tokens": 100})
    wait_cancelled(base, before)
    st = stats(base)
    assert st["cancelled_total"] == before + 1 and st["running"] == 0
