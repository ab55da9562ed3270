"""Session affinity: the session identifiers agent harnesses and SDKs send keep a conversation's
turns on one backend, even when the opening of its prompt changes, on every gateway replica."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from engines.sim.launcher import SimProcess
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.support import HTTP, GatewayProcess

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def rig() -> Iterator[tuple[list[SimProcess], list[GatewayProcess]]]:
    with contextlib.ExitStack() as stack:
        sims = [stack.enter_context(fast_sim("vllm")) for _ in range(4)]
        urls = [s.base_url for s in sims]
        gateways = [stack.enter_context(GatewayProcess(single_pool_config("vllm", urls))) for _ in range(2)]
        yield sims, gateways


def counts(sims: list[SimProcess]) -> list[int]:
    return [
        len(HTTP.get(s.base_url + "/sim/requests", params={"limit": 1000}).json()["requests"]) for s in sims
    ]


def turn(i: int, **session: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """A turn whose system prompt differs each time (an agent that rewrites it), naming its session."""
    headers = {"x-session-id": session.pop("header")} if "header" in session else {}
    messages = [{"role": "system", "content": f"Now is step {i}."}, {"role": "user", "content": f"turn {i}"}]
    return {"model": MODEL, "messages": messages, "max_tokens": 1, **session}, headers


@pytest.mark.parametrize(
    "session",
    [
        {"prompt_cache_key": "agent-1"},
        {"header": "agent-2"},
        {"metadata": {"session_id": "agent-3"}},
        {"user": "agent-4"},
    ],
    ids=["prompt_cache_key", "x-session-id", "metadata.session_id", "user"],
)
def test_a_sessions_turns_stay_on_one_backend_across_replicas(
    rig: tuple[list[SimProcess], list[GatewayProcess]], session: dict[str, Any]
) -> None:
    sims, gateways = rig
    before = counts(sims)
    for i in range(8):
        body, headers = turn(i, **dict(session))
        gw = gateways[i % 2]  # turns alternate between the replicas
        r = HTTP.post(gw.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=10)
        assert r.status_code == 200, r.text
    served = [after - b for after, b in zip(counts(sims), before, strict=True)]
    assert sorted(served) == [0, 0, 0, 8], served


def test_turns_without_a_session_and_changing_openings_spread(
    rig: tuple[list[SimProcess], list[GatewayProcess]],
) -> None:
    sims, gateways = rig
    before = counts(sims)
    for i in range(16):
        body, _ = turn(100 + i)
        assert (
            HTTP.post(gateways[0].base_url + "/v1/chat/completions", json=body, timeout=10).status_code == 200
        )
    served = [after - b for after, b in zip(counts(sims), before, strict=True)]
    assert sum(1 for n in served if n) > 1, served  # no session named: each opening its own key
