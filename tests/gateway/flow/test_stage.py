"""gateway/flow/: the flow stage over an in-process fleet on virtual time. A backend is made saturated
by its queued prefill, and freed again by hand; the queue's release order, deadlines, refusals and
disconnects are asserted by order and counts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from engines.base import EngineLoad
from engines.errors import ApiError
from gateway.core.context import Principal, RequestContext
from gateway.core.fleet import Backend, Fleet
from gateway.core.settings import BackendSettings, HealthSettings, ModelSettings, PoolSettings
from gateway.flow import FlowSettings, FlowStage, build_flow
from gateway.flow.gate import SHED_REASONS
from tests.virtual_time import elapse, on_virtual_time, virtual_loop

MODEL = ModelSettings(name="m")
TIERS = {"chat": "interactive", "bulk": "batch"}


class Observer:
    def __init__(self) -> None:
        self.queued: dict[str, int] = {}
        self.shed: list[tuple[str, str]] = []
        self.engaged: list[bool] = []
        self.ttft: list[tuple[str, float | None, float | None]] = []

    def flow_queued(self, klass: str, waiting: int) -> None:
        self.queued[klass] = waiting

    def flow_waited(self, klass: str, seconds: float) -> None:
        pass

    def flow_shed(self, klass: str, reason: str) -> None:
        assert reason in SHED_REASONS
        self.shed.append((klass, reason))

    def flow_saturated(self, engaged: bool) -> None:
        self.engaged.append(engaged)

    def flow_ttft(self, klass: str, predicted: float | None, observed: float | None) -> None:
        self.ttft.append((klass, predicted, observed))


def setup(backends: int = 1, **flow: Any) -> tuple[FlowStage, Backend, Observer]:
    """The stage over one pool of `backends` backends (`b0`, `b1`, ...); the first one returned."""
    pool = PoolSettings(
        name="vllm",
        dialect="vllm",
        models={"m": "m"},
        backends=[BackendSettings(name=f"b{i}", url=f"http://127.0.0.1:{9000 + i}") for i in range(backends)],
    )
    fleet = Fleet([pool], HealthSettings(), 5.0)
    observer = Observer()
    stage = build_flow(FlowSettings(**flow), fleet, 5.0, lambda p: TIERS.get(p.tier), observer)
    return stage, fleet.backends["b0"], observer


class Tokens:
    """What the flow stage reads of a request's features."""

    def __init__(self, total_prompt_tokens: int) -> None:
        self.total_prompt_tokens = total_prompt_tokens


def learn(stage: FlowStage, backend: str, seconds_per_token: float) -> None:
    """First tokens from `backend` behind varied prefill, on a line through 0 of that slope."""
    for tokens in (500, 1000, 1500, 2000, 2500):
        stage.pressure.ttft.observe(backend, seconds_per_token * tokens, tokens)


async def _no_body() -> dict[str, Any]:
    await asyncio.Event().wait()  # the client never leaves unless the test says so
    return {"type": "http.disconnect"}


def request(
    user: str, tier: str = "default", headers: dict[bytes, bytes] | None = None
) -> tuple[RequestContext, list[Callable[[], None] | None]]:
    """A request, and where its disconnect callback lands (call it: the client left)."""
    leave: list[Callable[[], None] | None] = [None]

    def on_disconnect(callback: Callable[[], None] | None) -> None:
        leave[0] = callback

    ctx = RequestContext(
        request_id=user,
        endpoint="chat",
        started=0.0,
        headers=headers or {},
        receive=_no_body,
        on_disconnect=on_disconnect,
        body={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10},
        principal=Principal(user, tier=tier),
        model=MODEL,
    )
    return ctx, leave


def saturate(backend: Backend) -> None:
    """The engine's scrape shows a request waiting."""
    backend.scraped(EngineLoad(waiting=1.0), time.monotonic())


def free(stage: FlowStage, backend: Backend) -> None:
    backend.scraped(EngineLoad(waiting=0.0), time.monotonic())
    stage.gate.wake()


@on_virtual_time
async def test_below_saturation_a_request_passes_at_once_with_its_class() -> None:
    stage, _, observer = setup()
    ctx, _ = request("u", tier="chat")
    assert await stage(ctx) is None
    assert ctx.flow_class == "interactive" and not observer.engaged
    assert not any(h == b"x-gateway-queue-ms" for h, _ in ctx.response_headers)


@on_virtual_time
async def test_a_request_s_ttft_target_is_its_class_s() -> None:
    """What the engine comparison counts a request's first token against (`EngineStats`)."""
    stage, _, _ = setup()
    interactive, _ = request("u", tier="chat")
    standard, _ = request("v")
    assert stage.ttft_target(interactive) is None  # not resolved yet: no class
    await stage(interactive)
    await stage(standard)
    assert stage.ttft_target(interactive) == 1.0 and stage.ttft_target(standard) is None


@on_virtual_time
async def test_at_saturation_requests_wait_and_leave_by_class() -> None:
    stage, backend, observer = setup()
    saturate(backend)
    done: list[str] = []

    async def send(user: str, tier: str) -> None:
        ctx, _ = request(user, tier)
        await stage(ctx)
        done.append(user)
        assert any(h == b"x-gateway-queue-ms" for h, _ in ctx.response_headers)

    tasks = [asyncio.create_task(send(u, t)) for u, t in [("b1", "bulk"), ("s1", "default"), ("i1", "chat")]]
    await elapse(1.0)
    assert not done and observer.queued == {"batch": 1, "standard": 1, "interactive": 1}
    assert observer.engaged == [True]
    free(stage, backend)
    await asyncio.gather(*tasks)
    assert done == ["i1", "s1", "b1"]
    await elapse(1.0)
    assert observer.engaged == [True, False]


@on_virtual_time
async def test_a_request_past_its_deadline_is_shed_with_503() -> None:
    stage, backend, observer = setup()
    saturate(backend)
    ctx, _ = request("u", headers={b"x-gateway-max-queue-ms": b"300"})
    with pytest.raises(ApiError) as raised:
        await stage(ctx)
    assert raised.value.status == 503 and raised.value.code == "fleet_saturated"
    assert int(raised.value.headers["retry-after"]) >= 1
    assert virtual_loop().time() >= 0.3
    assert observer.shed == [("standard", "deadline")] and len(stage.gate.queue) == 0


@on_virtual_time
async def test_a_full_class_refuses_over_share_and_makes_room_below_it() -> None:
    """429 to a newcomer whose tenant holds its share; a newcomer below its share takes the place of
    the hog's last request, which gets the 429; a class that never waits answers 503."""
    classes = {
        "standard": {"priority": 1, "max_queue_s": 30, "max_queued": 2},
        "batch": {"priority": 2, "max_queue_s": 30, "max_queued": 0},
    }
    stage, backend, observer = setup(classes=classes)
    saturate(backend)
    first, last = (asyncio.create_task(stage(request("hog")[0])) for _ in range(2))
    await elapse(0.1)
    with pytest.raises(ApiError) as hog:
        await stage(request("hog")[0])
    assert (hog.value.status, hog.value.type, hog.value.code) == (429, "requests", "rate_limit_exceeded")
    other = asyncio.create_task(stage(request("other")[0]))
    await elapse(0.1)
    with pytest.raises(ApiError) as evicted:
        await last
    assert (evicted.value.status, evicted.value.code) == (429, "rate_limit_exceeded")
    assert "took this one's place" in evicted.value.message and not other.done()
    with pytest.raises(ApiError) as never:
        await stage(request("b", tier="bulk")[0])
    assert (never.value.status, never.value.code) == (503, "fleet_saturated")
    assert observer.shed == [("standard", "share"), ("standard", "share"), ("batch", "full")]
    free(stage, backend)
    assert await first is None and await other is None


@on_virtual_time
async def test_while_requests_wait_the_engines_are_read_often_and_a_drained_queue_releases() -> None:
    stage, backend, _ = setup()
    saturate(backend)
    reads: list[float] = []

    async def scrape() -> None:  # the engine's queue has drained by the third read
        reads.append(virtual_loop().time())
        backend.scraped(EngineLoad(waiting=1.0 if len(reads) < 3 else 0.0), time.monotonic())

    stage.gate.scrape = scrape
    task = asyncio.create_task(stage(request("u")[0]))
    await elapse(5.0)
    assert task.done() and task.result() is None
    assert len(reads) == 3 and reads == sorted(reads)  # no reads once nothing waits


@on_virtual_time
async def test_a_request_waits_for_the_pools_routing_leaves_it_not_for_any_other() -> None:
    pools = [
        PoolSettings(
            name=name,
            dialect=name,  # type: ignore[arg-type]
            models={"m": "m"},
            backends=[BackendSettings(name=f"{name}-0", url=f"http://127.0.0.1:{port}")],
        )
        for name, port in (("vllm", 9000), ("sglang", 9001))
    ]
    fleet = Fleet(pools, HealthSettings(), 5.0)
    stage = build_flow(FlowSettings(), fleet, 5.0, lambda p: None, Observer())
    saturate(fleet.backends["sglang-0"])
    stage.pools_for = lambda ctx: frozenset({"sglang"}) if ctx.request_id == "document" else None
    chat, _ = request("chat")
    assert await stage(chat) is None and chat.extras["flow_exclude"] == {"sglang-0"}
    document, _ = request("document")  # the rules send it to the saturated pool only
    task = asyncio.create_task(stage(document))
    await elapse(0.5)
    assert not task.done()
    free(stage, fleet.backends["sglang-0"])
    await elapse(0.1)
    assert task.done() and "flow_exclude" not in document.extras


@on_virtual_time
async def test_a_client_that_leaves_while_queued_is_out_of_the_queue_at_once() -> None:
    stage, backend, observer = setup()
    saturate(backend)
    ctx, leave = request("u")
    task = asyncio.create_task(stage(ctx))
    await elapse(0.1)
    callback = leave[0]
    assert callback is not None and len(stage.gate.queue) == 1
    callback()
    with pytest.raises(ApiError) as raised:
        await task
    assert raised.value.status == 499 and ctx.error_kind == "client_disconnect"
    assert observer.shed == [("standard", "disconnect")] and len(stage.gate.queue) == 0


@on_virtual_time
async def test_a_lower_class_waits_while_another_replica_has_a_higher_one_waiting() -> None:
    stage, _, _ = setup()
    others = {"interactive": 1}
    stage.gate.others = lambda: others
    ctx, _ = request("u", tier="bulk")
    task = asyncio.create_task(stage(ctx))
    await elapse(0.5)
    assert not task.done()  # the backend is free, but another replica's interactive request waits
    others.clear()
    await elapse(0.5)
    assert task.done() and task.result() is None


@on_virtual_time
async def test_flow_off_passes_everything_through() -> None:
    stage, backend, observer = setup(enabled=False)
    saturate(backend)
    ctx, _ = request("u", tier="bulk")
    assert await stage(ctx) is None and ctx.flow_class == "batch" and not observer.engaged


@on_virtual_time
async def test_a_class_with_a_ttft_target_avoids_backends_predicted_to_miss_it() -> None:
    stage, _, _ = setup(backends=2)
    learn(stage, "b0", 0.0001)
    learn(stage, "b1", 0.001)
    ctx, _ = request("u", tier="chat")
    ctx.extras["features"] = Tokens(2000)  # 0.2 s of prefill on b0, 2 s on b1: over the 1 s target
    assert await stage(ctx) is None
    assert ctx.extras["flow_exclude"] == {"b1"} and set(ctx.extras["flow_predicted"]) == {"b0", "b1"}
    standard, _ = request("v")
    standard.extras["features"] = Tokens(2000)
    assert await stage(standard) is None and "flow_exclude" not in standard.extras  # no target


@on_virtual_time
async def test_a_request_every_backend_would_miss_by_far_waits_until_one_would_not() -> None:
    classes = {
        "interactive": {"priority": 0, "max_queue_s": 5, "max_queued": 8, "ttft_target_s": 0.05},
        "standard": {"priority": 1, "max_queue_s": 20, "max_queued": 8},
        "batch": {"priority": 2, "max_queue_s": 20, "max_queued": 8},
    }
    stage, fast, _ = setup(backends=2, classes=classes)
    slow = stage.pressure.backends("m")[1]
    learn(stage, "b0", 0.0001)
    learn(stage, "b1", 0.001)
    fast.prefill, slow.prefill = 2000, 200  # 0.2 s ahead on each: not saturated, 4x the target
    held, _ = request("w", tier="chat")
    task = asyncio.create_task(stage(held))
    await elapse(0.2)
    assert not task.done() and stage.gate.queue.depth("interactive") == 1
    fast.prefill = 0
    stage.gate.wake()
    await elapse(0.1)
    assert task.done() and held.extras["flow_exclude"] == {"b1"}


def test_queued_prefill_saturates_a_backend_only_at_its_learned_rate() -> None:
    stage, backend, _ = setup()
    backend.prefill = 10**6
    assert not stage.pressure.is_saturated(backend, time.monotonic())  # no rate: tokens say nothing
    learn(stage, "b0", 0.001)
    backend.prefill = 300  # 0.3 s of prefill ahead
    assert stage.pressure.is_saturated(backend, time.monotonic())
    backend.prefill = 100
    assert not stage.pressure.is_saturated(backend, time.monotonic())


def test_a_scraped_queue_saturates_until_the_requests_since_have_started() -> None:
    stage, backend, _ = setup()
    now = 100.0
    backend.scraped(EngineLoad(waiting=1.0), now)
    assert stage.pressure.is_saturated(backend, now)
    backend.started += 1  # a first token since the scrape: the engine's queue moved up
    assert not stage.pressure.is_saturated(backend, now)
    assert not stage.pressure.is_saturated(backend, now + 60)  # a stale scrape says nothing


@on_virtual_time
async def test_a_class_with_kv_headroom_waits_while_a_more_urgent_one_passes() -> None:
    """Batch stops at 80 % of the engine's KV cache (the shipped class); interactive and standard
    go on up to saturation, and batch goes once the use falls below its limit."""
    stage, backend, observer = setup()
    backend.scraped(EngineLoad(waiting=0.0, running=4.0, kv_usage=0.85), time.monotonic())
    chat, _ = request("i", tier="chat")
    plain, _ = request("s")
    assert await stage(chat) is None and await stage(plain) is None
    bulk, _ = request("b", tier="bulk")
    waiting = asyncio.create_task(stage(bulk))
    await elapse(1.0)
    assert not waiting.done() and observer.queued == {"batch": 1}
    assert stage.pressure.saturated_backends(time.monotonic()) == []  # the fleet is not saturated
    backend.scraped(EngineLoad(waiting=0.0, running=4.0, kv_usage=0.5), time.monotonic())
    stage.gate.wake()
    assert await waiting is None and observer.queued == {"batch": 0}
