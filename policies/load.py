"""How loaded a backend is, in one number, and when it is too loaded to take more.

The score combines what the gateway knows first-hand with what the engine last reported::

    engine = running + queue_weight * queue_depth    # the engine's count over all replicas, one
                                                     # scrape old (None values count as 0)
    score  = max(in_flight, engine) + kv_weight * kv_usage

`in_flight` is this replica's own, fresh count of requests sent and not finished: it already includes
the ones waiting in the engine's queue, so the engine's queue is not added to it (that counted a
single replica's queued requests twice); the engine's figure wins when other replicas keep the
engine busier than this one knows. A fleet without scraped metrics is balanced on in-flight counts
alone. `kv_weight` turns a full KV cache (1.0) into the equivalent of that many requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.types import BackendView


@dataclass(frozen=True, slots=True)
class LoadModel:
    """Weights of the load score and the thresholds beyond which a backend counts as saturated."""

    queue_weight: float = 1.0
    kv_weight: float = 4.0
    queue_high: float | None = 8.0
    kv_high: float | None = 0.95

    def score(self, backend: BackendView) -> float:
        active = float(backend.in_flight)
        engine = backend.running or 0.0
        if backend.queue_depth:
            engine += self.queue_weight * backend.queue_depth
        if engine > active:
            active = engine
        if backend.kv_usage:
            active += self.kv_weight * backend.kv_usage
        return active

    def scores(self, backends: Sequence[BackendView]) -> list[float]:
        """`score` of each of `backends` (`loads` without its saturation answer)."""
        return self.loads(backends)[0]

    def loads(self, backends: Sequence[BackendView]) -> tuple[list[float], bool]:
        """`score` of each of `backends`, and whether any of them is `saturated` (one pass for a pool:
        the decision's hot loop, both inlined; with none saturated, the ones that `fits` a bound are
        those whose score fits)."""
        queue_weight = self.queue_weight
        kv_weight = self.kv_weight
        queue_high = self.queue_high
        kv_high = self.kv_high
        out: list[float] = []
        saturated = False
        for backend in backends:
            in_flight = backend.in_flight
            active = float(in_flight)
            engine = backend.running or 0.0
            queue = backend.queue_depth
            if queue:
                engine += queue_weight * queue
            if engine > active:
                active = engine
            kv = backend.kv_usage
            if kv:
                active += kv_weight * kv
            out.append(active)
            limit = backend.max_concurrency
            if (
                (limit is not None and in_flight >= limit)
                or (queue_high is not None and queue is not None and queue > queue_high)
                or (kv_high is not None and kv is not None and kv > kv_high)
            ):
                saturated = True
        return out, saturated

    def fits(self, backends: Sequence[BackendView], scores: Sequence[float], bound: float) -> list[bool]:
        """Per backend: its score (`scores`, in order) + 1 is within `bound` and it is not
        `saturated` (one call for a pool: the decision's hot loop, `saturated` inlined)."""
        queue_high = self.queue_high
        kv_high = self.kv_high
        if len(scores) != len(backends):
            raise ValueError("one score per backend")
        out: list[bool] = []
        for i, backend in enumerate(backends):
            if not scores[i] + 1.0 <= bound:
                out.append(False)
                continue
            limit = backend.max_concurrency
            queue = backend.queue_depth
            kv = backend.kv_usage
            out.append(
                not (
                    (limit is not None and backend.in_flight >= limit)
                    or (queue_high is not None and queue is not None and queue > queue_high)
                    or (kv_high is not None and kv is not None and kv > kv_high)
                )
            )
        return out

    def saturated(self, backend: BackendView) -> bool:
        """At its configured concurrency, or its engine queue or KV use is over the thresholds."""
        if backend.max_concurrency is not None and backend.in_flight >= backend.max_concurrency:
            return True
        queue = backend.queue_depth
        if self.queue_high is not None and queue is not None and queue > self.queue_high:
            return True
        return self.kv_high is not None and backend.kv_usage is not None and backend.kv_usage > self.kv_high


#: the load-balancing policies' model: a full KV cache weighs as four requests (an engine about to
#: preempt loses to one with room), and an engine queue past 8 or KV use past 95 % is saturated
#: (prefix affinity has its own, `AFFINITY_LOAD_MODEL`)
DEFAULT_LOAD_MODEL = LoadModel()
