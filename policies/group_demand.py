"""How much of a pool's traffic each prefix group carries, so a hot group spans several backends.

A prefix group (a long shared preamble, `policies.prefix_affinity.group_blocks`) lives on one
backend, its home. When the group alone brings that backend more than its share of the pool's
requests - four tool sets behind all agent traffic, one system prompt behind most of a tenant's -
the home runs a queue while its neighbours idle, and the bounded-load rule only moves requests off it
once the queue is several requests long. This module estimates each group's share of its pool's
recent requests and the `span` it implies (how many backends' worth it is); `PrefixAffinity` opens
another holder for a group while fewer than `span` backends hold it (its module docstring, 3).

The share is an exponentially decayed count over requests, not time (no clock: `policies/` stays
pure): each routed request multiplies every count of its pool by `1 - alpha`, applied lazily, and the
share is the group's count over the decayed weight of all the pool's requests this process has seen
(at least `HOT_MIN_REQUESTS`' worth, so that a fresh pool's first request is not the whole pool).
A replica sees a random sample of the traffic (the load balancer in front), so replicas estimate the
same shares and agree on the span without talking to each other - also early on, and with many
replicas: a share of the window's full weight (`1 / alpha`) would read a process's first
~`1 / alpha` requests as a fraction of their share, and one of 4 or 8 routing processes, seeing a
quarter or an eighth of the traffic, would keep a hot group's span at 1 for most of a run.

Bounded: at most `max_entries` (pool, key) counts, least recently updated forgotten first; ~320 bytes
each (tracemalloc, CPython 3.11), ~1.3 MB at the default 4,096.
"""

from __future__ import annotations

import math
from collections import OrderedDict

#: the least weight of requests a share is taken of (`GroupDemand.share`)
HOT_MIN_REQUESTS = 8.0


class GroupDemand:
    """Decayed per-(pool, group) request counts. Not thread-safe (the gateway's event loop only)."""

    __slots__ = ("_counts", "_decay", "_seen", "alpha", "max_entries")

    def __init__(self, alpha: float = 1 / 32, max_entries: int = 4096) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError("alpha must be in (0, 1)")
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        self.alpha = alpha
        self.max_entries = max_entries
        self._decay = math.log1p(-alpha)
        # pool -> requests seen; (pool, key) -> (decayed count, the pool's requests seen then)
        self._seen: dict[str, int] = {}
        self._counts: OrderedDict[tuple[str, int], tuple[float, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._counts)

    def note(self, pool: str, key: int | None) -> None:
        """One request was routed in `pool`; `key` is its group's routing key (None: not a group)."""
        seen = self._seen.get(pool, 0) + 1
        self._seen[pool] = seen
        if key is None or self.max_entries == 0:
            return
        counts = self._counts
        entry = (pool, key)
        old = counts.get(entry)
        value = 1.0 if old is None else old[0] * math.exp(self._decay * (seen - old[1])) + 1.0
        counts[entry] = (value, seen)
        counts.move_to_end(entry)
        if len(counts) > self.max_entries:
            counts.popitem(last=False)

    def share(self, pool: str, key: int) -> float:
        """The group's fraction of the pool's recent requests as this process has seen them, 0.0
        when unknown: its decayed count over the decayed weight of the pool's requests seen so far
        (one of many routing processes, or a process early in a run, has seen few), at least
        `HOT_MIN_REQUESTS`' weight (a pool's first request is not the whole pool)."""
        count = self._count(pool, key)
        if not count:
            return 0.0
        total = -math.expm1(self._decay * self._seen[pool]) / self.alpha  # the decayed weight seen
        return count / max(total, HOT_MIN_REQUESTS)

    def hot(self, pool: str, key: int, backends: int, headroom: float) -> bool:
        """The group brings more than one backend's worth of the pool's requests: its share x
        `backends` / `headroom` > 1."""
        return self.share(pool, key) * backends > headroom

    def _count(self, pool: str, key: int) -> float:
        """The group's decayed request count now, 0.0 when unknown."""
        old = self._counts.get((pool, key))
        if old is None:
            return 0.0
        return old[0] * math.exp(self._decay * (self._seen[pool] - old[1]))

    def span(self, pool: str, key: int, backends: int, headroom: float) -> int:
        """How many backends the group should be warm on: its share of the pool in backends'
        worth, divided by `headroom` (1 + the bounded-load factor: a backend may run that far above
        the average), rounded up; at least 1, at most `backends`."""
        worth = self.share(pool, key) * backends / headroom
        return max(1, min(backends, math.ceil(worth - 1e-9)))
