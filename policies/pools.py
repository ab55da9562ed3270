"""Pool choice: which pool may serve a request (eligibility, rules) and which one does (weights).

Steps, in order:
1. Pools that list the model. None -> `RoutingError("unknown_model")`.
2. An admin pin (a pool name) skips the rules and the weights (a pinned pool may have weight 0) but
   not capability or health: the pool must serve the model, support what the request needs, and have
   a routable backend. Unknown pin -> `RoutingError("unknown_pool")`.
3. Capable pools: a request that may call tools (`tools` given, `tool_choice` not `none`) needs
   `tool_calling`; a structured-output request needs `structured_output`.
4. Live pools: capable, weight > 0, at least one routable backend. None -> `"unavailable"`.
5. Rules, first match wins: the candidates become the live pools named in `then_pools`. If none of them
   is live, a `strict` rule fails the request (`"unavailable"`); otherwise the next matching rule is
   tried, and finally all live pools.
6. A retry's `prefer`red pool (the pool of the attempt that failed) is kept while it is among the
   candidates, i.e. while it still has a routable backend: failover tries the pool's other backends
   first. Once it has none, the choice is made again without it — non-strict rules are preferences,
   so the request fails over to the next eligible pool that serves the model; a `strict` rule keeps it
   inside the rule's pools (and fails it when none is left).
7. Among two or more candidates, a weighted choice by the pools' live weights: with a `sticky_key`,
   weighted rendezvous hashing (score `w / -ln(u(key, pool))`, so a conversation keeps its pool, the
   split over many conversations follows the weights, and a weight change moves only the share that
   must move); without one, the cumulative weights against `rand`. With a `place` hook (a prefix
   group's placement, `policies.pool_placement`), the pool it names among these candidates goes
   first in that order; the load bound still applies, stretched for a pool by a `stretch` hook (the
   requests' worth of the group its engines hold, `PrefixAffinity.pool_stretch`).

The reason is `pin`, or `rule:<name>` / `default`, followed by `+weights` when weights decided;
`retry` when a retry stayed in its pool.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from policies.features import LONG_PREAMBLE_BLOCKS
from policies.hashing import NameHashes, mix64, unit_float
from policies.types import FleetSnapshot, PoolView, RequestFeatures, RoutingError, ToolChoice, new_tuple

_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


@dataclass(frozen=True, slots=True)
class Rule:
    """When every condition that is set holds, narrow the candidates to `then_pools`.

    A rule without conditions matches every request. `tool_choice_in` compares the effective tool
    choice: an absent `tool_choice` counts as `auto` with tools and `none` without.
    """

    name: str
    then_pools: tuple[str, ...]
    prompt_tokens_gte: int | None = None
    has_tools: bool | None = None
    structured_output: bool | None = None
    tool_choice_in: frozenset[ToolChoice] | None = None
    strict: bool = False
    #: reasoning asked for (`RequestFeatures.reasoning`)
    reasoning: bool | None = None
    #: the output asked for (`max_tokens`) is at least this long
    max_tokens_gte: int | None = None
    #: the request shares a long preamble with others (a prefix group: `LONG_PREAMBLE_BLOCKS`)
    shared_preamble: bool | None = None

    def __post_init__(self) -> None:
        if not _TOKEN.fullmatch(self.name):
            raise ValueError(f"rule name {self.name!r} must match {_TOKEN.pattern} (it goes in a header)")
        if not self.then_pools:
            raise ValueError(f"rule {self.name!r}: then_pools is empty")

    def matches(self, features: RequestFeatures) -> bool:
        if self.prompt_tokens_gte is not None and features.prompt_tokens < self.prompt_tokens_gte:
            return False
        if self.has_tools is not None and features.has_tools != self.has_tools:
            return False
        if self.structured_output is not None and features.structured_output != self.structured_output:
            return False
        if self.tool_choice_in is not None:
            choice = features.tool_choice or ("auto" if features.has_tools else "none")
            if choice not in self.tool_choice_in:
                return False
        if self.reasoning is not None and features.reasoning != self.reasoning:
            return False
        if self.max_tokens_gte is not None and (features.max_tokens or 0) < self.max_tokens_gte:
            return False
        if self.shared_preamble is not None:
            shared = features.preamble_blocks >= LONG_PREAMBLE_BLOCKS
            if shared != self.shared_preamble:
                return False
        return True


@dataclass(frozen=True, slots=True)
class PoolBalance:
    """Bounded load for the sticky pool choice (see the module docstring, 6). The load of a pool is
    this replica's own in-flight count over its routable backends: fresh, and never inflated by an
    engine scrape that still counts requests which have finished (which at low load would move a
    conversation to another pool for nothing). Every replica balances its own share of the traffic,
    so the fleet's total is balanced too."""

    load_factor: float = 0.25
    load_slack: float = 1.0


class PoolChoice(NamedTuple):
    pool: PoolView
    reason: str
    placed: str | None = None  # the pool the `place` hook named, if it was asked


def pool_choice(pool: PoolView, reason: str, placed: str | None = None) -> PoolChoice:
    """`PoolChoice(...)`, built in C (`policies.types.new_tuple`): on every request."""
    return new_tuple(PoolChoice, (pool, reason, placed))


# Given the candidate pools (two or more, after rules) in the key's rendezvous order, the one a
# prefix group should go to, or None for no preference.
PlaceHook = Callable[[Sequence[PoolView]], str | None]
# Requests a pool may carry above its bound because its engines hold the request's group.
StretchHook = Callable[[PoolView], float]


def capable(pool: PoolView, features: RequestFeatures) -> bool:
    """The pool's engines support what the request needs (tool parser, structured output)."""
    if features.needs_tool_parser and not pool.tool_calling:
        return False
    return not (features.structured_output and not pool.structured_output)


def choose_pool(
    snapshot: FleetSnapshot,
    features: RequestFeatures,
    rules: Sequence[Rule],
    rand: float,
    *,
    pin: str | None = None,
    sticky_key: int | None = None,
    name_hash: NameHashes | None = None,
    balance: PoolBalance | None = None,
    place: PlaceHook | None = None,
    prefer: str | None = None,
    stretch: StretchHook | None = None,
) -> PoolChoice:
    """The pool for this request (see the module docstring); raises `RoutingError`. `prefer`: the
    pool a retry comes from (kept while it is a candidate)."""
    model = features.model
    if pin is not None:
        pinned = snapshot.pool(pin)
        if pinned is None or model not in pinned.models:
            raise RoutingError("unknown_pool", "pin:unknown-pool")
        if not capable(pinned, features):
            raise RoutingError("unavailable", "pin:not-capable")
        if not pinned.has_routable_backend():
            raise RoutingError("unavailable", "pin:no-backend")
        return pool_choice(pinned, "pin")

    pools = snapshot.pools
    if len(pools) == 1 and prefer is None:
        return _only(pools[0], features, rules)
    candidates, label = _candidates(pools, features, rules)
    if prefer is not None:
        for p in candidates:
            if p.name == prefer:
                return pool_choice(p, "retry")
    if len(candidates) == 1:
        return pool_choice(candidates[0], label)
    if sticky_key is None:
        return pool_choice(_cumulative(candidates, rand), f"{label}+weights")
    ordered = hrw_order(candidates, sticky_key, name_hash or NameHashes())
    placed = place(ordered) if place is not None else None
    if placed is not None:  # the group's placed pool first, then the rendezvous order
        ordered.sort(key=lambda p: p.name != placed)
    return pool_choice(_bounded(ordered, balance, stretch), f"{label}+weights", placed)


def _candidates(
    pools: Sequence[PoolView], features: RequestFeatures, rules: Sequence[Rule]
) -> tuple[list[PoolView], str]:
    """Steps 1 and 3-5: the live pools the rules leave for the request, and the reason's label."""
    model = features.model
    serving = [p for p in pools if model in p.models]
    if not serving:
        raise RoutingError("unknown_model", "no-pool-serves-model")
    live = [p for p in serving if capable(p, features) and p.weight > 0 and p.has_routable_backend()]
    if not live:
        if not any(capable(p, features) for p in serving):
            raise RoutingError("unavailable", "no-capable-pool")
        raise RoutingError("unavailable", "no-eligible-pool")
    for rule in rules:
        if not rule.matches(features):
            continue
        narrowed = [p for p in live if p.name in rule.then_pools]
        if narrowed:
            return narrowed, f"rule:{rule.name}"
        if rule.strict:
            raise RoutingError("unavailable", f"rule:{rule.name}:no-eligible-pool")
    return live, "default"


def candidate_pools(
    snapshot: FleetSnapshot, features: RequestFeatures, rules: Sequence[Rule]
) -> list[PoolView]:
    """The pools `choose_pool` chooses among by weight for the request (no pin, no retry), in the
    snapshot's order; empty when it has none (`choose_pool` says why)."""
    try:
        return _candidates(snapshot.pools, features, rules)[0]
    except RoutingError:
        return []


def _only(pool: PoolView, features: RequestFeatures, rules: Sequence[Rule]) -> PoolChoice:
    """`choose_pool` for a snapshot of one pool and no retry (the common deployment, on every
    request): the same checks, errors and reasons, without the candidate lists; the weights never
    decide between one candidate."""
    if features.model not in pool.models:
        raise RoutingError("unknown_model", "no-pool-serves-model")
    # (a request with neither tools nor structured output is served by every pool)
    if (features.has_tools or features.structured_output) and not capable(pool, features):
        raise RoutingError("unavailable", "no-capable-pool")
    if not (pool.weight > 0 and pool.has_routable_backend()):
        raise RoutingError("unavailable", "no-eligible-pool")
    for rule in rules:
        if not rule.matches(features):
            continue
        if pool.name in rule.then_pools:
            return pool_choice(pool, f"rule:{rule.name}")
        if rule.strict:
            raise RoutingError("unavailable", f"rule:{rule.name}:no-eligible-pool")
    return pool_choice(pool, "default")


def _cumulative(pools: Sequence[PoolView], rand: float) -> PoolView:
    total = math.fsum(p.weight for p in pools)
    target = rand * total
    acc = 0.0
    for p in pools:
        acc += p.weight
        if target < acc:
            return p
    return pools[-1]


def _bounded(
    ordered: Sequence[PoolView], balance: PoolBalance | None, warm: StretchHook | None = None
) -> PoolView:
    """The first pool of `ordered` within the load bound, stretched by `warm` for a pool whose
    engines hold the request's group (see the module docstring, 6)."""
    if balance is None:
        return ordered[0]
    loads: list[float] = []
    sizes: list[int] = []
    for p in ordered:
        in_flight = 0
        size = 0
        for b in p.backends:
            if b.routable:
                in_flight += b.in_flight
                size += 1
        loads.append(float(in_flight))
        sizes.append(size)
    total = math.fsum(loads) + 1.0
    weights = math.fsum(p.weight for p in ordered)
    size = sum(sizes)
    stretch = 1.0 + balance.load_factor
    for i, p in enumerate(ordered):
        bound = stretch * total * max(p.weight / weights, sizes[i] / size) + balance.load_slack
        if loads[i] + 1.0 <= bound or (warm is not None and loads[i] + 1.0 <= bound + warm(p)):
            return p
    # every pool is over its share and busier than average: the least loaded per backend
    return ordered[min(range(len(ordered)), key=lambda i: (loads[i] + 1.0) / sizes[i])]


def hrw_order(pools: Sequence[PoolView], key: int, name_hash: NameHashes) -> list[PoolView]:
    """`pools` in the key's weighted rendezvous order (score `w / -ln(u(key, pool))`, highest first;
    names break ties)."""
    return sorted(
        pools,
        key=lambda p: (p.weight / -math.log(unit_float(mix64(key ^ name_hash(p.name)))), p.name),
        reverse=True,
    )
