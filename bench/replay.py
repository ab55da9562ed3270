"""Offline replay of the routing bench: the real `policies.router.Router` in front of a discrete-event
model of the bench fleet, in about a second per point instead of minutes.

    python -m bench.replay                                   every workload, ours vs round robin, 80 %
    python -m bench.replay long_document_qa --load 0.5 --load 0.8 --replicas 1 --replicas 4 --seeds 2
    python -m bench.replay shared_prefix --policy least_load
    python -m bench.replay agent_tool_loop --load 0.5 --tail   the slowest first tokens taken apart
    python -m bench.replay multi_turn_chat --load 0.5 --policy clairvoyant --seeds 6
    python -m bench.replay --engine serial                   a serial fleet: one request at a time
    python -m bench.replay shared_prefix --baseline sglang_cache_aware --events 5 --shared
                                                             ours beside sglang-router's cache_aware

It replays the same seeded traces and Poisson schedules as bench/routing.py (same `FleetSpec`: 4 vLLM +
4 SGLang simulators, two pools of weight 0.5), and routes each request with one of `replicas`
independent `Router`s (each request goes to a random replica, as behind a load balancer: what
several gateway replicas with their own prefix indexes and working sets decide). The engines are the
simulators' own: `--engine batching` (the default) runs each backend's `step_model.StepEngine` (its
dialect's batching scheduler, KV pool and prefix cache, built from the fleet's simulator flags) in
virtual time, a step ending when its `duration_s` has passed; `--engine serial` a serial fleet
(one request at a time per engine, the simulators' `PrefixCache` and serial cost model). What it models of the gateway: every
replica's own in-flight counts, the engines' running / queued / KV figures as a scrape every
`scrape_s` seconds sees them (global, stale), and the warm-ups a decision asks for
(`gateway.routing.warmup`: a one-token prefill of a hot group's preamble on its next holder, counted
in the process's in-flight requests while it runs, not among the trace's requests). What it leaves
out: the network, the gateway's own latency, health checks, the simulators' wall-clock jitter.

Use it to try a routing change and its knobs before the real bench (`make bench`), which stays the
measurement of record: on the workloads in bench/BENCHMARKS.md it lands within a few points of the
real hit rates (it has no wall-clock noise, so a single seed is one sample, not the truth: compare
several seeds). Not a test; nothing here is asserted.

`sglang_cache_aware` is not a gateway policy either but a model of a peer, sglang-router's
`cache_aware` with its default arguments (`bench.replay_peers`): one router process per replica, each
with its own approximate tree of the text it sent, as running several of them behind a load balancer
would be (the wall-clock bench runs the real router as one process: compare with its x1 rows). Against
the real router's rows of the wall-clock matrix its hit rates land within a point on most prefix-heavy
points and its TTFT p99 within 10 % at 50 % load; at 80 % the two differ by up to half, either way:
use it to compare many schedules, not as the peer's measurement.

`clairvoyant` is not a gateway policy but a reference for what routing could reach on a point: every
request goes to the backend, of all eight, where its first token comes earliest, computed from what
no gateway can know - each engine's exact queue and the blocks actually in its cache (serial: the time
its FIFO drains, from the cost model; batching: the prefill tokens queued ahead of it, costed with the
step model at its step budget). It is greedy (it does not weigh what a cold copy evicts for later
requests), so it is a yardstick, not a strict bound; on the batching fleet it is a rough one (queued
prefills are costed, not simulated): on long documents at 50 % it copies documents to idle engines and
finds 67 % of the oracle (3 seeds), below prefix affinity's 94 % and round robin's 72 %.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import heapq
import itertools
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from bench.replay_peers import SGLANG_CACHE_AWARE, SglangCacheAware, text_chain
from bench.replay_share import EventFeed, SharedStore
from bench.routing import SERIAL, FleetSpec, _pct, make_point, prompt_ids
from bench.workloads import WORKLOADS, Request
from engines.sim.prefix_cache import Lease, PrefixCache, usable_hit
from engines.sim.step_model import (
    Batch,
    BlockEvent,
    ClearedBlocks,
    RemovedBlocks,
    Seq,
    StepEngine,
    StoredBlocks,
)
from policies.factory import PolicyConfig
from policies.features import extract_features
from policies.kv_blocks import PromptBlocks
from policies.kv_index import KvIndex
from policies.least_load import LeastLoadConfig
from policies.power_of_two import PowerOfTwoConfig
from policies.prefix_affinity import PrefixAffinityConfig
from policies.round_robin import RoundRobinConfig
from policies.router import Router
from policies.shared_load import SharedRouting, split
from policies.types import BackendView, FleetSnapshot, PoolView

MODEL = "bench-model"
CLAIRVOYANT: Literal["clairvoyant"] = "clairvoyant"
#: prefix affinity's exchange rate on the serial fleet, as it ran there (docs/routing.md)
SERIAL_BLOCKS_PER_REQUEST = 8.0
Policy = PolicyConfig | Literal["clairvoyant", "sglang_cache_aware"]
POLICIES: dict[str, Policy] = {
    "prefix_affinity": PrefixAffinityConfig(),
    "least_load": LeastLoadConfig(),
    "round_robin": RoundRobinConfig(),
    "power_of_two": PowerOfTwoConfig(),
    CLAIRVOYANT: CLAIRVOYANT,
    SGLANG_CACHE_AWARE: SGLANG_CACHE_AWARE,
}


@dataclass(frozen=True)
class FirstToken:
    """One request's first token, taken apart."""

    ttft_ms: float
    queued_ms: float  # waiting in the engine's queue
    prefill_ms: float  # the engine's fixed first-token time plus the uncached tokens' prefill
    prompt_tokens: int
    cached_tokens: int
    backend: str
    reason: str
    ahead: int  # requests in the engine (running + queued) when this one arrived
    sent_s: float = 0.0  # when it was sent, seconds into the run


@dataclass
class Result:
    workload: str
    load: float
    replicas: int
    requests: int
    hit_rate: float
    oracle_hit_rate: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    reasons: collections.Counter[str] = field(default_factory=collections.Counter)
    per_backend: dict[str, int] = field(default_factory=dict)
    slowest: list[FirstToken] = field(default_factory=list)  # the slowest 2 %
    answered: int = 0  # requests whose first token came

    @property
    def vs_oracle(self) -> float:
        return self.hit_rate / self.oracle_hit_rate if self.oracle_hit_rate else 0.0


WARM_IDS = 1 << 40  # the replay's warm-up requests' ids (not a trace's request)
OUTPUT_IDS = 1 << 21  # the replay's output token ids start above the tokenizer's (never a prefix hit)
ENGINES = {"batching": FleetSpec(), "serial": SERIAL}


class _BatchEngine:
    """One simulator on the batching engine: its step model and the step in flight."""

    __slots__ = ("batch", "ends", "model")

    def __init__(self, spec: FleetSpec, dialect: str, events: bool = False) -> None:
        cfg = spec.batch_config(dialect)
        self.model = StepEngine(dataclasses.replace(cfg, record_events=True) if events else cfg)
        self.batch: Batch | None = None  # the step running now
        self.ends = 0.0  # when it ends


class _Engine:
    """One simulator: a FIFO queue in front of `slots` sequences, and its prefix cache."""

    __slots__ = ("cache", "drains", "in_use", "queue", "running")

    def __init__(self, spec: FleetSpec) -> None:
        self.cache = PrefixCache(spec.block_size, spec.cache_blocks)
        self.queue: collections.deque[int] = collections.deque()
        self.running = 0
        self.in_use = 0  # tokens of the running requests (the engine's KV use)
        self.drains = 0.0  # when its running and queued requests will have finished (clairvoyant only)


def replay(
    workload: str,
    policy: Policy,
    *,
    load: float,
    seconds: float = 20.0,
    replicas: int = 1,
    seed: int = 0,
    scrape_s: float = 0.5,
    spec: FleetSpec | None = None,
    kv_events: EventFeed | None = None,
    shared: bool = False,
) -> Result:
    """One point of the routing bench, replayed offline (see the module docstring). `events`: the
    engines publish their KV-cache events to every routing process's index (`kv_events`); `shared`: the processes
    share their in-flight counts and group placements through a modelled Redis
    (`bench.replay_share`)."""
    spec = spec or FleetSpec()
    point = make_point(workload, load, seconds, spec, seed)  # the bench's own trace and schedule
    if kv_events is not None and not spec.batching:
        raise ValueError("KV events need the batching engine")
    run = _Replay(point.trace, policy, spec, replicas, seed, scrape_s, kv_events, shared)
    run.run(point.times)
    return run.result(workload, load, point.oracle_rate)


class _Replay:
    """One replay in virtual time: the fleet's engines, the routing processes and their event queue.
    `run` pops the events in time order; each kind has its handler:

    - `due`: a request's time has come; a conversation's next turn waits for the previous one;
    - `send`: a process (picked at random, as by a load balancer) routes it, its engine takes it;
    - `step` (batching): an engine's step ends; first tokens, finished requests, KV events;
    - `kv`: a batch of KV events reaches one process's index;
    - `done` (serial): a request leaves its engine, the next queued one starts.
    """

    def __init__(
        self,
        trace: Sequence[Request],
        policy: Policy,
        spec: FleetSpec,
        replicas: int,
        seed: int,
        scrape_s: float,
        kv_events: EventFeed | None,
        shared: bool,
    ) -> None:
        self.trace, self.spec, self.replicas, self.scrape_s = trace, spec, replicas, scrape_s
        self.kv_events = kv_events
        self.names = {e: [f"{e}-{i}" for i in range(spec.per_engine)] for e in ("vllm", "sglang")}
        self.every = every = self.names["vllm"] + self.names["sglang"]
        self.batching = batching = spec.batching
        self.engines = {b: _Engine(spec) for b in every} if not batching else {}
        self.feeds = feeds = kv_events is not None
        self.steppers = {b: _BatchEngine(spec, b.split("-")[0], feeds) for b in every} if batching else {}
        self.index = {b: k for k, b in enumerate(every)}
        self._processes(policy, seed, shared)
        self._requests()
        self.events: list[tuple[float, int, str, int]] = []
        self.seq = 0
        self.scraped = dict.fromkeys(every, (0.0, 0.0, 0.0))
        self.next_scrape = 0.0
        self.sent: dict[int, float] = {}
        self.where: dict[int, tuple[int, str]] = {}
        self.why: dict[int, tuple[str, int]] = {}
        self.firsts: list[FirstToken] = []
        self.leases: dict[int, Lease] = {}
        self.admitted_at: dict[int, float] = {}
        self.cached_total = self.prompt_total = 0
        self.reasons: collections.Counter[str] = collections.Counter()
        self.served: collections.Counter[str] = collections.Counter()
        self.warm_ids = itertools.count(WARM_IDS)

    def _processes(self, policy: Policy, seed: int, shared: bool) -> None:
        """The routing processes: their routers (or the baseline's), indexes and shared store."""
        every, replicas = self.every, self.replicas
        self.routers = (
            [] if isinstance(policy, str) else [Router(policy_config=policy) for _ in range(replicas)]
        )
        self.clairvoyant = policy == CLAIRVOYANT  # the yardstick routes by itself
        # sglang-router's cache_aware, modelled (`bench.replay_peers`): one router process per replica
        self.peers = (
            [SglangCacheAware(every, seed=seed + p) for p in range(replicas)]
            if policy == SGLANG_CACHE_AWARE
            else []
        )
        self.chains = [text_chain(r.messages) for r in self.trace] if self.peers else []
        self.indexes: list[KvIndex | None] = [r.kv_index if self.feeds else None for r in self.routers]
        for kv in self.indexes:
            if kv is not None:
                for b in every:
                    kv.attach(b)
                    kv.set_live(b, True)
        self.store = SharedStore(replicas) if shared else None
        self.shares = [SharedRouting(r) for r in self.routers] if shared else []
        self.others: list[dict[str, int]] = [{} for _ in range(replicas)]  # the others' counts as last read
        self.elsewhere: list[dict[str, int]] = [{} for _ in range(replicas)]  # ... and working sets
        self.queued: list[dict[str, int]] = [{} for _ in range(replicas)]  # ... and queued prefill tokens
        self.lose = random.Random(4321 + seed)
        self.deliveries: dict[int, tuple[int, str, list[BlockEvent] | None]] = {}
        self.delivery_ids = itertools.count()
        self.own = [dict.fromkeys(every, 0) for _ in range(replicas)]  # each replica's in-flight counts
        # ... and prefill tokens sent and not yet answered with a first token (`BackendView.prefill`)
        self.own_prefill = [dict.fromkeys(every, 0) for _ in range(replicas)]
        self.prefill_of: dict[int, int] = {}  # request (or warm-up) -> the tokens it added there
        self.pick_replica = random.Random(1234 + seed)
        self.rand = random.Random(seed)

    def _requests(self) -> None:
        """The trace's prompts as token ids and features, and the order of each conversation's turns."""
        spec = self.spec
        self.ids = ids = [prompt_ids(r) for r in self.trace]
        features = [extract_features(r.body(MODEL)) for r in self.trace]
        if self.feeds:  # the request's tokens, as the gateway's `sim` tokenizer gives them
            features = [
                dataclasses.replace(f, prompt=PromptBlocks(x)) for f, x in zip(features, ids, strict=True)
            ]
        self.features = features
        self.blocks = [PrefixCache.block_keys(x, spec.block_size) if self.clairvoyant else [] for x in ids]
        self.cache_tokens = spec.cache_blocks * spec.block_size
        # a conversation's next turn is sent when the previous one has finished (as the trace runner does)
        self.after: dict[int, int] = {}
        last: dict[str, int] = {}
        for i, r in enumerate(self.trace):
            if r.session:
                if r.session in last:
                    self.after[i] = last[r.session]
                last[r.session] = i
        self.done: set[int] = set()
        self.blocked: dict[int, list[int]] = collections.defaultdict(list)

    # -- the event loop ----------------------------------------------------------------------------
    def run(self, times: Sequence[float]) -> None:
        for i, t in enumerate(times):
            self.push(t, "due", i)
        events = self.events
        while events:
            now, _, kind, i = heapq.heappop(events)
            if kind == "due":
                prev = self.after.get(i)
                if prev is not None and prev not in self.done:
                    self.blocked[prev].append(i)
                    continue
                kind = "send"
            if kind == "send":
                self.send(i, now)
            elif kind == "step":
                self.step_done(self.every[i], now)
            elif kind == "kv":
                self.deliver(i, now)
            else:  # done
                self.serial_done(i, now)

    def push(self, t: float, kind: str, i: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, i))

    def result(self, workload: str, load: float, oracle_rate: float) -> Result:
        n = len(self.trace)
        ttft = [x.ttft_ms for x in self.firsts]
        return Result(
            workload=workload,
            load=load,
            replicas=self.replicas,
            requests=n,
            hit_rate=self.cached_total / self.prompt_total if self.prompt_total else 0.0,
            oracle_hit_rate=oracle_rate,
            ttft_p50_ms=_pct(ttft, 50),
            ttft_p99_ms=_pct(ttft, 99),
            reasons=self.reasons,
            per_backend={b: self.served[b] for b in self.every},
            slowest=sorted(self.firsts, key=lambda x: -x.ttft_ms)[: max(1, n // 100) * 2],
            answered=len(self.firsts),
        )

    # -- routing -----------------------------------------------------------------------------------
    def send(self, i: int, now: float) -> None:
        """Request `i` goes out: a process picked at random routes it, and its engine takes it."""
        spec = self.spec
        self.sent[i] = now
        replica = self.pick_replica.randrange(self.replicas)
        reason: str = CLAIRVOYANT
        queues = 0  # the prompt tokens our router expects the backend to prefill (`Decision.prefill`)
        if self.clairvoyant:
            b = self.earliest(i, now)
        elif self.peers:
            b, why_peer = self.peers[replica].select(self.chains[i], self.own[replica])
            reason = f"cache_aware:{why_peer}"
        else:
            b, reason, queues = self.route(i, now, replica)
        self.reasons[reason] += 1
        self.served[b] += 1
        self.where[i] = (replica, b)
        self.own[replica][b] += 1
        if queues and self.batching:
            self.prefill_of[i] = queues
            self.own_prefill[replica][b] += queues
        if self.batching:
            st = self.steppers[b]
            self.why[i] = (reason, len(st.model.running) + len(st.model.waiting))
            out = [OUTPUT_IDS + i * spec.output_tokens + k for k in range(spec.output_tokens)]
            st.model.add(
                Seq(i, self.ids[i], spec.output_tokens, output_ids=out, max_new=self.trace[i].max_tokens)
            )
            if st.batch is None:
                self.plan(b, now)
            return
        e = self.engines[b]
        self.why[i] = (reason, e.running + len(e.queue))
        if e.running < spec.max_num_seqs:
            self.start(b, i, now)
        else:
            e.queue.append(i)

    def route(self, i: int, now: float, replica: int) -> tuple[str, str, int]:
        """Our router's decision for request `i` in process `replica` (after the shared store's call,
        when shared), starting the warm-up it asks for: its backend, reason and expected prefill."""
        kv = self.indexes[replica]
        if kv is not None:
            kv.tick(now)
        f = self.features[i]
        if self.store is not None:
            # the admission's call: this process's counts out, the others' in, and the
            # placement of the request's group (set to this process's proposal if none)
            ask = self.shares[replica].ask(
                functools.partial(self.snapshot, now, replica),
                f,
                bool(self.others[replica]),
                self.elsewhere[replica],
            )
            self.talk(replica)
            if ask is not None:
                placed, fresh = self.store.place(ask, now)
                self.shares[replica].learn(ask.key, placed)
                f = SharedRouting.placed(f, placed, not fresh)
        d = self.routers[replica].decide(self.snapshot(now, replica), f, self.rand.random())
        if d.warm is not None and self.batching:
            self.warm_up(i, now, replica, d.warm, d.warm_tokens)
        return d.backend, d.reason, d.prefill

    def warm_up(self, i: int, now: float, replica: int, backend: str, tokens: int) -> None:
        """The gateway's warm-up (gateway.routing.warmup): a one-token prefill of request `i`'s first
        `tokens` (its group's preamble) on `backend`, in the process's in-flight count meanwhile."""
        w = next(self.warm_ids)
        self.reasons["warm-up"] += 1
        self.where[w] = (replica, backend)
        self.own[replica][backend] += 1
        self.prefill_of[w] = tokens
        self.own_prefill[replica][backend] += tokens
        st = self.steppers[backend]
        st.model.add(Seq(w, self.ids[i][:tokens], 1, output_ids=[OUTPUT_IDS * 2 + w], max_new=1))
        if st.batch is None:
            self.plan(backend, now)

    def load_of(self, b: str) -> tuple[float, float, float]:
        """Running, queued and KV use of a backend, as its metrics show them."""
        if self.batching:
            m = self.steppers[b].model
            return float(len(m.running)), float(len(m.waiting)), m.kv_usage
        e = self.engines[b]
        return float(e.running), float(len(e.queue)), min(1.0, e.in_use / self.cache_tokens)

    def snapshot(self, now: float, replica: int) -> FleetSnapshot:
        """The fleet as process `replica` sees it: its own counts and the others' as last heard, the
        engines' figures as last scraped."""
        if now >= self.next_scrape:
            self.next_scrape = now + self.scrape_s
            for b in self.every:
                self.scraped[b] = self.load_of(b)
        own, own_prefill = self.own[replica], self.own_prefill[replica]
        others, queued, scraped = self.others[replica], self.queued[replica], self.scraped
        return FleetSnapshot(
            tuple(
                PoolView(
                    name=e,
                    dialect=e,
                    weight=0.5,
                    models=frozenset({MODEL}),
                    tool_calling=True,
                    structured_output=True,
                    backends=tuple(
                        BackendView(
                            b,
                            in_flight=own[b] + others.get(b, 0),
                            prefill=own_prefill[b] + queued.get(b, 0),
                            running=scraped[b][0],
                            queue_depth=scraped[b][1],
                            kv_usage=scraped[b][2],
                        )
                        for b in self.names[e]
                    ),
                )
                for e in ("vllm", "sglang")
            )
        )

    def talk(self, replica: int) -> None:
        """A call to the store: this process's counts and working sets out, the others' in. A
        baseline without our routers (round robin, sglang-router's model) reports its counts alone."""
        assert self.store is not None
        own = self.own[replica]
        report = self.shares[replica].report(own, self.own_prefill[replica]) if self.shares else own
        self.others[replica], self.elsewhere[replica], self.queued[replica] = split(
            self.store.call(replica, report)
        )

    # -- the clairvoyant yardstick -----------------------------------------------------------------
    def earliest(self, i: int, now: float) -> str:
        """The clairvoyant choice: the backend where request `i`'s first token comes earliest."""
        spec = self.spec
        size = len(self.ids[i])
        best, best_t, best_cached = self.every[0], math.inf, 0
        for b in self.every:
            if self.batching:
                t = self.batch_first_token(self.steppers[b], i, now)
                if t < best_t:
                    best, best_t = b, t
                continue
            e = self.engines[b]
            cached = usable_hit(e.cache.hit_blocks(self.blocks[i]) * spec.block_size, size, spec.block_size)
            t = max(now, e.drains) + spec.first_token_s(size, cached)
            if t < best_t:
                best, best_t, best_cached = b, t, cached
        if not self.batching:
            e = self.engines[best]
            e.drains = max(now, e.drains) + spec.service_s(size, best_cached)
        return best

    def batch_first_token(self, e: _BatchEngine, i: int, now: float) -> float:
        """Batching: when request `i`'s first token would come on this engine, if nothing else
        arrived - the prefill tokens ahead of it (queued and unfinished) and its own uncached ones,
        at the step budget, each step also carrying the running decodes."""
        ids, blocks, bs = self.ids, self.blocks, self.spec.block_size
        m = e.model
        size = len(ids[i])
        cfg = m.cfg
        cached = usable_hit(m.cache.hit_blocks(blocks[i]) * bs, size, bs)
        ahead = sum(  # what the queued requests will prefill, their cached prefixes not counted
            len(ids[s.id]) - usable_hit(m.cache.hit_blocks(blocks[s.id]) * bs, len(ids[s.id]), bs)
            for s in m.waiting
        )
        ahead += sum(s.target - s.computed for s in m.running if s.target - s.computed > 1)
        tokens = ahead + size - cached
        budget = cfg.max_num_batched_tokens if cfg.flavour == "vllm" else cfg.chunked_prefill_size
        steps = max(1, -(-tokens // max(1, budget)))
        costs = cfg.costs
        decodes = len(m.running)
        context = sum(s.computed for s in m.running)
        per_step = costs.fixed_s + costs.decode_seq_s * decodes + costs.context_token_s * context
        return (
            max(now, e.ends if e.batch is not None else now)
            + steps * per_step
            + costs.prefill_token_s * tokens
        )

    # -- the serial engines --------------------------------------------------------------------------
    def start(self, b: str, i: int, now: float) -> None:
        """Serial: request `i` starts on engine `b`; its first token and its end follow from the cost
        model."""
        spec = self.spec
        e = self.engines[b]
        e.running += 1
        lease = e.cache.acquire(self.ids[i])
        self.leases[i] = lease
        size = len(self.ids[i])
        cached = usable_hit(lease.cached_tokens, size, spec.block_size)
        self.cached_total += cached
        self.prompt_total += size
        e.in_use += size + spec.output_tokens
        first = spec.first_token_s(size, cached)
        reason, ahead = self.why[i]
        sent = self.sent[i]
        queued = now - sent
        self.firsts.append(
            FirstToken(
                (queued + first) * 1000, queued * 1000, first * 1000, size, cached, b, reason, ahead, sent
            )
        )
        self.push(now + spec.service_s(size, cached), "done", i)

    def serial_done(self, i: int, now: float) -> None:
        """Serial: request `i` leaves its engine, which starts the next one queued."""
        _, b = self.where[i]
        e = self.engines[b]
        e.cache.release(self.leases.pop(i))
        e.in_use -= len(self.ids[i]) + self.spec.output_tokens
        e.running -= 1
        self.finished(i, now)
        if e.queue:
            self.start(b, e.queue.popleft(), now)

    def finished(self, i: int, now: float) -> None:
        """Request `i` left its engine: the replica's count drops, the conversation's next turn goes."""
        replica, b = self.where[i]
        self.own[replica][b] -= 1
        if self.store is not None:  # the finish's call carries this process's counts
            self.talk(replica)
        self.done.add(i)
        for j in self.blocked.pop(i, []):
            self.push(now, "send", j)

    # -- the batching engines ------------------------------------------------------------------------
    def plan(self, b: str, now: float) -> None:
        """Batching: schedule the engine's next step (none when it is idle)."""
        e = self.steppers[b]
        batch = e.model.schedule()
        e.batch = batch
        if batch is None:
            return
        for s in batch.admitted:
            if s.id >= WARM_IDS:
                continue
            self.admitted_at[s.id] = now
            self.cached_total += s.cached_tokens
            self.prompt_total += s.prompt_len
        e.ends = now + batch.duration_s
        self.push(e.ends, "step", self.index[b])

    def step_done(self, b: str, now: float) -> None:
        """Batching: engine `b`'s step ends: its first tokens, its finished requests, its events; then
        its next step."""
        e = self.steppers[b]
        assert e.batch is not None
        result = e.model.complete(e.batch)
        if self.feeds and result.events:
            self.publish(b, result.events, now)
        for s in result.emitted:
            if s.generated == 1 and s.id in self.prefill_of:
                replica, w = self.where[s.id]
                self.own_prefill[replica][w] -= self.prefill_of.pop(s.id)
            if s.generated == 1 and s.id < WARM_IDS:
                self.first_token(s, b, now)
        for s in result.finished:
            if s.id >= WARM_IDS:  # a warm-up: it counted in its process's in-flight requests
                replica, w = self.where.pop(s.id)
                self.own[replica][w] -= 1
                continue
            self.finished(s.id, now)
        self.plan(b, now)

    def first_token(self, s: Seq, b: str, now: float) -> None:
        """Batching: request `s`'s first token came at the end of a step of engine `b`."""
        i = s.id
        reason, ahead = self.why[i]
        sent, admitted = self.sent[i], self.admitted_at[i]
        queued = admitted - sent
        first = now - admitted
        self.firsts.append(
            FirstToken(
                (now - sent) * 1000,
                queued * 1000,
                first * 1000,
                s.prompt_len,
                s.cached_tokens,
                b,
                reason,
                ahead,
                sent,
            )
        )

    # -- KV events -----------------------------------------------------------------------------------
    def publish(self, b: str, batch: list[BlockEvent], now: float) -> None:
        """An engine step's events, on their way to every routing process's index."""
        feed = self.kv_events
        assert feed is not None
        for p, kv in enumerate(self.indexes):
            if kv is None:
                continue
            lost = feed.loss > 0 and self.lose.random() < feed.loss
            k = next(self.delivery_ids)
            self.push(now + feed.delay_s, "kv", k)
            self.deliveries[k] = (p, b, None if lost else batch)

    def deliver(self, k: int, now: float) -> None:
        """Delivery `k` reaches its process's index: a lost one is a gap."""
        p, b, batch = self.deliveries.pop(k)
        kv = self.indexes[p]
        assert kv is not None
        kv.tick(now)
        if batch is None:
            kv.gap(b)
            return
        bs = self.spec.block_size
        for ev in batch:
            if isinstance(ev, StoredBlocks):
                kv.stored(b, ev.keys, ev.parent, ev.token_ids, bs)
            elif isinstance(ev, RemovedBlocks):
                kv.removed(b, ev.keys)
            elif isinstance(ev, ClearedBlocks):
                kv.cleared(b)


def main(argv: Sequence[str] | None = None) -> None:
    ap = _parser()
    args = ap.parse_args(argv)
    options = {k: yaml.safe_load(v) for k, _, v in (o.partition("=") for o in args.option)}
    feed = None if args.events is None else EventFeed(args.events / 1000, args.event_loss)
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload {unknown[0]!r} (choose from {', '.join(WORKLOADS)})")
    names = (args.policy, *(args.baseline or ["round_robin"]))
    configs = [(name, _config(ap, args, name, options)) for name in names]
    table: list[tuple[str, float, int, dict[str, tuple[float, float]]]] = []
    for workload in args.workloads:
        for load in args.load or [0.8]:
            for replicas in args.replicas or [1]:
                row, cells, tails = _point(args, configs, feed, workload, load, replicas)
                table.append((workload, load, replicas, row))
                print(f"{workload:<17} {load:4.0%} x{replicas}  " + " | ".join(cells), flush=True)
                _print_tails(tails)
    if args.table:
        print(markdown(table, names))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("workloads", nargs="*", default=list(WORKLOADS), metavar="WORKLOAD")
    ap.add_argument("--policy", choices=list(POLICIES), default="prefix_affinity")
    ap.add_argument(
        "--baseline",
        choices=list(POLICIES),
        action="append",
        help="compared policy (repeatable; round_robin)",
    )
    ap.add_argument("--load", type=float, action="append", help="fraction of capacity (repeatable; 0.8)")
    ap.add_argument("--replicas", type=int, action="append", help="gateway replicas (repeatable; 1)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--seeds", type=int, default=1, help="schedules per point (their mean is printed)")
    ap.add_argument("--reasons", action="store_true", help="print the routing reasons' counts")
    ap.add_argument("--tail", action="store_true", help="take apart the slowest 2 %% of first tokens")
    ap.add_argument(
        "--engine",
        choices=list(ENGINES),
        default="batching",
        help="the fleet's engines: batching (the simulators' default) or serial (one request at a time)",
    )
    ap.add_argument(
        "--events",
        type=float,
        metavar="DELAY_MS",
        help="the engines publish KV-cache events, reaching every routing process DELAY_MS later",
    )
    ap.add_argument("--event-loss", type=float, default=0.0, help="chance a process misses an event batch")
    ap.add_argument(
        "--shared", action="store_true", help="in-flight counts and group placements shared (modelled Redis)"
    )
    ap.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a prefix affinity config field for --policy (repeatable; YAML values, e.g. load_factor=0.5)",
    )
    ap.add_argument(
        "--table", action="store_true", help="also print a markdown table of every point at the end"
    )
    return ap


def _config(
    ap: argparse.ArgumentParser, args: argparse.Namespace, name: str, options: dict[str, Any]
) -> Policy:
    """Policy `name`'s config: `--option` applies to `--policy`; on the serial fleet prefix
    affinity keeps the exchange rate it ran with there."""
    config = POLICIES[name]
    if options and name == args.policy and not isinstance(config, str):
        try:
            config = with_options(config, options)
        except (TypeError, ValueError) as exc:
            ap.error(f"--option: {exc}")
    serial = args.engine == "serial" and isinstance(config, PrefixAffinityConfig)
    if serial and "blocks_per_request" not in options:
        config = dataclasses.replace(config, blocks_per_request=SERIAL_BLOCKS_PER_REQUEST)
    return config


def _point(
    args: argparse.Namespace,
    configs: Sequence[tuple[str, Policy]],
    feed: EventFeed | None,
    workload: str,
    load: float,
    replicas: int,
) -> tuple[dict[str, tuple[float, float]], list[str], dict[str, list[FirstToken]]]:
    """Every policy on one point, over the seeds: its row of the table (hit rate ÷ the oracle's and
    TTFT p99, means), the line's cells, and the slowest first tokens when `--tail` asks for them."""
    cells = []
    row: dict[str, tuple[float, float]] = {}
    tails: dict[str, list[FirstToken]] = {}
    for name, config in configs:
        runs = [
            replay(
                workload,
                config,
                load=load,
                seconds=args.seconds,
                replicas=replicas,
                seed=s,
                spec=ENGINES[args.engine],
                kv_events=feed,
                shared=args.shared,
            )
            for s in range(args.seeds)
        ]
        vs = statistics.fmean(r.vs_oracle for r in runs)
        p99 = statistics.fmean(r.ttft_p99_ms for r in runs)
        row[name] = (vs, p99)
        cells.append(f"{name} {vs:4.0%} of oracle, TTFT p99 {p99:6.0f} ms")
        if args.reasons and name == args.policy:
            total: collections.Counter[str] = collections.Counter()
            for r in runs:
                total.update(r.reasons)
            cells.append(str(dict(total.most_common())))
        if args.tail:
            tails[name] = [s for r in runs for s in r.slowest]
    return row, cells, tails


def _print_tails(tails: Mapping[str, list[FirstToken]]) -> None:
    for name, slowest in tails.items():
        print(f"  slowest first tokens, {name}:")
        for x in sorted(slowest, key=lambda x: -x.ttft_ms):
            print(
                f"    {x.ttft_ms:6.0f} ms = queued {x.queued_ms:6.0f} + prefill {x.prefill_ms:5.0f}"
                f"  prompt {x.prompt_tokens:5d} cached {x.cached_tokens:5d}"
                f"  {x.ahead} ahead on {x.backend} ({x.reason}) at {x.sent_s:4.1f} s"
            )


def with_options(config: PolicyConfig, options: Mapping[str, Any]) -> PolicyConfig:
    """`config` with the `--option` values: its fields by name, and a field that is itself a
    config (prefix affinity's `load` and `kv`) from a mapping of its own fields."""
    values = dict(options)
    for name, value in options.items():
        part = getattr(config, name, None)
        if isinstance(value, Mapping) and part is not None and dataclasses.is_dataclass(part):
            values[name] = dataclasses.replace(part, **value)  # type: ignore[type-var]
    return dataclasses.replace(config, **values)


def markdown(
    table: Sequence[tuple[str, float, int, dict[str, tuple[float, float]]]], names: Sequence[str]
) -> str:
    """The points as a markdown table: per policy its hit rate ÷ the oracle's and TTFT p99 (means
    over the seeds), and the first policy's p99 ÷ each other's."""
    first, others = names[0], names[1:]
    head = ["workload", "load", "processes"] + [f"{n} (hit ÷ oracle, p99 ms)" for n in names]
    head += [f"p99 ÷ {n}" for n in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for workload, load, replicas, row in table:
        cells = [f"`{workload}`", f"{load:.0%}", str(replicas)]
        cells += [f"{row[n][0]:.0%}, {row[n][1]:,.0f}" for n in names]
        cells += [f"{row[first][1] / row[n][1]:.2f}×" if row[n][1] else "—" for n in others]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
