"""Which pool a new prefix group goes to: the pools' working sets, as inside a pool.

The sticky pool choice (`policies.pools`, weighted rendezvous on the routing key) spreads prefix
groups over the pools by hash. With few groups that is lumpy: twelve long documents split 7 / 5 over
two pools of four engines, and the pool with seven runs near its capacity while the other idles; its
engines then spill documents to each other and every document ends up cached on most of them (the
routing bench at 80 % load: long_document_qa 53 %, shared_prefix 76 % of the oracle; the same fleet
as one pool: 95 % on shared_prefix).

So a group this replica has not placed yet (a long preamble or a long opening: `group_blocks`) goes
to the first pool, in the weighted rendezvous order, whose working set per unit of weight is within
one group (this request's prompt) of the lightest — the rule `policies.prefix_affinity` uses for
backends, and for the same reason: the strictly lightest flips between replicas on near-ties, the
slack keeps them mostly agreeing (the routing bench's replay at 80 % load, 1 / 2 / 4 replicas:
shared_prefix 73 / 51 / 52 -> 97 / 70 / 55 % of the oracle). An *opening* group (a long first message
under a short preamble: a document asked about) takes the lightest pool itself, as inside a pool:
warm documents do not spill on engine queues (`policies.prefix_affinity`'s load model), so a 7 / 5
split would leave the pool with seven near its capacity. The group then stays there (first in the
pool order), subject to the pool load bound. A conversation (anchor key) is not a group: it keeps the
plain weighted rendezvous, so the split over many conversations follows the weights exactly.

Local and bounded like the backend working sets: this replica's own decisions, at most
`working_set_entries` groups remembered (LRU), ~3 MB at the default 16,384.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from policies.prefix_affinity import PrefixAffinityConfig, opening_group
from policies.types import PoolView, RequestFeatures
from policies.working_sets import WorkingSets, first_within


class PoolPlacement:
    __slots__ = ("_config", "_max", "_placed", "_sets")

    def __init__(self, config: PrefixAffinityConfig) -> None:
        self._config = config
        self._max = config.working_set_entries
        self._placed: OrderedDict[int, str] = OrderedDict()
        self._sets = WorkingSets(config.working_set_entries)

    def place(self, order: Sequence[PoolView], features: RequestFeatures, key: int) -> str:
        """The pool group `key` should go to among `order`: the request's candidate pools (two or
        more, after the rules), in the key's weighted rendezvous order (`policies.pools.choose_pool`).
        """
        placed = self._placed.get(key)
        if placed is not None and any(p.name == placed for p in order):
            self._placed.move_to_end(key)
            return placed
        # one group of this size for a long preamble; none for an opening group, as inside a pool
        slack = 0.0 if opening_group(features, self._config) else float(len(features.block_hashes))
        return order[first_within(self._loads(order), slack)].name

    def as_light(self, pools: Sequence[PoolView], features: RequestFeatures) -> list[PoolView]:
        """Of `pools` (the first the one this process chose for a new group), those a placement may
        take instead when several processes route: for a long preamble's group, those whose working
        set per unit of weight is within `place`'s slack (one group) of the first's; for an opening
        group, which `place` gives the strictly lightest pool by what this process alone sent, all."""
        if opening_group(features, self._config):
            return list(pools)
        loads = self._loads(pools)
        limit = loads[0] + len(features.block_hashes)
        return [p for p, load in zip(pools, loads, strict=True) if load <= limit]

    def _loads(self, pools: Sequence[PoolView]) -> list[float]:
        """Each pool's working set per unit of weight (scaled by the pools' mean weight)."""
        mean_weight = math.fsum(p.weight for p in pools) / len(pools)
        return [self._sets.size(p.name) * mean_weight / p.weight for p in pools]

    def note(self, key: int, placed: str, routed: str, features: RequestFeatures) -> None:
        """Record the group's placed pool and what was sent to the pool that served it."""
        if self._max == 0:
            return
        self._placed[key] = placed
        self._placed.move_to_end(key)
        if len(self._placed) > self._max:
            self._placed.popitem(last=False)
        self._sets.note(key, routed, len(features.block_hashes))
