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

`release` may be called from any path that ends the attempt (a failover, an error answer, the end of
a stream, a cancellation); only the first call counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.core.fleet import Backend

#: told of a failed attempt: the backend and the failure's kind (`gateway_upstream_errors_total`)
OnFailure = Callable[[Backend, str], None]


class Lease:
    __slots__ = ("_on_failure", "_open", "_prefill", "_verdict", "backend")

    def __init__(self, backend: Backend, prefill: int, on_failure: OnFailure) -> None:
        self.backend = backend
        backend.in_flight += 1
        backend.requests_total += 1
        backend.prefill += prefill
        self._prefill = prefill
        self._on_failure = on_failure
        self._verdict = False
        self._open = True

    def prefilled(self) -> None:
        """The first token came back: the prompt leaves the backend's queued prefill."""
        if self._prefill:
            self.backend.prefill -= self._prefill
            self._prefill = 0

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
            self.prefilled()
            self.backend.in_flight -= 1
