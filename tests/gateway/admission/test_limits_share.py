"""The routing state the limiter's scripts carry (gateway/core/shared_load.py), against a real
redis-server: several routing processes' in-flight counts, group placements (SET NX), leases of dead
processes, and that the limits and budgets decide exactly as without it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Mapping

import orjson
import pytest
from redis.asyncio import Redis

from gateway.admission.limits import Ticket
from gateway.admission.limits_redis import LOAD_KEY, PLACED_KEY, RedisLimiter, _others
from gateway.core.context import RequestContext
from gateway.core.redis_client import open_redis
from gateway.core.redis_wire import RespClient
from gateway.core.shared_load import ShareAsk
from policies.admission import Outcome, ScopeLimits
from policies.budgets import Budget, Charge
from policies.shared_load import PREFILL, SETS, PlacedBlocks
from tests.gateway.admission.test_budgets import calendar_meter, spend
from tests.support import RedisServer, until

pytestmark = pytest.mark.processes


class Share:
    """A routing process's side as the limiter sees it (`LoadShare`), with counts set by the test."""

    def __init__(self, process: str, lease_s: float = 10.0) -> None:
        self.process = process
        self.lease_s = lease_s
        self.placement_ttl_s = 60.0
        self.in_flight: dict[str, int] = {}
        self.others: Mapping[str, int] | None = None

    async def ask(self, ctx: RequestContext) -> ShareAsk:
        return ShareAsk(dict(self.in_flight))

    def told(self, ctx: RequestContext, ask: ShareAsk) -> None:
        pass

    def counts(self) -> Mapping[str, int]:
        return dict(self.in_flight)

    def heard(self, others: Mapping[str, int]) -> None:
        self.others = others


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = open_redis(redis_server.url)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture(params=["redis-py", "wire"])
async def processes(
    request: pytest.FixtureRequest, redis: Redis, redis_server: RedisServer
) -> AsyncIterator[list[tuple[RedisLimiter, Share]]]:
    """Three routing processes, each with its own limiter bound to its own share."""
    wires: list[RespClient] = []
    out: list[tuple[RedisLimiter, Share]] = []
    for name in ("a", "b", "c"):
        wire = RespClient(redis_server.url) if request.param == "wire" else None
        if wire is not None:
            wires.append(wire)
        limiter = RedisLimiter(redis, window_s=60.0, lease_s=30.0, wire=wire)
        share = Share(name, lease_s=0.6)
        limiter.bind_share(share)
        out.append((limiter, share))
    yield out
    for limiter, _ in out:
        await limiter.aclose()
    for wire in wires:
        await wire.aclose()


async def admit(limiter: RedisLimiter, share: Share, group: str | None = None, proposal: str | None = None,
                scopes: tuple[ScopeLimits, ...] = (), id: str = "r", candidates: tuple[str, ...] = (),
                blocks: int = 0) -> tuple[Outcome, ShareAsk]:  # fmt: skip
    ask = ShareAsk(share.counts(), group, proposal, candidates, blocks)
    verdict = await limiter.acquire(id, scopes, 10, None, ask)
    return verdict.outcome, ask


async def test_each_process_reads_the_sum_of_the_others_counts_not_its_own(
    processes: list[tuple[RedisLimiter, Share]],
) -> None:
    (la, a), (lb, b), (lc, c) = processes
    a.in_flight = {"vllm-0": 3, "vllm-1": 1}
    b.in_flight = {"vllm-0": 2}
    _, ask = await admit(la, a)
    assert ask.reply is not None and dict(ask.reply.others) == {}  # nobody else has spoken yet
    _, ask = await admit(lb, b)
    assert ask.reply is not None and dict(ask.reply.others) == {"vllm-0": 3, "vllm-1": 1}
    _, ask = await admit(lc, c)
    assert ask.reply is not None and dict(ask.reply.others) == {"vllm-0": 5, "vllm-1": 1}
    a.in_flight = {}  # a's requests ended: its next call says so
    _, ask = await admit(la, a)
    assert ask.reply is not None and dict(ask.reply.others) == {"vllm-0": 2}
    _, ask = await admit(lc, c)
    assert ask.reply is not None and dict(ask.reply.others) == {"vllm-0": 2}


async def test_every_kind_of_figure_and_name_comes_back_as_it_was_sent(
    processes: list[tuple[RedisLimiter, Share]],
) -> None:
    """The others' sums come back as they were sent (`_others`): working sets and queued prefill
    under their control-character prefixes, names with quotes, backslashes and non-ASCII letters, and
    figures of 14 digits, through the acquire and the renewer's report alike."""
    (la, a), (lb, b), _ = processes
    big = 10**13 + 7
    a.in_flight = {
        "vllm-0": 3,
        SETS + "vllm-0": big,
        PREFILL + "vllm-0": 40_000,
        'odd "name" \\ é': 1,
    }
    await admit(la, a)
    _, ask = await admit(lb, b)
    assert ask.reply is not None and dict(ask.reply.others) == a.in_flight
    assert all(type(v) is int for v in ask.reply.others.values())
    b.others = None
    await lb.report()
    assert b.others == a.in_flight
    a.in_flight = {}
    await admit(la, a)  # a has nothing left: b hears nobody
    await lb.report()
    assert b.others == {}


def test_an_answer_without_the_others_reads_as_nobody_elses() -> None:
    assert _others(1) == {} and _others(None) == {} and _others([]) == {}


def test_the_others_objects_are_summed_by_name_and_one_that_does_not_parse_counts_as_nothing() -> None:
    a, b = orjson.dumps({"s0": 2, "s1": 3}), orjson.dumps({"s1": 4, SETS + "s2": 10**13})
    assert _others([a]) == {"s0": 2, "s1": 3}
    assert _others([a, b, a]) == {"s0": 4, "s1": 10, SETS + "s2": 10**13}  # names differ
    assert _others([a, a, a]) == {"s0": 6, "s1": 9}  # the same names in the same order
    assert _others([b"{not json", a, orjson.dumps([1, 2]), b""]) == {"s0": 2, "s1": 3}


async def test_a_groups_first_proposal_wins_and_every_process_reads_it(
    processes: list[tuple[RedisLimiter, Share]], redis: Redis
) -> None:
    (la, a), (lb, b), (lc, c) = processes
    _, ask = await admit(la, a, "00000000000000aa", "sglang-2")
    assert ask.reply is not None and ask.reply.placed == "sglang-2" and ask.reply.fresh
    _, ask = await admit(lb, b, "00000000000000aa", "vllm-1")  # too late: a placed it
    assert ask.reply is not None and ask.reply.placed == "sglang-2" and not ask.reply.fresh
    _, ask = await admit(lc, c, "00000000000000aa", None)  # only reading
    assert ask.reply is not None and ask.reply.placed == "sglang-2" and not ask.reply.fresh
    _, ask = await admit(lc, c, "00000000000000bb", None)  # nobody placed this one
    assert ask.reply is not None and ask.reply.placed is None
    ttl = await redis.pttl("gw:rt:{rt}:g:00000000000000aa")
    assert 50_000 < ttl <= 60_000


async def test_a_burst_of_new_groups_from_several_processes_is_spread(
    processes: list[tuple[RedisLimiter, Share]], redis: Redis
) -> None:
    """Each process proposes the same backend for its new group (its own working sets are empty):
    the store places each on the candidate with the fewest placed blocks, so the three land on
    three backends; a fourth, between two equals (none placed), goes to its proposal."""
    (la, a), (lb, b), _ = processes
    three = ("s0", "s1", "s2")
    placed = []
    for i, (limiter, share) in enumerate(processes):
        _, ask = await admit(limiter, share, f"000000000000010{i}", "s0", candidates=three, blocks=100)
        assert ask.reply is not None
        placed.append(ask.reply.placed)
    assert placed == ["s0", "s1", "s2"]
    _, ask = await admit(la, a, "0000000000000110", "s4", candidates=("s4", "s3"), blocks=7)
    assert ask.reply is not None and ask.reply.placed == "s4"
    _, ask = await admit(lb, b, "0000000000000101", "s0", candidates=three, blocks=100)
    assert ask.reply is not None and ask.reply.placed == "s1"  # already placed: read, not charged
    loads = {
        k.decode(): float(v.decode().split("|")[0]) for k, v in (await redis.hgetall(PLACED_KEY)).items()
    }
    assert loads == pytest.approx({"s0": 100.0, "s1": 100.0, "s2": 100.0, "s4": 7.0}, rel=1e-6)
    assert 50_000 < await redis.pttl(PLACED_KEY) <= 60_000


async def test_the_store_places_as_policies_placed_blocks_does(
    processes: list[tuple[RedisLimiter, Share]],
) -> None:
    """The script and `policies.shared_load.PlacedBlocks` (the replay's store) choose alike over a
    random sequence of asks (the half-life, one placement ttl, is a minute: the test's second of
    decay moves no choice, the blocks being distinct)."""
    rng = random.Random(7)
    mirror = PlacedBlocks(half_life_ms=60_000.0)
    names = [f"b{i}" for i in range(5)]
    for i in range(60):
        limiter, share = processes[i % 3]
        candidates = tuple(rng.sample(names, rng.randint(1, 4)))
        blocks = rng.randint(1_000, 100_000)
        _, ask = await admit(
            limiter, share, f"{0x200 + i:016x}", candidates[0], candidates=candidates, blocks=blocks
        )
        assert ask.reply is not None
        assert ask.reply.placed == mirror.place(candidates, blocks, 0.0), i


async def test_a_rejected_request_reads_but_never_places(processes: list[tuple[RedisLimiter, Share]]) -> None:
    (la, a), (lb, b), _ = processes
    tight = (ScopeLimits("gw:rl:{u:bob}:u", "user bob", 1, 0, 0),)
    outcome, ask = await admit(la, a, "00000000000000cc", "vllm-0", tight, id="r1")
    assert outcome is Outcome.ADMITTED and ask.reply is not None and ask.reply.placed == "vllm-0"
    outcome, ask = await admit(lb, b, "00000000000000dd", "vllm-1", tight, id="r2")
    assert outcome is Outcome.REQUESTS
    assert ask.reply is not None and ask.reply.placed is None  # not routed: not placed
    a.in_flight = {"vllm-0": 1}
    outcome, ask = await admit(la, a, None, None, tight, id="r3")
    assert outcome is Outcome.REQUESTS and ask.reply is not None  # counts still travel


async def test_a_dead_process_counts_expire_after_one_lease(
    processes: list[tuple[RedisLimiter, Share]], redis: Redis
) -> None:
    (la, a), (lb, b), _ = processes
    a.in_flight = {"vllm-0": 7}
    await admit(la, a)  # a reports, then dies: no call, no renewal ever again
    await la.aclose()
    _, ask = await admit(lb, b)
    assert ask.reply is not None and dict(ask.reply.others) == {"vllm-0": 7}

    async def lapsed() -> bool:  # once its lease (0.6 s) has passed on Redis's clock
        _, ask = await admit(lb, b)
        return ask.reply is not None and dict(ask.reply.others) == {}

    await until(lapsed, what="a's lease to lapse")
    assert await redis.hexists(LOAD_KEY, "a") == 0  # deleted by the reader


async def test_the_finish_carries_the_counts_and_reads_nothing_back(
    processes: list[tuple[RedisLimiter, Share]],
) -> None:
    """A finish writes this process's counts; it reads nothing back (its request was routed, and the
    next admission reads the others': the sum is made once a request)."""
    (la, a), (lb, b), _ = processes
    a.in_flight = {"vllm-0": 1}
    await admit(la, a)
    b.in_flight = {"vllm-1": 4}
    await admit(lb, b)
    a.others = {"left": 1}  # what a heard last (unchanged by a finish)
    a.in_flight = {}  # a's request ended
    await la.finish(Ticket("r", (), 10), 10, None, share=True)
    assert a.others == {"left": 1}
    _, ask = await admit(lb, b)
    assert ask.reply is not None and dict(ask.reply.others) == {}
    _, ask = await admit(la, a)  # a's next admission reads b's
    assert ask.reply is not None and dict(ask.reply.others) == {"vllm-1": 4}


async def test_the_renewer_keeps_a_quiet_process_with_requests_in_flight_alive(
    processes: list[tuple[RedisLimiter, Share]],
) -> None:
    (la, a), (lb, b), _ = processes
    a.in_flight = {"vllm-0": 2}  # one long stream, no other traffic on a
    await admit(la, a)
    await asyncio.sleep(1.5)  # 2.5 leases on Redis's clock: only the renewer's reports keep a's counts
    _, ask = await admit(lb, b)
    assert ask.reply is not None and dict(ask.reply.others) == {"vllm-0": 2}
    a.in_flight = {}

    async def lapsed() -> bool:  # nothing in flight: the renewer stays quiet and the lease lapses
        _, ask = await admit(lb, b)
        return ask.reply is not None and dict(ask.reply.others) == {}

    await until(lapsed, what="a's lease to lapse")


async def test_limits_and_budgets_decide_alike_with_the_share_riding_along(redis: Redis) -> None:
    """The share's arguments come after the budgets': both must still be read right."""
    plain = RedisLimiter(redis, window_s=60.0, lease_s=30.0)
    shared = RedisLimiter(redis, window_s=60.0, lease_s=30.0)
    share = Share("p")
    share.in_flight = {"x": 1}
    shared.bind_share(share)
    scope = ScopeLimits("gw:rl:{u:carol}:u", "user carol", 0, 100, 0)
    month = calendar_meter(Budget("month", "usd", 10))
    outcomes = []
    for limiter, tag in ((plain, "a"), (shared, "b")):
        await redis.flushdb()
        got = []
        for i in range(3):
            ask = ShareAsk(share.counts(), "00000000000000ee", "x") if limiter is shared else None
            verdict = await limiter.acquire(f"{tag}{i}", (scope,), 40, spend(Charge(40, 4), month), ask)
            got.append((verdict.outcome, verdict.remaining_tokens))
            if ask is not None:
                assert ask.reply is not None and ask.reply.placed == "x"
        outcomes.append(got)
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][-1][0] is not Outcome.ADMITTED


async def test_the_others_figures_stay_exact_through_any_sequence_of_calls(
    processes: list[tuple[RedisLimiter, Share]], redis: Redis
) -> None:
    """Against a model (the sum of every other process's last figures), through 400 random calls of
    three processes: admissions, finishes and reports, figures raised, lowered and emptied, names
    appearing and leaving, 14-digit figures, and the store's hash lost at random (evicted, flushed:
    every process's figures gone until its next call)."""
    rng = random.Random(18)
    last: dict[str, dict[str, int]] = {}
    names = ["vllm-0", "vllm-1", "sglang-0", SETS + "vllm-0", PREFILL + "sglang-0", "odd é"]
    for step in range(400):
        limiter, share = processes[rng.randrange(3)]
        share.lease_s = 30.0
        if rng.random() < 0.15:
            share.in_flight = {}
        else:
            chosen = rng.sample(names, rng.randrange(1, len(names)))
            share.in_flight = {n: rng.choice((1, 2, 7, 10**13 + 7)) for n in chosen}
        if rng.random() < 0.05:
            await redis.delete(LOAD_KEY)
            last.clear()
        kind = rng.random()
        heard: dict[str, int] | None = None
        if kind < 0.5:
            _, ask = await admit(limiter, share, id=f"r{step}")
            assert ask.reply is not None
            heard = dict(ask.reply.others)
        elif kind < 0.8:
            await limiter.report()
            heard = dict(share.others or {})
        else:
            await limiter.finish(Ticket(f"r{step}", (), 0), 0, share=True)
        last[share.process] = dict(share.in_flight)
        if heard is not None:
            want: dict[str, int] = {}
            for process, figures in last.items():
                if process != share.process:
                    for n, v in figures.items():
                        want[n] = want.get(n, 0) + v
            assert heard == want, step
