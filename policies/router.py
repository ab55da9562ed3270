"""The routing decision for one request: pool choice (`policies.pools`) then backend choice (the
configured `BackendPolicy`).

`Router.decide` is synchronous, allocation-light and does no I/O; the gateway calls it on every request
with its current `FleetSnapshot`, the request's `RequestFeatures` and a random float. The router owns the
policy's routing state (e.g. the prefix index), so keep one `Router` per gateway process.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Collection, Sequence
from typing import Literal

from policies.factory import PolicyConfig, make_policy
from policies.hashing import NameHashes, mix64
from policies.kv_index import KvIndex
from policies.policy import BackendPolicy
from policies.pool_placement import PoolPlacement
from policies.pools import PlaceHook, PoolBalance, Rule, StretchHook, candidate_pools, choose_pool
from policies.prefix_affinity import DEFAULT_CONFIG as DEFAULT_AFFINITY_CONFIG
from policies.prefix_affinity import PrefixAffinity, PrefixAffinityConfig, group_blocks, routing_key
from policies.types import Decision, FleetSnapshot, PoolView, RequestFeatures, RoutingError, decision

PoolChoiceMode = Literal["sticky", "random"]
# Keeps the pool-level rendezvous independent of the backend-level one (same anchor, other salt).
_POOL_SALT = 0x5F3759DF_2545F491
DEFAULT_POLICY_CONFIG: PolicyConfig = PrefixAffinityConfig()


class Router:
    """Pool rules + weights + one backend policy.

    `pool_choice="sticky"` (default) makes the weighted pool choice a function of the routing key of
    `policies.prefix_affinity.routing_key` (a long shared preamble, else the conversation anchor), so
    a prefix group stays in one pool and every turn of a conversation stays in the same pool (and so on the same backend), from
    any replica; over many conversations the split follows the weights. `"random"` draws the pool with
    `rand` on every request (the split follows the weights even for identical requests, but the turns
    of one conversation can land in different pools).
    """

    def __init__(
        self,
        rules: Sequence[Rule] = (),
        policy_config: PolicyConfig = DEFAULT_POLICY_CONFIG,
        *,
        pool_choice: PoolChoiceMode = "sticky",
    ) -> None:
        self.rules: tuple[Rule, ...] = tuple(rules)
        self.policy_config = policy_config
        self.pool_choice: PoolChoiceMode = pool_choice
        self.policy: BackendPolicy = make_policy(policy_config)
        #: the engines' KV-cache contents the policy scores by (prefix affinity only), fed by the
        #: gateway's event subscriber
        self.kv_index: KvIndex | None = (
            self.policy.kv_index if isinstance(self.policy, PrefixAffinity) else None
        )
        self._pool_names = NameHashes()
        # The sticky pool choice hashes the same key as prefix affinity (a long shared preamble, else
        # the conversation anchor), so a prefix group lives in one pool, not in every pool.
        self._key_config = (
            policy_config if isinstance(policy_config, PrefixAffinityConfig) else DEFAULT_AFFINITY_CONFIG
        )
        # ... with bounded load across pools, so a pool that drew more groups than its share does not
        # queue while the other idles. The bound is looser than the backend policy's
        # (`pool_load_factor`): a pool spill copies a whole prefix group into the other pool.
        self._balance = PoolBalance(self._key_config.pool_load_factor, self._key_config.load_slack)
        # ... and a new prefix group is placed in a pool by the pools' working sets, as inside a pool.
        self._groups = PoolPlacement(self._key_config)

    def decide(
        self,
        snapshot: FleetSnapshot,
        features: RequestFeatures,
        rand: float,
        pin: str | None = None,
        *,
        exclude: Collection[str] = (),
        prefer: str | None = None,
        dry_run: bool = False,
    ) -> Decision:
        """Pool and backend for this request, or `RoutingError`.

        `rand` is uniform in [0, 1). `pin` is an admin's pool pin. `exclude` names backends not to use
        and `prefer` the pool a retry comes from (failover after an upstream error: the pool's other
        backends first, then the next eligible pool; `policies.pools`). With `dry_run` no routing
        state changes (explain endpoint).
        """
        if exclude:
            snapshot = _without(snapshot, exclude)
        sticky_key: int | None = None
        place: PlaceHook | None = None
        stretch: StretchHook | None = None
        key = 0
        # (one pool: no key to hash, `choose_pool` uses it only to order several candidate pools)
        if self.pool_choice == "sticky" and len(snapshot.pools) > 1:
            policy = self.policy
            if isinstance(policy, PrefixAffinity):  # its config is the key's (remembered for select)
                g, key = policy.keyed(features)
            else:
                g = group_blocks(features, self._key_config)
                key = routing_key(features, self._key_config)
            sticky_key = mix64(key ^ _POOL_SALT)
            if pin is None and prefer is None and g:
                place = functools.partial(self._place, features=features, key=key)
                if isinstance(policy, PrefixAffinity):
                    stretch = functools.partial(policy.pool_stretch, features=features)
        pool_choice = choose_pool(
            snapshot,
            features,
            self.rules,
            rand,
            pin=pin,
            sticky_key=sticky_key,
            name_hash=self._pool_names,
            balance=self._balance,
            place=place,
            prefer=prefer,
            stretch=stretch,
        )
        pool = pool_choice.pool
        policy = self.policy
        choice = policy.select(pool, features, rand)
        if not dry_run:
            policy.on_routed(pool, features, choice)
            if pool_choice.placed is not None:
                self._groups.note(key, pool_choice.placed, pool.name, features)
        return decision(
            pool.name,
            choice.backend,
            f"{pool_choice.reason}+{choice.reason}",
            choice.affinity,
            choice.warm,
            choice.warm_tokens,
            choice.prefill,
        )

    def _place(self, order: Sequence[PoolView], features: RequestFeatures, key: int) -> str:
        """The pool a prefix group goes to among `order` (its candidate pools in rendezvous order):
        the pool of the backend whose engine holds most of the group (its KV events), else the pool
        of the backend the fleet's shared store placed it on, else this process's own placement
        (`policies.pool_placement`). Engines' events and the shared store are what every routing
        process sees alike; without them each process places a group by what it sent itself, and
        two processes put one group in two pools."""
        policy = self.policy
        if isinstance(policy, PrefixAffinity):
            held = policy.holders(features)
            if held:
                need = group_blocks(features, self._key_config) / 2
                best, most = None, 0.0
                for pool in order:
                    for b in pool.backends:
                        got = held.get(b.name, 0.0)
                        if got > most and b.routable:
                            best, most = pool.name, got
                if best is not None and most >= need:
                    return best
        placed = features.placed_on
        if placed is not None:
            for pool in order:
                if any(b.name == placed and b.routable for b in pool.backends):
                    return pool.name
        return self._groups.place(order, features, key)

    def other_pools(self, snapshot: FleetSnapshot, features: RequestFeatures, chosen: str) -> list[PoolView]:
        """For a new prefix group this process would place in pool `chosen`: the request's other
        candidate pools (`policies.pools.candidate_pools`) that this process finds about as light
        (`PoolPlacement.as_light`) and whose weight per backend is `chosen`'s, so one backend's placed
        blocks weigh the same in each. The shared store may place the group there instead when
        several processes route (`policies.shared_load`)."""
        pools = candidate_pools(snapshot, features, self.rules)
        home = next((p for p in pools if p.name == chosen), None)
        if home is None or not home.backends:
            return []
        per = home.weight / len(home.backends)
        same = [home] + [
            p
            for p in pools
            if p is not home and p.backends and math.isclose(p.weight / len(p.backends), per, rel_tol=1e-9)
        ]
        return self._groups.as_light(same, features)[1:] if len(same) > 1 else []


def _without(snapshot: FleetSnapshot, exclude: Collection[str]) -> FleetSnapshot:
    pools: list[PoolView] = []
    for pool in snapshot.pools:
        if any(b.name in exclude for b in pool.backends):
            kept = tuple(b for b in pool.backends if b.name not in exclude)
            pool = dataclasses.replace(pool, backends=kept)
        pools.append(pool)
    return FleetSnapshot(tuple(pools))


__all__ = ["DEFAULT_POLICY_CONFIG", "PoolChoiceMode", "Router", "RoutingError"]
