"""Prefix affinity: each request goes where its prompt's prefix is cached, unless that backend is
too busy for it - bounded-load rendezvous hashing on a prefix key, with a cost rule that trades a
warm cache against a queue.

Requests that share a long prefix (tool schemas and a system prompt, a document) form a *group*,
kept on few backends instead of cached by all; a conversation without one is keyed by its opening.
For each request, over the pool's routable backends (`PrefixAffinity.select`):

1. Key (`routing_key`). A preamble (tool schemas + system/developer messages) of at least
   `GROUP_MIN_BLOCKS` estimated blocks names the group: the key is its last block's chained hash.
   Else a long opening (a document asked about) names it by its first `GROUP_MIN_BLOCKS` blocks;
   else the key is the conversation's anchor (preamble + first user message). Every turn of a
   conversation has the same key, and so does the pool choice (`policies.router`).
2. Order. Backends rank by rendezvous hashing on the key: the first is the key's home, the rest its
   fallbacks, the same in every routing process without their talking to each other.
3. Bound. A backend *fits* while it is not saturated and its load + 1 is within
   ceil((1 + `load_factor`) x (total + 1) / n) + `LOAD_SLACK` (consistent hashing with bounded
   loads, Mirrokni et al. 2018). One whose engine holds the request's prefix (its events) may run
   `WARM_SLACK` requests above it per request's worth of held blocks, unless the group is hot.
4. Warm blocks: what each backend holds of the prompt. Exactly, from the engines' KV-cache events
   (`policies.kv_index`), when the request carries its tokens; else from this process's prefix
   index (`policies.prefix_index`: where it sent which prefixes); else a conversation's home is assumed to
   hold its history. A short preamble is assumed warm everywhere and does not count,
   unless every engine's events say where it is (then at `PREAMBLE_WEIGHT`).
5. Groups. A group nothing is known of is placed on the first of its first `GROUP_CHOICES` backends
   whose working set (`policies.working_sets`) is within `PLACEMENT_SLACK` groups of the lightest,
   so that processes mostly agree; a document's group takes the lightest. With Redis the
   processes' shared store places it once for all (`policies.shared_load`). A *hot* group - more
   than a backend's share of its pool's requests (`policies.group_demand`) - is kept warm on as
   many backends as its share needs: the next one is warmed by a background one-token prefill of
   the preamble (`WARM_SPREAD`, with events), or takes requests when the holders are busier.
6. Choice. cost = in-flight requests - warm blocks / `BLOCKS_PER_REQUEST` + prefill queued there
   beyond the request's warm prefix, at `PREFILL_WEIGHT` x what a warm token saves. Among the
   backends that fit, of those within `TOLERANCE` of the cheapest, the warmest wins; ties go to the
   smaller working set, then the earlier in rendezvous order. If none fits, the least loaded.

So with nothing warm this is join-the-shortest-queue; a warm home keeps its requests until its queue
costs more than the prefill it saves; an overloaded group spills along its own rendezvous order.

Settings (`routing.prefix_affinity`): `load_factor` (0.25) and the KV-event index's size
(`kv_max_blocks`). The other parameters are the constants below, each with its reason;
`PrefixAffinityConfig` carries them all, for the routing replay (bench/replay.py) and the tests.

Reasons: `affinity:hit` (the home, known warm), `affinity:miss` (the home, or a new group's
placement: nothing known there yet), `affinity:placed` (the shared store's placement of the group),
`affinity:index` (a backend known warmer than the home), `affinity:spill` (the home passed for load),
`affinity:spread` (a hot group's next holder, taken for load).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import compress
from typing import Literal

from policies.features import BLOCK_TOKENS, LONG_PREAMBLE_BLOCKS
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
GROUP_MIN_BLOCKS = LONG_PREAMBLE_BLOCKS
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
#: a request that names its session (prompt_cache_key, x-session-id, metadata.session_id, user) is
#: routed by it: an agent's turns stay on its cache even when the opening of its prompt changes
SESSION_KEYS = True
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
    #: a request naming its session (`RequestFeatures.session_key`) is keyed by it, not by its anchor
    session_keys: bool = SESSION_KEYS
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
    a long preamble: placed on the lightest of its choices (see the module docstring, 5)."""
    return features.preamble_blocks < config.group_min_blocks


def grouped(features: RequestFeatures, config: PrefixAffinityConfig = DEFAULT_CONFIG) -> bool:
    """The request's long shared prefix is its routing key."""
    return group_blocks(features, config) > 0


def routing_key(features: RequestFeatures, config: PrefixAffinityConfig = DEFAULT_CONFIG) -> int:
    """The rendezvous key: the preamble's chained block hash when it is long (group mode), else the
    request's session when it names one, else the conversation anchor. Identical for every turn of a
    conversation and on every replica; a session keeps its turns together even when their opening
    changes (an agent that rewrites its system prompt or compacts its history)."""
    g = group_blocks(features, config)
    if g:
        return features.block_hashes[g - 1]
    if config.session_keys and features.session_key:
        return mix64(str_hash64(features.session_key))
    return features.anchor_hash


class _Candidates:
    """One decision's working state (`PrefixAffinity.select`): the pool's routable backends in the
    key's rendezvous order and, by position, what the steps learn of each."""

    def __init__(
        self,
        ranked: tuple[BackendView, ...],
        names: tuple[str, ...],
        key: int,
        g: int,
        preamble_blocks: int,
    ) -> None:
        n = len(ranked)
        self.ranked = ranked
        self.names = names
        self.n = n
        self.key = key
        #: the group's blocks (0: no group, the key is the conversation anchor)
        self.g = g
        self.group = g > 0
        self.preamble = g or preamble_blocks
        #: blocks every backend is assumed to hold: a short preamble's (anchor mode), none for a group
        self.base = 0 if g > 0 else self.preamble
        # the load bound (step 3)
        self.scores: list[float] = []
        self.bound = 0.0
        self.fits: list[bool] = []
        self.every_fit = False
        # what each backend holds (step 4): warm blocks beyond `base`, and the engines' exact
        # figures (None: no usable event stream; `lacking` backends have none)
        self.warm: list[float] = [0] * n
        self.exact: list[float | None] = [None] * n
        self.lacking = n
        self.held_tokens: tuple[dict[str, int], float] | None = None
        #: this process's decision of the last `pending_s` for the key, its blocks maybe not announced
        self.fresh: str | None = None
        self.indexed = False
        #: something of the request past its preamble is known warm somewhere
        self.deep = False
        #: the group is known to be held (events: half of it) or indexed somewhere
        self.known = False
        #: the home is known warm (before the placement's and the history's assumptions)
        self.known_home = False
        # groups (step 5): working sets, a new group's placement (`stored`: the shared store's),
        # a hot group's next holder taken for load, or warmed in the background
        self.sizes: list[int] = []
        self.placed = -1
        self.stored = False
        self.spread = -1
        self.warm_to = -1


def _reason(c: _Candidates, chosen: int) -> tuple[str, Affinity]:
    """The choice's reason and affinity (module-level constants: nothing built per request)."""
    if chosen == c.placed and c.stored:
        # the group's placement, made by an earlier request through the store: its prefill is
        # under way there (nothing of it known here yet: no event, no decision of this process)
        return _PLACED
    if chosen == c.placed and chosen > 0:
        return _MISS
    if chosen == c.spread and chosen > 0:
        return _SPREAD
    if chosen == 0:
        return _HIT if c.known_home or not c.indexed else _MISS
    if c.warm[chosen] > c.warm[0]:
        return _INDEX
    return _SPILL


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
        """The module docstring's steps, each a method working on one `_Candidates`."""
        c = self._candidates(pool, features)  # 1-3: the key, its rendezvous order, the bound
        self._read_events(c, features)  # 4: what the engines say they hold
        self._read_index(c, features)  # 4: what this process sent where, for the others
        self._stretch_bound(c, pool)  # 3: the bound yields to what an engine holds
        if c.group:  # 5: the working sets place a new group or spread a hot one
            c.sizes = (
                self._proposal_sizes(c.names, features) if self._proposing else self._sets.sizes(c.names)
            )
            if c.known:
                self._spread_hot_group(c, pool, features)
            else:
                self._place_new_group(c, features)
        else:
            c.sizes = [0] * c.n
            self._assume_history(c, features)  # 4: the home holds a conversation's history
        return self._choice(c, features, self._cheapest(c, features))  # 6: the cost rule

    def _candidates(self, pool: PoolView, features: RequestFeatures) -> _Candidates:
        """Steps 1-3: the key, the pool's routable backends in its rendezvous order, and which of
        them fit the bounded-load bound."""
        g, key = self.keyed(features)
        ranked, names = self._ranked(pool, key)
        if not ranked:
            raise ValueError(f"pool {pool.name!r} has no routable backend")
        c = _Candidates(ranked, names, key, g, features.preamble_blocks)
        config = self._config
        n = c.n
        scores, any_saturated = self._load.loads(ranked)
        bound = math.ceil((1.0 + config.load_factor) * (sum(scores) + 1.0) / n) + config.load_slack
        c.scores = scores
        c.bound = bound
        if not any_saturated and max(scores) + 1.0 <= bound:  # every backend fits (`LoadModel.fits`)
            c.fits = [True] * n
            c.every_fit = True
        else:
            c.fits = self._load.fits(ranked, scores, bound)
            c.every_fit = all(c.fits)
        return c

    def _read_events(self, c: _Candidates, features: RequestFeatures) -> None:
        """Step 4, from the engines' KV-cache events: each backend with a usable stream holds
        exactly what they say (`c.exact`, in estimated blocks; `c.lacking` backends have no usable
        stream). In anchor mode the preamble's blocks count only with every backend's events, at
        `preamble_weight`."""
        held_tokens = self._held_tokens(features)
        c.held_tokens = held_tokens
        if held_tokens is None:
            return
        tokens, scale = held_tokens
        warm = c.warm
        base = c.base
        exact: list[float | None] = []
        lacking = 0
        top = 0.0
        for i, name in enumerate(c.names):
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
        c.exact = exact
        c.lacking = lacking
        preamble = c.preamble
        if top > preamble:
            c.deep = True
        if c.group and lacking < c.n and top >= c.g / 2:
            c.known = True
        weight = self._config.preamble_weight
        if not lacking and not c.group and preamble and weight:
            # every engine says what it holds: the short preamble is no longer assumed warm
            # everywhere, its held blocks count at `preamble_weight`
            for i in range(c.n):
                blocks_held = exact[i]
                if blocks_held:
                    warm[i] += weight * (blocks_held if blocks_held < preamble else preamble)

    def _read_index(self, c: _Candidates, features: RequestFeatures) -> None:
        """Step 4, from this process's prefix index: read only for the backends without usable
        events, or for a decision of the last `pending_s` whose blocks the engine may not have
        announced yet (`c.fresh`); a backend's warm blocks are the larger of the two."""
        c.indexed = indexed = self._index.max_entries > 0
        if c.lacking < c.n:
            pend = self._pending.get(c.key)
            if pend is not None and self._kv.now - pend[1] < self._config.pending_s:
                c.fresh = pend[0]
        fresh = c.fresh
        if indexed and features.block_hashes and (c.lacking or fresh is not None):
            preamble = c.preamble
            base = c.base
            warm = c.warm
            depths = self._index.depths(features.block_hashes, c.names, above=max(0, preamble - 1))
            if depths and c.lacking:
                exact = c.exact
                deepest = 0
                for i, name in enumerate(c.names):
                    d = depths.get(name)
                    if d is None or (exact[i] is not None and name != fresh):
                        continue
                    c.known = True
                    if d > deepest:
                        deepest = d
                    if d - base > warm[i]:
                        warm[i] = d - base
                if deepest > preamble:
                    c.deep = True
            elif depths and fresh is not None:  # every backend has events: the fresh decision's alone
                d = depths.get(fresh)
                if d is not None:
                    c.known = True
                    i = c.names.index(fresh)
                    if d - base > warm[i]:
                        warm[i] = d - base
                    if d > preamble:
                        c.deep = True
        c.known_home = c.warm[0] > 0

    def _stretch_bound(self, c: _Candidates, pool: PoolView) -> None:
        """Step 3's exception: a backend whose engine's events say it holds the prompt fits up to
        `warm_slack` x its held blocks / `blocks_per_request` requests above the bound - unless the
        request's group is hot, whose load the bound and the spread must share."""
        config = self._config
        if (
            c.lacking < c.n
            and config.warm_slack
            and not c.every_fit
            and not (c.group and self._demand.hot(pool.name, c.key, c.n, 1.0 + config.load_factor))
        ):
            extra = config.warm_slack * self._value
            saturated = self._load.saturated
            fits = c.fits
            exact = c.exact
            for i in range(c.n):
                blocks = exact[i]
                if (
                    not fits[i]
                    and blocks is not None
                    and c.scores[i] + 1.0 <= c.bound + extra * (blocks - c.base)
                    and not saturated(c.ranked[i])
                ):
                    fits[i] = True
            c.every_fit = all(fits)

    def _place_new_group(self, c: _Candidates, features: RequestFeatures) -> None:
        """Step 5, a group nothing is known of here: the placement the processes' shared store made
        for it, else the first of its first `group_choices` backends whose working set is within
        `placement_slack` groups of the lightest of them (not simply the lightest: working sets are
        each process's own, and near-ties sent one group to different backends from different
        processes). An opening group (a document) takes the lightest; a proposal to the store takes
        its own slack and choices (`proposing`). The placement counts as warm with the group."""
        config = self._config
        placed = _position(c.names, features.placed_on)
        c.stored = placed >= 0 and features.placed_before
        if placed < 0:
            if opening_group(features, config):
                slack = 0.0
            elif self._proposing:
                slack = config.shared_placement_slack * c.preamble
            else:
                slack = config.placement_slack * c.preamble
            placed = first_within(c.sizes[: self._choices(features, self._proposing)], slack)
        c.placed = placed
        c.warm[placed] = max(features.history_blocks, c.preamble)

    def _spread_hot_group(self, c: _Candidates, pool: PoolView, features: RequestFeatures) -> None:
        """Step 5, a known group: a hot one is kept warm on `span` backends (`policies.group_demand`).
        While fewer hold it, the lightest (working set) of the others that fit is the next: warmed in
        the background with the group's preamble (`warm_spread`, with the engines' events and the
        request's tokens; one warm-up of a group at a time), else counted one block short of the
        holders, so that it takes a request for load only, never on a tie."""
        config = self._config
        span = self._demand.span(pool.name, c.key, c.n, 1.0 + config.load_factor)
        if span <= 1:
            return
        warm = c.warm
        others = [i for i in range(c.n) if warm[i] < c.preamble]
        room = [i for i in others if c.fits[i]]
        if c.n - len(others) >= span or not room:
            return
        spread = min(room, key=c.sizes.__getitem__)
        if (
            config.warm_spread
            and c.exact[spread] is not None
            and c.held_tokens is not None
            and _warmable(features)
        ):
            under_way = self._warming.get(c.key)
            if under_way is None or self._kv.now - under_way[1] >= config.pending_s:
                c.warm_to = spread
        else:
            c.spread = spread
            warm[spread] = c.preamble - 1

    def _assume_history(self, c: _Candidates, features: RequestFeatures) -> None:
        """Step 4's last resort, in anchor mode: the home is assumed to hold the conversation's
        history (the same assumption in every process), unless its engine says what it holds or
        something deeper is known elsewhere."""
        warm = c.warm
        history = features.history_blocks - c.base
        if not c.deep and history > warm[0] and (c.exact[0] is None or c.names[0] == c.fresh):
            warm[0] = history

    def _cheapest(self, c: _Candidates, features: RequestFeatures) -> int:
        """Step 6: among the backends that fit, of those whose cost is within `tolerance` of the
        cheapest, the warmest; on ties the smallest working set, then the earliest. If none fits,
        the least loaded."""
        n = c.n
        candidates: Iterable[int] = range(n) if c.every_fit else list(compress(range(n), c.fits))
        if not candidates:
            return min(range(n), key=c.scores.__getitem__)
        costs = self._costs(c, features)
        limit = min(costs if c.every_fit else [costs[i] for i in candidates]) + self._config.tolerance
        warm = c.warm
        sizes = c.sizes
        chosen = -1
        top_warm = 0.0
        for i in candidates:
            if costs[i] <= limit:
                w = warm[i]
                if chosen < 0 or w > top_warm or (w == top_warm and sizes[i] < sizes[chosen]):
                    chosen = i
                    top_warm = w
        return chosen

    def _costs(self, c: _Candidates, features: RequestFeatures) -> list[float]:
        """Each backend's cost: this process's own, fresh in-flight count (a scrape that still
        counts a finished request must not push a conversation off its home; the engines' figures
        bound the choice through the fit) less its warm blocks' worth, plus the prefill queued
        there beyond the prefix this request finds warm (it would wait for that anyway) - not for
        a document's group, whose later requests wait for its own prefill where it was placed."""
        config = self._config
        value = self._value
        ranked = c.ranked
        warm = c.warm
        if not config.prefill_weight or (c.group and opening_group(features, config)):
            return [ranked[i].in_flight - value * warm[i] for i in range(c.n)]
        bt = config.block_tokens
        per = self._prefill_cost
        costs: list[float] = []
        for i in range(c.n):
            b = ranked[i]
            w = warm[i]
            queued = b.prefill - w * bt
            costs.append(b.in_flight - value * w + (per * queued if queued > 0 else 0.0))
        return costs

    def _choice(self, c: _Candidates, features: RequestFeatures, chosen: int) -> BackendChoice:
        """The decision: the backend, its reason, the prompt tokens left to prefill there (all but
        the short preamble where this request opens its group or the group's next holder) and the
        warm-up to send, if any."""
        reason, affinity = _reason(c, chosen)
        opens = chosen == c.spread or (chosen == c.placed and not c.stored)
        held = c.base if opens else c.warm[chosen] + c.base
        uncached = features.prompt_tokens - int(held * self._config.block_tokens)
        prefill = uncached if uncached > 0 else 0
        warm_to = c.warm_to
        if warm_to < 0 or warm_to == chosen:
            return backend_choice(c.names[chosen], reason, affinity, None, 0, prefill)
        # the preamble's estimated blocks in the prompt's tokens (`warm_to` implies both are known)
        assert features.prompt is not None and c.held_tokens is not None
        warm_len = min(features.prompt.tokens, int(c.preamble / c.held_tokens[1]))
        return backend_choice(c.names[chosen], reason, affinity, c.names[warm_to], warm_len, prefill)

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
        backend bound (the module docstring, 3); 0 for a hot group, without events or without a group."""
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
