"""`Lease`: one upstream attempt's hold on the backend it was sent to.

The proxy opens a lease for each attempt and the lease owns everything the attempt changes on its
backend:

- **in flight**: the backend counts the attempt from the lease's opening to its `release` (routing's
  load, the admin API's view);
- **queued prefill**: the prompt tokens the routing expects the backend to prefill
  (`RequestContext.prefill`) count in its queue until the first token comes back (`prefilled`) or
  the attempt ends without one;
- **the circuit's verdict**: at most one of `succeeded` or `failed(kind)` per attempt; a failure is
  also reported to `on_failure` (the upstream-error metric). An attempt that ends without a verdict
  (the client left, the request was cancelled, an answer the engine could not be blamed for) leaves
  the circuit as it was.

- **started**: the backend's `started` counts the attempt once its first token came back, or once it
  ended without one (what corrects the engine's waiting gauge between scrapes, `policies.flow`).

`release` may be called from any path that ends the attempt (a failover, an error answer, the end of
a stream, a cancellation); only the first call counts. A `LeaseWatch` (the flow queue,
gateway/flow/gate.py) hears of each attempt's opening, first token and end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from gateway.core.fleet import Backend

#: told of a failed attempt: the backend and the failure's kind (`gateway_upstream_errors_total`)
OnFailure = Callable[[Backend, str], None]


class LeaseWatch(Protocol):
    def opened(self, backend: Backend) -> int:
        """An attempt opens on `backend`: the prefill tokens queued there ahead of it."""
        ...

    def first_token(self, backend: Backend, seconds: float, tokens: int) -> None:
        """Its first token came back `seconds` after it opened, behind `tokens` of prefill (the queue
        ahead and its own)."""
        ...

    def ended(self, backend: Backend) -> None:
        """The attempt is over (the backend has one request less)."""
        ...


class Lease:
    __slots__ = (
        "_at",
        "_on_failure",
        "_open",
        "_prefill",
        "_started",
        "_tokens",
        "_verdict",
        "_watch",
        "backend",
    )

    def __init__(
        self, backend: Backend, prefill: int, on_failure: OnFailure, watch: LeaseWatch | None = None
    ) -> None:
        self.backend = backend
        self._watch = watch
        if watch is not None:
            self._tokens = watch.opened(backend) + prefill
            self._at = time.perf_counter()
        backend.in_flight += 1
        backend.requests_total += 1
        backend.prefill += prefill
        self._prefill = prefill
        self._on_failure = on_failure
        self._verdict = False
        self._open = True
        self._started = False

    def prefilled(self) -> None:
        """The first token came back: the prompt leaves the backend's queued prefill."""
        self._start(True)

    def _start(self, token: bool) -> None:
        if self._prefill:
            self.backend.prefill -= self._prefill
            self._prefill = 0
        if not self._started:
            self._started = True
            self.backend.started += 1
            watch = self._watch
            if token and watch is not None:
                watch.first_token(self.backend, time.perf_counter() - self._at, self._tokens)

    def succeeded(self) -> None:
        """The backend answered as a healthy one does (the circuit's verdict, if none yet)."""
        if not self._verdict:
            self._verdict = True
            self.backend.circuit.success()

    def failed(self, kind: str) -> None:
        """The backend failed this attempt in a way of `kind` (the circuit's verdict, if none yet)."""
        if not self._verdict:
            self._verdict = True
            self.backend.circuit.failure(time.monotonic())
            self._on_failure(self.backend, kind)

    def release(self) -> None:
        """The attempt is over: out of the backend's in-flight count and queued prefill."""
        if self._open:
            self._open = False
            self._start(False)
            self.backend.in_flight -= 1
            if self._watch is not None:
                self._watch.ended(self.backend)
