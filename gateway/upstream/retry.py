"""A retry budget: retries may add at most `ratio` extra load on top of the requests, plus a floor.

Each request deposits `ratio` tokens; each retry spends one; `min_per_s` tokens accrue per second so a
quiet gateway can still fail over. The bucket holds at most ten seconds' worth of the floor plus what
requests deposited, so a burst of failures cannot turn into a retry storm against a sick fleet.
The clock is passed in.
"""

from __future__ import annotations

#: retries may add a fifth to the requests' load: enough to fail over past one sick backend in a
#: pool, not enough to multiply the load on a failing fleet (Finagle's and Envoy's default budget)
RATIO = 0.2
#: retries a quiet gateway may always make, per second
MIN_PER_S = 5.0


class RetryBudget:
    __slots__ = ("_at", "_cap", "_tokens", "min_per_s", "ratio")

    def __init__(self, ratio: float = RATIO, min_per_s: float = MIN_PER_S) -> None:
        self.ratio = ratio
        self.min_per_s = min_per_s
        self._cap = max(10.0 * min_per_s, 10.0)
        self._tokens = self._cap
        self._at = 0.0

    def _refill(self, now: float) -> None:
        if self._at:
            self._tokens = min(self._cap, self._tokens + (now - self._at) * self.min_per_s)
        self._at = now

    def on_request(self, now: float) -> None:
        self._refill(now)
        self._tokens = min(self._cap + 100.0 * self.ratio, self._tokens + self.ratio)

    def try_spend(self, now: float) -> bool:
        self._refill(now)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
