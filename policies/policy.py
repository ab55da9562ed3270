"""The one interface every backend policy implements.

Contract:
- `select` is called only with a pool that has at least one routable backend and returns the name of
  one of the pool's routable backends (healthy, not draining, circuit closed). It must not change any
  state: the admin explain endpoint calls it for dry runs.
- `on_routed` is called exactly once when the gateway commits to a `select` result (not for dry runs);
  it is the only place a policy updates its routing state (round-robin cursor, prefix index).
- `warm_skipped` is called when the gateway did not send the warm-up a committed choice asked for
  (`BackendChoice.warm`: its warm-ups were at their cap), so that the policy does not wait for it.

Policies subclass `BackendPolicy` explicitly to inherit the no-op hook. `rand` is a float in [0, 1)
supplied by the caller (policies never use a global random source).
"""

from __future__ import annotations

from typing import Protocol

from policies.types import BackendChoice, PoolView, RequestFeatures


class BackendPolicy(Protocol):
    def select(self, pool: PoolView, features: RequestFeatures, rand: float) -> BackendChoice: ...

    def on_routed(self, pool: PoolView, features: RequestFeatures, choice: BackendChoice) -> None:
        return None

    def warm_skipped(self, features: RequestFeatures) -> None:
        return None
