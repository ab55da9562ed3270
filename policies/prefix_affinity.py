"""Prefix affinity ("ours"): bounded-load rendezvous hashing on a prefix *group*, with a cost rule that
trades a warm cache against a queue, refined by a bounded local prefix index.

1. Key (`routing_key`). When the preamble (tool schemas + system/developer messages) is at least
   `group_min_blocks` long, the key is the chained hash of its last block,
   `block_hashes[preamble_blocks - 1]`: every request that shares that preamble (whatever its
   question, whichever turn) has the same key, so a long shared prefix concentrates on few backends
   instead of being cached by all of them. A short preamble with a long opening (a long document in
   the first message, then a question) is a group too: the key is the hash of the opening's first
   `group_min_blocks` blocks (`group_blocks`). Otherwise the key is the conversation anchor (tool schemas
   + system prompt + first user message; optionally mixed with `session_key`): conversations that
   share only a short system prompt spread. Either way every turn of a conversation has the same key.
   The router uses the same key for the pool choice, so a group is not duplicated across pools.
2. Rendezvous (HRW) order. Each routable backend scores `mix64(key ^ hash64(name))`; the highest is the
   key's *home*, the rest its ordered fallbacks. Every replica with the same snapshot computes the same
   order without talking to the others; removing a backend only moves the keys whose home it was.
3. Expected warm blocks. Anchor mode: only blocks past the preamble count (a short shared system
   prompt is assumed warm everywhere - unless every engine's events say where it is held, 5.); when
   this replica's `PrefixIndex` knows a prefix of the request past the preamble (an earlier turn,
   the same document, a spill) its depths are used,
   otherwise the home is assumed to hold the history (`history_blocks`) - the same assumption on every
   replica. Group mode: all blocks count; the index (which records the preamble's last block and
   every block after it) is used when it knows anything of the request, otherwise the group is new
   here and is placed on the first of its first `group_choices` backends (HRW order) whose working
   set (`policies.working_sets`: blocks this replica recently sent there) is within
   `placement_slack` groups of the smallest of them, so new groups spread over the caches more
   evenly than hashing throws them while replicas - whose working sets are their own - still mostly
   pick the same backend (the strictly smallest flips between replicas on near-ties). Opening groups
   (a long first message, no long preamble) take the strictly smallest: most are never repeated
   (uniform traffic), and there the working sets act as the load balancer. A placement proposed to
   the processes' shared store (`proposing`, `placement_choices`) also counts each backend's tails,
   a block for each request of its groups, so that a busy group's home is not taken for as light as
   an idle one's (the store makes the processes agree, where the tails alone would not); for an
   opening group it adds the other processes' working sets and tails, which the store brings (each
   process sees only its part of the traffic, and for documents the working sets are the load
   balancer; for a long preamble's group the others' figures made the replay slower at 8
   processes - the store's placed blocks balance those); a long
   preamble's proposal chooses among its first `shared_group_choices` backends, not `group_choices`
   (few choices are for agreement, which the store gives; an opening group keeps `group_choices`:
   documents spread wider came out slower with four processes). A *hot* group - one that brings
   its pool more than a backend's share of requests (`policies.group_demand`: its decayed share x
   the pool's backends / (1 + `load_factor`) = its `span`) - is meant to be warm on `span`
   backends: while the index knows fewer holders, the one with the smallest working set among the
   others within the bound counts as warm for the preamble, one block short of the holders, so it
   takes a request when the holders are busier by more than `tolerance` and never on a tie. With
   the engines' events (5.) and the request's tokens it is *warmed* instead (`warm_spread`): the
   request stays with the holders and the decision names that backend and the preamble's length in
   tokens (`BackendChoice.warm`, `warm_tokens`), which the gateway sends it as a background
   one-token prefill; one warm-up of a group at a time (`pending_s`), until its events make it a
   holder. Otherwise the request opening it paid the whole preamble's prefill (bench.replay, agents
   at 80 %: all of the slowest first tokens).
4. Choice. `cost = in_flight - warm blocks / blocks_per_request` (a cached block saves prefill; a
   queued request costs a service time - on a batching engine only its share of the steps, hence
   the default of 2 blocks, docs/routing.md; `in_flight` is this replica's own fresh count - the engine's
   scraped figures are global but up to a scrape old, and at low load they still count requests
   that have finished, so they only enter through the bound). Among backends that *fit* - not saturated and
   `score + 1 <= ceil((1 + load_factor) * (total + 1) / n) + load_slack` (consistent hashing with
   bounded loads, Mirrokni et al. 2018: nothing runs far above the average) - of those whose cost is
   within `tolerance` of the cheapest, the warmest wins, the first in HRW order on ties. So with nothing warm (uniform traffic, first
   turns) this is join-the-shortest-queue with the HRW order breaking ties; a warm home keeps its
   requests until its queue is longer than the prefill it saves; an overloaded group spills to the
   next backends of its own HRW order (the same on every replica), which then become warm too.
   If nothing fits, the least loaded backend wins.
   Queued prefill (`BackendView.prefill`: prompt tokens the routing processes sent there whose first
   token has not come back, less what they expected warm) adds `prefill_weight` x what a warm token
   saves per token, less the prefix this request finds warm there (it waits for that anyway): a
   request count does not tell a decoding sequence from a 4,000-token cold prefill, and a burst of
   turns from several processes spilled onto one idle backend and queued behind each other's cold
   prefills there. Not for a document's group (a long opening): its requests wait for its own
   prefill where the placement put it, and leaving on that account copied documents.

5. The engines' own KV-cache events (`policies.kv_index`, fed by the gateway's subscriber). When the
   request carries its token blocks (`features.prompt`) and a backend's event stream is usable, what
   that backend holds is known exactly, the same in every routing process: its warm blocks are the
   tokens it holds of the prompt (in estimated blocks: x the request's estimated tokens per real
   token / `block_tokens`), and this process's own routing memory (the index, the history prior) is
   ignored for it - except a decision of the last `pending_s` for the same key, whose blocks the
   engine may not have announced yet (a queued prefill). A group counts as known when a backend
   holds half of its blocks. Backends without a usable stream keep the approximate estimate above.
   What an engine holds also stretches the bound for it: such a backend fits up to `warm_slack` x
   its held blocks / `blocks_per_request` requests above it (a spill would copy the prefix onto a
   cold engine, whose prefill every sequence there waits for, while a request in flight on a
   batching engine is mostly a decode sequence sharing the steps) - unless the request's group is
   hot (`GroupDemand.hot`), whose load the bound and the spread must share. Only the engines'
   reports stretch it, never this process's memory: without events the bound is as in 4.
   When every backend's stream is usable, a short preamble (anchor mode) is no longer assumed warm
   everywhere: its blocks an engine holds count at `preamble_weight` (a first turn prefers an engine
   that holds its system prompt, unless that engine is busier than the prefill is worth).

Reasons: `affinity:hit` (home; the index knows a prefix of this request there, or the index is
disabled), `affinity:miss` (home, or a new group's placement; nothing known there yet),
`affinity:placed` (the placement the processes' shared store made for an earlier request of the
group, nothing known of it here yet: its first prefill is under way there), `affinity:index` (a non-home backend the
index knows to be warmer than the home), `affinity:spill` (home skipped for load), `affinity:spread` (a
hot group's next holder, taken for load).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import compress
from typing import Literal

from policies.features import BLOCK_TOKENS
from policies.group_demand import GroupDemand
from policies.hashing import HrwOrders, NameHashes, mix64, str_hash64
from policies.kv_index import KvIndex, KvIndexConfig
from policies.load import LoadModel
from policies.policy import BackendPolicy
from policies.prefix_index import PrefixIndex
from policies.types import Affinity, BackendChoice, BackendView, PoolView, RequestFeatures, backend_choice
from policies.working_sets import WorkingSets, first_within

# KV use is left out of the load score: in an engine it is the running requests' prompts, which
# `in_flight` already counts, so a backend serving one long cached prompt looked 1.6 requests busier
# and its own prefix group spilled off it (measured: long-document and shared-prefix hit rates).
# No absolute queue threshold either: a warm backend's queue is worth waiting for up to the prefill
# it saves (the cost rule), and the bound keeps any backend from running far above the average.
# With `queue_high` 8 every engine queue past 8 - the start of a run, when every group is cold, or a
# burst - pushed warm groups onto cold engines, whose cold prefills lengthened the queues further and
# evicted other groups (bench.replay, long_document_qa at 80 %: 58 % -> 94 % of the oracle).
AFFINITY_LOAD_MODEL = LoadModel(kv_weight=0.0, queue_high=None)

# (reason, affinity) of a choice (see the module docstring's end)
_HIT: tuple[str, Affinity] = ("affinity:hit", "hit")
_MISS: tuple[str, Affinity] = ("affinity:miss", "miss")
_PLACED: tuple[str, Affinity] = ("affinity:placed", "hit")
_INDEX: tuple[str, Affinity] = ("affinity:index", "hit")
_SPILL: tuple[str, Affinity] = ("affinity:spill", "spill")
_SPREAD: tuple[str, Affinity] = ("affinity:spread", "spill")


# The policy's constants. Each is a value the routing replay (bench/replay.py) settled; they are not
# settings - the replay and the tests vary them through `PrefixAffinityConfig`, operators do not.
#: a preamble (or opening) this many blocks long names a group: ~1,000 tokens, the size of prefix
#: whose prefill is worth concentrating on few backends rather than caching everywhere
GROUP_MIN_BLOCKS = 32
#: a new group is placed among its first 3 backends (rendezvous order): few choices keep the
#: processes, whose working sets differ, mostly agreeing on the same one
GROUP_CHOICES = 3
#: ... 8 when the processes' shared store places it: the store makes them agree, not the choices
SHARED_GROUP_CHOICES = 8
#: the first of the choices within 2 groups of the lightest working set: the strictly lightest
#: flips between processes on near-ties and copied groups onto several backends
PLACEMENT_SLACK = 2.0
#: ... and the lightest itself when the shared store places it (agreement comes from the store)
SHARED_PLACEMENT_SLACK = 0.0
#: warm blocks worth one in-flight request: on a batching engine a queued request costs only its
#: share of the steps, while a cold block lengthens a step every sequence waits for
BLOCKS_PER_REQUEST = 2.0
#: costs within half a request are a tie, which the warmest backend wins (whole requests decide)
TOLERANCE = 0.5
#: requests a backend may carry above the bounded-load bound: at low load the average is too small
#: a unit
#: (6: the batching fleet's prefix-heavy workloads closest to the oracle, agents' tails shortest)
LOAD_SLACK = 6.0
#: requests above the bound per request's worth of blocks an engine's events say it holds: a spill
#: copies the prefix onto a cold engine, whose prefill every sequence there waits for
WARM_SLACK = 0.5
#: ε of the bounded load across pools, looser than a pool's: a pool spill copies a whole group
POOL_LOAD_FACTOR = 0.5
#: with the engines' events and the request's tokens, a hot group's next holder is warmed in the
#: background with the group's preamble (`BackendChoice.warm`): a request sent there instead (False:
#: `affinity:spread`) paid the whole preamble's cold prefill, the slowest first tokens of agent loops
WARM_SPREAD = True
#: prefix-index entries (block hash -> backends), ~110 bytes each: ~7 MB a process
INDEX_ENTRIES = 65536
#: backends remembered per indexed prefix: enough for a hot group's holders
INDEX_MAX_HOLDERS = 4
#: a prompt routed to a backend with usable events is indexed at its preamble's end and every
#: 128th block (a prompt's most: its two ends): there the index only stands in until events confirm
INDEX_STRIDE = 128
#: (routing key, backend) pairs remembered for the working sets, ~200 bytes each
WORKING_SET_ENTRIES = 16384
#: requests over which a group's share of its pool decays: a group turning hot shows within a few
#: dozen requests
DEMAND_WINDOW = 32
#: groups whose share is remembered, ~320 bytes each
DEMAND_ENTRIES = 4096
#: seconds a decision counts as warm on a backend with events before they confirm it (an engine
#: announces a block once its prefill is done: seconds for a long prompt in a queue)
PENDING_S = 10.0
#: with every engine's events, a short system prompt's held blocks count this much: a first turn
#: prefers an engine that holds it, unless that one is busier than the prefill is worth
PREAMBLE_WEIGHT = 0.25
#: queued prefill tokens on a backend count at half what a warm token saves: a request count does
#: not tell a decoding sequence from a long cold prefill queued ahead
PREFILL_WEIGHT = 0.5


@dataclass(frozen=True, slots=True)
class PrefixAffinityConfig:
    """The policy's parameters. The gateway sets `load_factor` and `kv.max_blocks` from
    `routing.prefix_affinity`; the rest keep the constants above (the replay and the tests vary
    them)."""

    kind: Literal["prefix_affinity"] = "prefix_affinity"
    group_min_blocks: int = GROUP_MIN_BLOCKS
    group_choices: int = GROUP_CHOICES
    shared_group_choices: int = SHARED_GROUP_CHOICES
    placement_slack: float = PLACEMENT_SLACK
    shared_placement_slack: float = SHARED_PLACEMENT_SLACK
    blocks_per_request: float = BLOCKS_PER_REQUEST
    tolerance: float = TOLERANCE
    #: ε of bounded-load hashing: a backend fits while its load is within (1 + ε) x the average
    load_factor: float = 0.25
    load_slack: float = LOAD_SLACK
    warm_slack: float = WARM_SLACK
    pool_load_factor: float = POOL_LOAD_FACTOR
    load: LoadModel = AFFINITY_LOAD_MODEL
    index_entries: int = INDEX_ENTRIES
    index_max_holders: int = INDEX_MAX_HOLDERS
    index_stride: int = INDEX_STRIDE
    working_set_entries: int = WORKING_SET_ENTRIES
    #: mix the request's `session_key` (its `prompt_cache_key`, else `user`) into the anchor key
    session_in_key: bool = False
    demand_window: int = DEMAND_WINDOW
    demand_entries: int = DEMAND_ENTRIES
    #: estimated tokens per block of `policies.features`
    block_tokens: int = BLOCK_TOKENS
    #: the KV-event index's bounds and liveness rules
    kv: KvIndexConfig = field(default_factory=KvIndexConfig)
    pending_s: float = PENDING_S
    warm_spread: bool = WARM_SPREAD
    preamble_weight: float = PREAMBLE_WEIGHT
    prefill_weight: float = PREFILL_WEIGHT

    def __post_init__(self) -> None:
        slacks = (
            self.load_factor,
            self.load_slack,
            self.tolerance,
            self.pool_load_factor,
            self.placement_slack,
            self.shared_placement_slack,
            self.warm_slack,
            self.prefill_weight,
        )
        if min(slacks) < 0:
            raise ValueError(
                "load_factor, load_slack, warm_slack, prefill_weight, tolerance, pool_load_factor and the "
                "placement slacks must be >= 0"
            )
        if min(self.group_min_blocks, self.group_choices, self.shared_group_choices, self.index_stride) < 1:
            raise ValueError("group_min_blocks, the group choices and index_stride must be >= 1")
        if self.demand_window < 2 or self.demand_entries < 0:
            raise ValueError("demand_window must be >= 2 and demand_entries >= 0")
        if not self.blocks_per_request > 0:
            raise ValueError("blocks_per_request must be > 0")
        if self.block_tokens < 1 or self.pending_s < 0:
            raise ValueError("block_tokens must be >= 1 and pending_s >= 0")
        if not 0.0 <= self.preamble_weight <= 1.0:
            raise ValueError("preamble_weight must be between 0 and 1")


DEFAULT_CONFIG = PrefixAffinityConfig()


def group_blocks(features: RequestFeatures, config: PrefixAffinityConfig = DEFAULT_CONFIG) -> int:
    """How many leading blocks name the request's group, 0 for none: the whole preamble when it is
    at least `group_min_blocks` long; else, when the opening (preamble + first message: a long
    document asked about, a long first prompt) is that long, its first `group_min_blocks` blocks."""
    if features.preamble_blocks >= config.group_min_blocks:
        return features.preamble_blocks
    if features.anchor_blocks >= config.group_min_blocks:
        return config.group_min_blocks
    return 0


def opening_group(features: RequestFeatures, config: PrefixAffinityConfig = DEFAULT_CONFIG) -> bool:
    """A group named by a long opening (a document asked about, a long first prompt) rather than by
    a long preamble: placed without slack (see the module docstring, 3)."""
    return features.preamble_blocks < config.group_min_blocks


def grouped(features: RequestFeatures, config: PrefixAffinityConfig = DEFAULT_CONFIG) -> bool:
    """The request's long shared prefix is its routing key."""
    return group_blocks(features, config) > 0


def routing_key(features: RequestFeatures, config: PrefixAffinityConfig = DEFAULT_CONFIG) -> int:
    """The rendezvous key: the preamble's chained block hash when it is long (group mode), else the
    conversation anchor (mixed with `session_key` if configured). Identical for every turn of a
    conversation and on every replica."""
    g = group_blocks(features, config)
    if g:
        return features.block_hashes[g - 1]
    key = features.anchor_hash
    if config.session_in_key and features.session_key:
        key = mix64(key ^ str_hash64(features.session_key))
    return key


class PrefixAffinity(BackendPolicy):
    def __init__(self, config: PrefixAffinityConfig = DEFAULT_CONFIG) -> None:
        self._config = config
        self._load = config.load
        self._value = 1.0 / config.blocks_per_request
        # a queued prefill token's cost (`prefill_weight` x what a warm token saves)
        self._prefill_cost = config.prefill_weight * self._value / config.block_tokens
        self._index = PrefixIndex(config.index_entries, config.index_max_holders)
        self._names = NameHashes()
        self._sets = WorkingSets(config.working_set_entries)
        self._demand = GroupDemand(1.0 / config.demand_window, config.demand_entries)
        self._kv = KvIndex(config.kv)
        # routing key -> (backend, when): decisions whose blocks the engine may not have announced
        self._pending: OrderedDict[int, tuple[str, float]] = OrderedDict()
        # routing key -> (backend, when): warm-ups sent whose blocks the engine has not announced
        self._warming: OrderedDict[int, tuple[str, float]] = OrderedDict()
        # the last `_held_tokens` answer: (prompt, index version, clock, answer)
        self._held: tuple[object, int, float, tuple[dict[str, int], float] | None] = (None, -1, 0.0, None)
        # the last request's (features, group blocks, routing key), and rendezvous orders by key
        self._keyed: tuple[object, int, int] = (None, 0, 0)
        self._orders = HrwOrders(self._names)
        # a dry run proposing a group's placement to the shared store (`proposing`), and the other
        # routing processes' working sets and tails it adds to this one's
        self._proposing = False
        self._elsewhere: Mapping[str, int] = {}

    @property
    def config(self) -> PrefixAffinityConfig:
        return self._config

    @property
    def kv_index(self) -> KvIndex:
        """The engines' KV-cache contents (fed by the gateway's event subscriber)."""
        return self._kv

    @property
    def index(self) -> PrefixIndex:
        return self._index

    def key(self, features: RequestFeatures) -> int:
        """The rendezvous key of a request (identical across turns of one conversation)."""
        return self.keyed(features)[1]

    @contextmanager
    def proposing(self, elsewhere: Mapping[str, int] | None = None) -> Iterator[None]:
        """Within: decisions are proposals of a new group's placement to the processes' shared
        store, placed with `shared_placement_slack` (the store, not the slack, makes the processes
        agree; `policies.shared_load.SharedRouting.ask`); an opening group's working sets and
        tails with `elsewhere`'s added: the other processes' (`policies.working_sets`), by backend.
        Dry runs and `placement_choices` only."""
        self._proposing = True
        self._elsewhere = elsewhere or {}
        try:
            yield
        finally:
            self._proposing = False
            self._elsewhere = {}

    def working_sets(self) -> dict[str, int]:
        """This process's working sets and tails by backend (`WorkingSets.totals`: the same dict
        while they are unchanged), for the store."""
        return self._sets.totals()

    def keyed(self, features: RequestFeatures) -> tuple[int, int]:
        """`(group_blocks, routing_key)` of a request, remembered for the last request asked (the
        pool choice, `select` and `on_routed` of one decision all need them)."""
        memo = self._keyed
        if memo[0] is features:
            return memo[1], memo[2]
        g = group_blocks(features, self._config)
        key = routing_key(features, self._config)
        self._keyed = (features, g, key)
        return g, key

    def rank(self, pool: PoolView, features: RequestFeatures) -> list[BackendView]:
        """The pool's routable backends in rendezvous order for this request (home first)."""
        return list(self._ranked(pool, self.keyed(features)[1])[0])

    def placement_choices(self, pool: PoolView, features: RequestFeatures) -> tuple[str, ...]:
        """The backends a new group of this request may be placed on in `pool`: of its first
        `group_choices` routable backends in the group's rendezvous order (`shared_group_choices`
        for a long preamble's group; see `select`), those whose working set and tails
        (`policies.working_sets`; for an opening group with the other processes' added, see
        `proposing`) are within `shared_placement_slack` groups of the lightest - with the others'
        figures at least the two lightest. For the processes' shared store, which chooses among
        them."""
        g, key = self.keyed(features)
        names = self._ranked(pool, key)[1][: self._choices(features, True)]
        sizes = self._proposal_sizes(names, features)
        limit = min(sizes, default=0) + self._config.shared_placement_slack * g
        if self._elsewhere and len(sizes) > 1 and opening_group(features, self._config):
            # at least the two lightest: with the others' sums (as old as their last calls) every
            # process sees the same lightest backend, and one candidate herded their documents onto
            # it until the next reports (uniform traffic, 8 processes: p99 +30 % in the replay);
            # with two the store's placed blocks split them
            limit = max(limit, sorted(sizes)[1])
        return tuple(n for n, size in zip(names, sizes, strict=True) if size <= limit)

    def _proposal_sizes(self, names: Sequence[str], features: RequestFeatures) -> list[int]:
        """Working sets and tails of `names` for a proposal: this process's, and for an opening
        group (a document) the other processes' added (see `proposing`)."""
        sizes = self._sets.sizes(names, True)
        elsewhere = self._elsewhere
        if not elsewhere or not opening_group(features, self._config):
            return sizes
        return [sizes[i] + elsewhere.get(name, 0) for i, name in enumerate(names)]

    def _choices(self, features: RequestFeatures, proposing: bool) -> int:
        """How many of its first backends (rendezvous order) a new group may be placed on: a long
        preamble's group proposed to the shared store `shared_group_choices`, else `group_choices`."""
        config = self._config
        if proposing and not opening_group(features, config):
            return config.shared_group_choices
        return config.group_choices

    def _ranked(self, pool: PoolView, key: int) -> tuple[tuple[BackendView, ...], tuple[str, ...]]:
        """The pool's routable backends in the key's rendezvous order, and their names."""
        backends = pool.backends
        # `BackendView.routable`, inlined: this runs for every backend of every decision
        names = tuple([b.name for b in backends if b.healthy and not b.draining and not b.circuit_open])
        rank = self._orders.ranker(key, names)
        if len(names) == len(backends):  # all routable (the usual case)
            return rank(backends), rank(names)
        return rank([b for b in backends if b.healthy and not b.draining and not b.circuit_open]), rank(names)

    def select(self, pool: PoolView, features: RequestFeatures, rand: float) -> BackendChoice:
        g, key = self.keyed(features)
        ranked, names = self._ranked(pool, key)
        n = len(ranked)
        if n == 0:
            raise ValueError(f"pool {pool.name!r} has no routable backend")
        config = self._config
        load = self._load
        scores, any_saturated = load.loads(ranked)
        bound = math.ceil((1.0 + config.load_factor) * (sum(scores) + 1.0) / n) + config.load_slack
        if not any_saturated and max(scores) + 1.0 <= bound:  # every backend fits (`LoadModel.fits`)
            fits = [True] * n
            every_fit = True
        else:
            fits = load.fits(ranked, scores, bound)
            every_fit = all(fits)

        # Expected warm blocks per backend (see the module docstring, 3).
        group = g > 0
        preamble = g or features.preamble_blocks
        base = 0 if group else preamble
        warm: list[float] = [0] * n
        indexed = self._index.max_entries > 0
        deep = known = False
        # the engines' events: exact warm blocks for backends with a usable stream (5.), by
        # position in `ranked` (None: no usable stream); `lacking`: the backends without one
        exact: list[float | None]
        held_tokens = self._held_tokens(features)
        if held_tokens is None:
            exact = [None] * n
            lacking = n
        else:
            tokens, scale = held_tokens
            exact = []
            lacking = 0
            top = 0.0
            for i, name in enumerate(names):
                t = tokens.get(name)
                if t is None:
                    lacking += 1
                    exact.append(None)
                    continue
                held = t * scale
                exact.append(held)
                if held > top:
                    top = held
                if held - base > 0:
                    warm[i] = held - base
            if top > preamble:
                deep = True
            if group and lacking < n and top >= g / 2:
                known = True
            if not lacking and not group and preamble and config.preamble_weight:
                # every engine says what it holds: the short preamble is no longer assumed warm
                # everywhere, its held blocks count at `preamble_weight` (5.)
                weight = config.preamble_weight
                for i in range(n):
                    blocks_held = exact[i]
                    if blocks_held:
                        warm[i] += weight * (blocks_held if blocks_held < preamble else preamble)
        fresh: str | None = None
        if lacking < n:
            pend = self._pending.get(key)
            if pend is not None and self._kv.now - pend[1] < config.pending_s:
                fresh = pend[0]
        # this replica's memory is read only when some backend lacks events (or has a fresh
        # decision), and only for those backends: it yields to what engines hold (a backend's warm
        # blocks are the larger of the two)
        if indexed and features.block_hashes and (lacking or fresh is not None):
            depths = self._index.depths(features.block_hashes, names, above=max(0, preamble - 1))
            if depths and lacking:
                deepest = 0
                for i, name in enumerate(names):
                    d = depths.get(name)
                    if d is None or (exact[i] is not None and name != fresh):
                        continue
                    known = True
                    if d > deepest:
                        deepest = d
                    if d - base > warm[i]:
                        warm[i] = d - base
                if deepest > preamble:
                    deep = True
            elif depths and fresh is not None:  # every backend has events: the fresh decision's alone
                d = depths.get(fresh)
                if d is not None:
                    known = True
                    i = names.index(fresh)
                    if d - base > warm[i]:
                        warm[i] = d - base
                    if d > preamble:
                        deep = True
        known_home = warm[0] > 0
        # The bound yields to what an engine says it holds (see the module docstring, 5.).
        if (
            lacking < n
            and config.warm_slack
            and not every_fit
            and not (group and self._demand.hot(pool.name, key, n, 1.0 + config.load_factor))
        ):
            extra = config.warm_slack * self._value
            saturated = load.saturated
            for i in range(n):
                blocks = exact[i]
                if (
                    not fits[i]
                    and blocks is not None
                    and scores[i] + 1.0 <= bound + extra * (blocks - base)
                    and not saturated(ranked[i])
                ):
                    fits[i] = True
            every_fit = all(fits)
        # working sets: a group's placement, its next holder and the tie-break all compare them;
        # a proposal to the shared store adds the backends' tails (`policies.working_sets`)
        if not group:
            sizes = [0] * n
        elif self._proposing:
            sizes = self._proposal_sizes(names, features)
        else:
            sizes = self._sets.sizes(names)
        placed = -1  # a new group's placement among its first choices
        stored = False  # ... made for an earlier request by the processes' shared store
        spread = -1  # a hot group's next holder
        warm_to = -1  # ... warmed in the background instead
        if group:
            if not known:
                # Nothing of this group known here: place it on the first of its first
                # `group_choices` backends (HRW order) whose working set is within `placement_slack`
                # groups of the lightest of them. Not simply the lightest: working sets are this
                # replica's own, and near-ties sent one group to different backends from different
                # replicas. Opening groups take the lightest (see the module docstring, 3).
                # The fleet's shared store names the backend another process placed it on.
                placed = _position(names, features.placed_on)
                stored = placed >= 0 and features.placed_before
                if placed < 0:
                    if opening_group(features, config):
                        slack = 0.0
                    elif self._proposing:
                        slack = config.shared_placement_slack * preamble
                    else:
                        slack = config.placement_slack * preamble
                    placed = first_within(sizes[: self._choices(features, self._proposing)], slack)
                warm[placed] = max(features.history_blocks, preamble)
            else:
                # A hot group is kept warm on `span` backends (`policies.group_demand`): while fewer
                # hold it, the lightest (working set) of the others within the bound is the next,
                # counted one block short of the holders so that it takes a request for load only,
                # never on a tie.
                span = self._demand.span(pool.name, key, n, 1.0 + config.load_factor)
                if span > 1:
                    others = [i for i in range(n) if warm[i] < preamble]
                    room = [i for i in others if fits[i]]
                    if n - len(others) < span and room:
                        spread = min(room, key=sizes.__getitem__)
                        if (
                            config.warm_spread
                            and exact[spread] is not None
                            and held_tokens is not None
                            and _warmable(features)
                        ):
                            # warmed in the background, not by this request's cold prefill; one
                            # warm-up of a group at a time, until its events make it a holder
                            under_way = self._warming.get(key)
                            if under_way is None or self._kv.now - under_way[1] >= config.pending_s:
                                warm_to = spread
                            spread = -1
                        else:
                            warm[spread] = preamble - 1
        elif (
            not deep and features.history_blocks - base > warm[0] and (exact[0] is None or names[0] == fresh)
        ):
            # the home is assumed to hold the history, unless its engine says what it holds
            warm[0] = features.history_blocks - base

        if every_fit:
            candidates: Iterable[int] = range(n)
        else:
            candidates = list(compress(range(n), fits))
        if not candidates:
            chosen = min(range(n), key=scores.__getitem__)
        else:
            value = self._value
            # this replica's own, fresh in-flight counts: a scrape that still counts a finished
            # request must not push a conversation off its home at low load (the engine's figures,
            # stale but global, bound the choice through `fits`)
            if config.prefill_weight and not (group and opening_group(features, config)):
                # the prefill queued on a backend delays this request's first token, except as much
                # of it as the prefix this request finds warm there (it would wait for that anyway);
                # not for a document's group, whose later requests wait for its own prefill where
                # it was placed (the placement balances the groups' blocks)
                bt = config.block_tokens
                per = self._prefill_cost
                costs: list[float] = []
                for i in range(n):
                    b = ranked[i]
                    w = warm[i]
                    queued = b.prefill - w * bt
                    costs.append(b.in_flight - value * w + (per * queued if queued > 0 else 0.0))
            else:
                costs = [ranked[i].in_flight - value * warm[i] for i in range(n)]
            limit = min([costs[i] for i in candidates] if not every_fit else costs) + config.tolerance
            # HRW order: the warmest within the tolerance; on ties the earliest, or for a group the
            # one with the smallest working set (a cold copy evicts the least there)
            chosen = -1
            top_warm = 0.0
            for i in candidates:
                if costs[i] <= limit:
                    w = warm[i]
                    if chosen < 0 or w > top_warm or (w == top_warm and sizes[i] < sizes[chosen]):
                        chosen = i
                        top_warm = w
        reason, affinity = self._reason(chosen, placed, stored, spread, known_home, indexed, warm)
        # the prompt tokens left to prefill there: all but the short preamble where this request
        # opens its group or the group's next holder (their warm blocks above are what they will hold)
        held = base if chosen == spread or (chosen == placed and not stored) else warm[chosen] + base
        uncached = features.prompt_tokens - int(held * config.block_tokens)
        prefill = uncached if uncached > 0 else 0
        if warm_to < 0 or warm_to == chosen:
            return backend_choice(names[chosen], reason, affinity, None, 0, prefill)
        # the preamble's estimated blocks in the prompt's tokens (`warm_to` implies both are known)
        assert features.prompt is not None and held_tokens is not None
        warm_len = min(features.prompt.tokens, int(preamble / held_tokens[1]))
        return backend_choice(names[chosen], reason, affinity, names[warm_to], warm_len, prefill)

    @staticmethod
    def _reason(
        chosen: int,
        placed: int,
        stored: bool,
        spread: int,
        known_home: bool,
        indexed: bool,
        warm: list[float],
    ) -> tuple[str, Affinity]:
        """The choice's reason and affinity (module-level constants: nothing built per request)."""
        if chosen == placed and stored:
            # the group's placement, made by an earlier request through the store: its prefill is
            # under way there (nothing of it known here yet: no event, no decision of this process)
            return _PLACED
        if chosen == placed and chosen > 0:
            return _MISS
        if chosen == spread and chosen > 0:
            return _SPREAD
        if chosen == 0:
            return _HIT if known_home or not indexed else _MISS
        if warm[chosen] > warm[0]:
            return _INDEX
        return _SPILL

    def on_routed(self, pool: PoolView, features: RequestFeatures, choice: BackendChoice) -> None:
        # The preamble's last block (it identifies the whole preamble: which backends were sent this
        # group) and every block past it. Earlier preamble blocks add nothing and would cost time.
        g, key = self.keyed(features)
        shared = g or features.preamble_blocks
        start = shared - 1 if shared else 0
        kv = self._kv
        stride = self._config.index_stride if kv.usable(choice.backend) else 1
        self._index.insert(features.block_hashes, choice.backend, start, stride)
        self._sets.note(key, choice.backend, len(features.block_hashes))
        self._demand.note(pool.name, key if g else None)
        if kv.attached(choice.backend):
            kv.note_routed(choice.backend, features.prompt)
            limit = self._config.demand_entries
            _remember(self._pending, key, (choice.backend, kv.now), limit)
            if choice.warm is not None:
                _remember(self._warming, key, (choice.warm, kv.now), limit)
                # the warm-up puts the group's preamble in that engine's cache: its working set, so
                # that a new group's first request is not placed to queue behind the warm-up's prefill
                self._sets.note(key, choice.warm, shared)

    def warm_skipped(self, features: RequestFeatures) -> None:
        """The warm-up `on_routed` recorded for the request's group was not sent: the group's next
        request may ask for one again (instead of waiting `pending_s` for events that will not come),
        and its target's working set no longer counts the group."""
        key = self.key(features)
        under_way = self._warming.pop(key, None)
        if under_way is not None:
            self._sets.forget(key, under_way[0])

    def pool_stretch(self, pool: PoolView, features: RequestFeatures) -> float:
        """Requests `pool` may carry above the pools' bound because one of its engines holds the
        request's group (its events: at least half of the group), as `warm_slack` stretches the
        backend bound (5.); 0 for a hot group, without events or without a group."""
        config = self._config
        held = self.holders(features) if config.warm_slack else None
        if not held:
            return 0.0
        g, key = self.keyed(features)
        most = 0.0
        n = 0
        for b in pool.backends:
            if b.routable:
                n += 1
                most = max(most, held.get(b.name, 0.0))
        if not g or most < g / 2 or self._demand.hot(pool.name, key, n, 1.0 + config.load_factor):
            return 0.0
        return config.warm_slack * self._value * most

    def holders(self, features: RequestFeatures) -> dict[str, float] | None:
        """Warm blocks (in the estimate's units) per backend of the fleet whose events are usable, or
        None (no tokens, no streams)."""
        held = self._held_tokens(features)
        if held is None:
            return None
        tokens, scale = held
        return {name: t * scale for name, t in tokens.items()}

    def _held_tokens(self, features: RequestFeatures) -> tuple[dict[str, int], float] | None:
        """The engines' held tokens of the request's prompt per backend (`KvIndex.match`) and the
        factor to the estimate's blocks, or None (no tokens, no streams, nothing usable). One scan of
        the index for every backend at once, remembered until the index or the clock changes: the
        pool choice and the backend choice both ask."""
        prompt = features.prompt
        kv = self._kv
        if prompt is None or not kv.streams or not prompt.tokens:
            return None
        memo = self._held
        if memo[0] is prompt and memo[1] == kv.version and memo[2] == kv.now:
            return memo[3]
        held = kv.match(prompt)
        out: tuple[dict[str, int], float] | None = None
        if held:
            # real tokens -> estimated blocks: the request's estimated tokens per real token
            out = held, features.prompt_tokens / (prompt.length * self._config.block_tokens)
        self._held = (prompt, kv.version, kv.now, out)
        return out


def _remember(
    table: OrderedDict[int, tuple[str, float]], key: int, entry: tuple[str, float], limit: int
) -> None:
    """`table[key] = entry`, the most recent last; the oldest dropped beyond `limit` entries."""
    table[key] = entry
    table.move_to_end(key)
    if len(table) > limit:
        table.popitem(last=False)


def _warmable(features: RequestFeatures) -> bool:
    """A warm-up (token ids under the model's name) can put the request's prompt where the engine
    keeps it: not a salted prompt (`cache_salt`: its blocks carry the salt, a warm-up's would not)."""
    prompt = features.prompt
    return prompt is not None and prompt.first_extra is None


def _position(names: tuple[str, ...], name: str | None) -> int:
    """The index of backend `name` in `names`, -1 when absent (or `name` is None)."""
    if name is not None and name in names:
        return names.index(name)
    return -1
