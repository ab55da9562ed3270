"""Round robin over a pool's routable backends (the baseline)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from policies.policy import BackendPolicy
from policies.types import BackendChoice, PoolView, RequestFeatures, backend_choice


@dataclass(frozen=True, slots=True)
class RoundRobinConfig:
    kind: Literal["round_robin"] = "round_robin"


class RoundRobin(BackendPolicy):
    """Cycles through the pool's backends in snapshot order, skipping unroutable ones.

    State: one cursor per pool name (bounded: cleared past `max_pools` names).
    """

    def __init__(self, config: RoundRobinConfig = RoundRobinConfig(), *, max_pools: int = 1024) -> None:
        self._cursor: dict[str, int] = {}
        self._max_pools = max_pools

    def select(self, pool: PoolView, features: RequestFeatures, rand: float) -> BackendChoice:
        backends = pool.backends
        n = len(backends)
        start = self._cursor.get(pool.name, 0)
        for step in range(n):
            backend = backends[(start + step) % n]
            if backend.routable:
                return backend_choice(backend.name, "rr")
        raise ValueError(f"pool {pool.name!r} has no routable backend")

    def on_routed(self, pool: PoolView, features: RequestFeatures, choice: BackendChoice) -> None:
        for i, backend in enumerate(pool.backends):
            if backend.name == choice.backend:
                if len(self._cursor) >= self._max_pools and pool.name not in self._cursor:
                    self._cursor.clear()
                self._cursor[pool.name] = (i + 1) % len(pool.backends)
                return
