"""Power of two choices: two distinct random routable backends, the less loaded one wins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from policies.load import DEFAULT_LOAD_MODEL, LoadModel
from policies.policy import BackendPolicy
from policies.types import BackendChoice, PoolView, RequestFeatures, backend_choice


@dataclass(frozen=True, slots=True)
class PowerOfTwoConfig:
    kind: Literal["power_of_two"] = "power_of_two"
    load: LoadModel = DEFAULT_LOAD_MODEL


class PowerOfTwo(BackendPolicy):
    """Both candidates come from the one `rand`: its integer part over n picks the first, the
    remaining fraction picks the second among the other n-1. Ties go to the first candidate."""

    def __init__(self, config: PowerOfTwoConfig = PowerOfTwoConfig()) -> None:
        self._load = config.load

    def select(self, pool: PoolView, features: RequestFeatures, rand: float) -> BackendChoice:
        routable = [b for b in pool.backends if b.routable]
        n = len(routable)
        if n == 0:
            raise ValueError(f"pool {pool.name!r} has no routable backend")
        if n == 1:
            return backend_choice(routable[0].name, "p2c")
        scaled = rand * n
        i = min(int(scaled), n - 1)
        j = min(int((scaled - i) * (n - 1)), n - 2)
        if j >= i:
            j += 1
        first, second = routable[i], routable[j]
        winner = second if self._load.score(second) < self._load.score(first) else first
        return backend_choice(winner.name, "p2c")
