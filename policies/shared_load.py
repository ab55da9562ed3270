"""What routing processes share through a store (Redis in the gateway): in-flight counts and the
placement of new prefix groups. Pure: the caller carries the values to and from the store.

Why. Every routing process (replicas × workers) hears the engines' KV-cache events, so they agree
on what each engine *holds*; two things remain that only the process that did them knows:
- **its in-flight requests**: each process counts its own, so with N processes each judges the
  shortest queue on about 1/N of the load. Each process reports its own counts whenever it talks to
  the store and reads the sum of the others' (`with_others`): the fleet's counts, each process's
  part as fresh as its last call;
- **where it just placed a new prefix group**: the engine announces the group's blocks only once it
  has computed them (after its queue and its prefill, seconds at load), and meanwhile another process
  that gets the group places it by its own working sets, elsewhere, and the group is cached twice. The
  first process to place a group has it set, once, every later request of the
  group reads it (`placed_on` of `RequestFeatures`), and prefix affinity places the group there
  instead of by this process's own working sets, and the pool choice takes that backend's pool.
- **how many groups each backend was just given**: each process's working sets know only the
  groups *it* placed, so at a burst of new groups (twelve documents in the first second) four
  processes each put theirs on what looks empty to them, and one engine gets three cold prefills
  while another gets none (the wall-clock bench, documents at 50 % x4: p99 8.5 s against x1's
  6.4 s). So the store places a new group itself: the request carries the backends this process
  would choose between (`Ask.candidates`, its own proposal first, then of the proposal's pool's
  first `group_choices` - a long preamble's group: `shared_group_choices` - backends in the group's
  rendezvous order those as light as the lightest by its own working sets) and the group's size,
  and the store takes the candidate with the fewest placed blocks (`PlacedBlocks`: blocks of the
  groups placed there, halving every `half_life_ms`), ties to the proposal, and adds the group's
  blocks to it. Placements are then made one at a time with every earlier one known, as by a
  single process. Across pools only while other processes route (their counts came with the last
  answer): then the candidates also hold those of the
  request's other pools of the same weight per backend (`Router.other_pools`: every one for a
  document, those this process finds within a group of its choice for a long preamble), since
  this process's pool choice went by its own part of the traffic. Alone, the process's pool choice
  stands: its working sets and the pool bound know more than placed blocks (the store choosing
  across pools for one process made its documents and shared prefixes slower in the replay).

- **how much traffic each backend's documents carry**: a document's placement (an opening group)
  goes to the lightest working set (`policies.working_sets`), which is the load balancer there, and
  each process's are of its own 1/N of the traffic. So each process reports its own working sets
  and tails with its in-flight counts (`SharedRouting.report`: under `SETS` + the backend's name,
  so that the sum of every name over the other processes - made by the gateway from the store's
  reply - needs no change), and a
  document's proposal adds the others' sums to its own (`split`, `PrefixAffinity.proposing`),
  offering the store at least the two lightest (the others' sums are as old as their last calls:
  every process sees the same lightest, and one candidate herded uniform traffic's documents onto
  it). In the replay (16 schedules, p99 at 2 / 4 / 8 processes): documents at 50 % load 5.97 /
  6.36 / 6.23 -> 6.11 / 6.20 / 6.10 s, at 80 % 7.10 / 7.24 / 7.36 -> 7.12 / 7.04 / 7.04 s;
  uniform traffic at 50 % 1.89 / 2.00 / 1.87 -> 1.62 / 1.92 / 1.92 s, at 80 % 2.71 / 2.99 / 3.01
  -> 2.36 / 2.48 / 2.78 s. Long preambles' groups do not add them: their store placement balances
  placed blocks over the whole pool, and with the others' figures shared prefixes were 4-20 %
  slower at 8 processes.

`SharedRouting.ask` says what a request needs from the store: its group's key (None for requests
without a group, or whose group the engines' events already show held) and a proposal - where this
process would place the group (a dry run of its own decision), with the candidates the store may
take instead - when it does not know a placement for it yet, so the dry run costs a decision once
per group and process. `learn` records the store's
answer. Without a store, nothing here is used and every process routes on its own.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from policies.prefix_affinity import PrefixAffinity, group_blocks
from policies.router import Router
from policies.types import BackendView, FleetSnapshot, PoolView, RequestFeatures, RoutingError, same_views


@dataclass(frozen=True, slots=True)
class Ask:
    """What one request asks of the store: the placement of group `key`; when there is none yet,
    the store sets it to the one of `candidates` (`proposal` first) with the fewest placed blocks
    and adds the group's `blocks` there (`proposal` None: only read it)."""

    key: int
    proposal: str | None
    candidates: tuple[str, ...] = ()
    blocks: int = 0


class PlacedBlocks:
    """The store's placed blocks per backend, decaying (what the Redis script keeps and does, for
    the offline replay and the tests): `place` is the script's choice for a new group."""

    __slots__ = ("_loads", "half_life_ms")

    def __init__(self, half_life_ms: float) -> None:
        self.half_life_ms = half_life_ms
        self._loads: dict[str, tuple[float, float]] = {}  # backend -> (blocks, as of ms)

    def load(self, name: str, now_ms: float) -> float:
        """`name`'s placed blocks now."""
        got = self._loads.get(name)
        if got is None:
            return 0.0
        blocks, at = got
        return blocks * math.pow(0.5, (now_ms - at) / self.half_life_ms)

    def place(self, candidates: tuple[str, ...], blocks: int, now_ms: float) -> str:
        """The candidate with the fewest placed blocks (the first of equals), charged `blocks`."""
        best, chosen = 0.0, ""
        for name in candidates:
            load = self.load(name, now_ms)
            if not chosen or load < best:
                best, chosen = load, name
        self._loads[chosen] = (best + blocks, now_ms)
        return chosen


def with_others(
    snapshot: FleetSnapshot, others: Mapping[str, int], prefill: Mapping[str, int] | None = None
) -> FleetSnapshot:
    """The snapshot with the other processes' in-flight counts (and queued prefill tokens) added to
    this process's own (`WithOthers`, remembering nothing)."""
    return WithOthers()(snapshot, others, prefill)


class WithOthers:
    """`with_others` for a process that asks on every request: the views it builds are remembered
    (per backend: the own view and the others' figures it was built from; per pool: the own pool
    view and the backends it holds; the whole snapshot) and returned again while those are the
    same objects, so that a request rebuilds only what changed since the last one (a frozen
    dataclass costs ~2 us to build, `dataclasses.replace` ~3.5: 8 backends with the others' figures
    on every one cost 37 us a request when every view was rebuilt; `python -m bench.kv_micro
    --section 5`). An own pool view that is a new object is rebuilt: `Fleet.snapshot` makes a new
    one only when something in it changed."""

    __slots__ = ("_backends", "_last", "_pools")

    def __init__(self) -> None:
        self._backends: dict[str, tuple[BackendView, int, int, BackendView]] = {}
        self._pools: dict[str, tuple[PoolView, PoolView]] = {}  # name -> (own view, the others' added)
        self._last: FleetSnapshot | None = None

    def __call__(
        self, snapshot: FleetSnapshot, others: Mapping[str, int], prefill: Mapping[str, int] | None = None
    ) -> FleetSnapshot:
        if not others and not prefill:
            return snapshot
        more = prefill or {}
        memo = self._backends
        last_pools = self._pools
        pools: list[PoolView] = []
        for pool in snapshot.pools:
            backends: list[BackendView] = []
            changed = False
            for b in pool.backends:
                n = others.get(b.name, 0)
                t = more.get(b.name, 0)
                if n > 0 or t > 0:
                    hit = memo.get(b.name)
                    if hit is not None and hit[0] is b and hit[1] == n and hit[2] == t:
                        b = hit[3]
                    else:
                        added = replace(b, in_flight=b.in_flight + n, prefill=b.prefill + t)
                        memo[b.name] = (b, n, t, added)
                        b = added
                    changed = True
                backends.append(b)
            if changed:
                hit_pool = last_pools.get(pool.name)
                if (
                    hit_pool is not None
                    and hit_pool[0] is pool
                    and same_views(hit_pool[1].backends, backends)
                ):
                    pool = hit_pool[1]
                else:
                    added_pool = replace(pool, backends=tuple(backends))
                    last_pools[pool.name] = (pool, added_pool)
                    pool = added_pool
            pools.append(pool)
        last = self._last
        if last is not None and same_views(last.pools, pools):
            return last
        out = self._last = FleetSnapshot(tuple(pools))
        return out


#: the prefix of a working set's name among the counts a process reports: what follows is the
#: backend's name (a control character: no configured backend name begins with it)
SETS = "\x1f"
#: ... of a backend's queued prefill tokens (`BackendView.prefill`)
PREFILL = "\x1e"
#: ... of the requests waiting in the process's flow queue, by class (what follows is the class's name)
FLOW = "\x1d"


def split(others: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """The other processes' figures summed by name, taken apart: (in-flight counts, working sets and
    tails, queued prefill tokens), each by backend (the flow queues' figures are `flow_waiting`'s)."""
    counts: dict[str, int] = {}
    sets: dict[str, int] = {}
    prefill: dict[str, int] = {}
    for name, n in others.items():
        if name.startswith(SETS):
            sets[name[1:]] = n
        elif name.startswith(PREFILL):
            prefill[name[1:]] = n
        elif not name.startswith(FLOW):
            counts[name] = n
    return counts, sets, prefill


def flow_waiting(others: Mapping[str, int]) -> dict[str, int]:
    """The requests waiting in the other processes' flow queues, by class, from their figures."""
    out: dict[str, int] = {}
    for name, n in others.items():
        if name.startswith(FLOW) and n > 0:
            out[name[1:]] = n
    return out


def key_text(key: int) -> str:
    """A group key as the store names it (16 hex digits)."""
    return f"{key & 0xFFFFFFFFFFFFFFFF:016x}"


#: groups whose placement a process remembers (it proposes one only for a group it does not know):
#: ~150 bytes each, and a group's requests rarely span more than the last few thousand groups
PLACEMENTS = 4096


class SharedRouting:
    """One routing process's side of the shared placements (see the module docstring). Not
    thread-safe (the process's event loop only)."""

    __slots__ = ("_known", "_max", "_prefill_names", "_reported", "router")

    def __init__(self, router: Router, entries: int = PLACEMENTS) -> None:
        self.router = router
        self._known: OrderedDict[int, str] = OrderedDict()  # group key -> the store's placement
        self._max = max(1, entries)
        # the last working sets reported (`PrefixAffinity.working_sets`), under their store names
        self._reported: tuple[dict[str, int] | None, dict[str, int]] = (None, {})
        self._prefill_names: dict[str, str] = {}  # backend -> PREFILL + its name, built once

    def grouped(self, features: RequestFeatures) -> bool:
        """The request has a prefix group, so `ask` may want its tokens (the engines' events)."""
        policy = self.router.policy
        return isinstance(policy, PrefixAffinity) and group_blocks(features, policy.config) > 0

    def report(self, counts: Mapping[str, int], prefill: Mapping[str, int] | None = None) -> dict[str, int]:
        """What this process reports to the store: its in-flight `counts`, its queued `prefill`
        tokens (under `PREFILL` + name) and, for prefix affinity, its working sets and tails by
        backend (under `SETS` + name)."""
        out = dict(counts)
        if prefill:
            names = self._prefill_names
            for name, tokens in prefill.items():
                if tokens > 0:
                    key = names.get(name)
                    if key is None:
                        key = names[name] = PREFILL + name
                    out[key] = tokens
        policy = self.router.policy
        if isinstance(policy, PrefixAffinity):
            sets = policy.working_sets()
            last, named = self._reported
            if sets is not last:  # renamed once per change, not per request
                named = {SETS + name: size for name, size in sets.items()}
                self._reported = (sets, named)
            out.update(named)
        return out

    def ask(
        self,
        snapshot: Callable[[], FleetSnapshot],
        features: RequestFeatures,
        others: bool = False,
        elsewhere: Mapping[str, int] | None = None,
    ) -> Ask | None:
        """The store's part in routing this request, or None when it has none. `snapshot` is called
        only for a proposal (once per group and process), not for the requests of a known group.
        `others`: other routing processes have requests in flight (their counts came with the last
        answer), so what this process sent is only its part of the traffic: a new group's candidates
        then include the backends of the request's other pools this process finds as light
        (`Router.other_pools`). `elsewhere`: the other processes' working sets and tails, as
        last heard from the store and summed (`split`), which the proposal adds to this process's own."""
        router = self.router
        policy = router.policy
        if not isinstance(policy, PrefixAffinity):
            return None
        config = policy.config
        g = group_blocks(features, config)
        if not g:
            return None
        held = policy.holders(features)
        if held and max(held.values()) >= g / 2:
            return None  # the engines say where the group is: every process knows it already
        key = policy.key(features)
        if key in self._known:
            self._known.move_to_end(key)
            return Ask(key, None)
        fleet = snapshot()
        with policy.proposing(elsewhere):  # the store makes the processes agree: no slack needed
            try:
                decision = router.decide(fleet, features, 0.5, dry_run=True)
            except (RoutingError, ValueError):  # no eligible pool or backend: the decision proper reports it
                return Ask(key, None)
            proposal = decision.backend
            candidates = [proposal]
            chosen = fleet.pool(decision.pool)
            pools = [chosen] if chosen is not None else []
            if others and chosen is not None:
                pools += router.other_pools(fleet, features, decision.pool)
            for pool in pools:
                for name in policy.placement_choices(pool, features):
                    if name not in candidates:
                        candidates.append(name)
        return Ask(key, proposal, tuple(candidates), g)

    def learn(self, key: int, placed: str | None) -> None:
        """The store's placement for group `key` (None: it has none)."""
        known = self._known
        if placed is None:
            known.pop(key, None)
            return
        known[key] = placed
        known.move_to_end(key)
        if len(known) > self._max:
            known.popitem(last=False)

    @staticmethod
    def placed(features: RequestFeatures, placed: str | None, before: bool = False) -> RequestFeatures:
        """`features` with the store's placement of its group (`before`: set by an earlier request)."""
        before = before and placed is not None
        if placed == features.placed_on and before == features.placed_before:
            return features
        return replace(features, placed_on=placed, placed_before=before)


__all__ = [
    "FLOW",
    "PREFILL",
    "SETS",
    "Ask",
    "PlacedBlocks",
    "SharedRouting",
    "WithOthers",
    "flow_waiting",
    "key_text",
    "split",
    "with_others",
]
