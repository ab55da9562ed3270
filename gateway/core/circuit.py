"""A per-backend circuit breaker: consecutive failures open it, time half-opens it, a success closes it.

    closed ──(failure_threshold consecutive failures)──► open ──(open_s elapsed)──► half_open
      ▲                                                                               │
      └───────────────(a success)─────────────── half_open ──(a failure)──► open ◄────┘

In `half_open` exactly one trial request is let through (`allow` returns True once) until it reports.
The clock is passed in, so the machine is deterministic and testable without sleeping.
"""

from __future__ import annotations

from typing import Literal

State = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    __slots__ = ("_failures", "_opened_at", "_trial_out", "failure_threshold", "open_s", "state", "successes")

    def __init__(self, failure_threshold: int, open_s: float) -> None:
        self.failure_threshold = failure_threshold
        self.open_s = open_s
        self.state: State = "closed"
        self._failures = 0
        self._opened_at = 0.0
        self._trial_out = False
        #: successes reported so far (a health probe that timed out while this grew met a backend
        #: that was answering requests: busy, not down)
        self.successes = 0

    def allow(self, now: float) -> bool:
        """May a request go to this backend now? In half-open, True once until the trial reports."""
        if self.state == "closed":
            return True
        if self.state == "open":
            if now - self._opened_at < self.open_s:
                return False
            self.state = "half_open"
            self._trial_out = False
        if self._trial_out:
            return False
        self._trial_out = True
        return True

    def is_open(self, now: float) -> bool:
        """Open and not yet due for a trial (for routing snapshots; does not consume the trial)."""
        if self.state == "open":
            return now - self._opened_at < self.open_s
        return self.state == "half_open" and self._trial_out

    def reopens_in(self, now: float) -> float:
        """Seconds until an open circuit lets a trial through (0 when it is not open)."""
        return max(0.0, self._opened_at + self.open_s - now) if self.state == "open" else 0.0

    def success(self) -> None:
        self.successes += 1
        self.state = "closed"
        self._failures = 0
        self._trial_out = False

    def failure(self, now: float) -> None:
        # Routing lets requests through once `open_s` has elapsed (`is_open` turns False) without
        # calling `allow`, so a failure then is a failed trial too: open again, or the breaker would
        # stay "open" yet let everything through until a success (a fast-failing backend then draws
        # traffic under least-load routing).
        if self.state == "half_open" or (self.state == "open" and now - self._opened_at >= self.open_s):
            self._open(now)
            return
        self._failures += 1
        if self.state == "closed" and self._failures >= self.failure_threshold:
            self._open(now)

    def _open(self, now: float) -> None:
        self.state = "open"
        self._opened_at = now
        self._trial_out = False
