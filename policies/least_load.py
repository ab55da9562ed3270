"""Least load: the routable backend with the lowest load score (`policies.load`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from policies.load import DEFAULT_LOAD_MODEL, LoadModel
from policies.policy import BackendPolicy
from policies.types import BackendChoice, PoolView, RequestFeatures, backend_choice


@dataclass(frozen=True, slots=True)
class LeastLoadConfig:
    kind: Literal["least_load"] = "least_load"
    load: LoadModel = DEFAULT_LOAD_MODEL


class LeastLoad(BackendPolicy):
    """Lowest `LoadModel.score`; ties are broken by `rand` (so equal backends share traffic evenly)."""

    def __init__(self, config: LeastLoadConfig = LeastLoadConfig()) -> None:
        self._load = config.load

    def select(self, pool: PoolView, features: RequestFeatures, rand: float) -> BackendChoice:
        score = self._load.score
        best: list[str] = []
        best_score = float("inf")
        for backend in pool.backends:
            if not backend.routable:
                continue
            s = score(backend)
            if s < best_score:
                best_score = s
                best = [backend.name]
            elif s == best_score:
                best.append(backend.name)
        if not best:
            raise ValueError(f"pool {pool.name!r} has no routable backend")
        return backend_choice(best[min(int(rand * len(best)), len(best) - 1)], "least-load")
