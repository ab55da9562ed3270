"""How full the backends a request may use are: saturated or free, and where its first token would
come soonest, from this process's fleet, the other routing processes' queued prefill and the
requests the flow queue has just released (`policies.flow` holds the rules).

`check(model, tokens, klass, now, pools)` is the flow stage's one question per request. It walks the
routable backends of the pools serving `model` (their pool's weight above 0), of `pools` only when
given (the pools routing's rules leave the request: a document the rules send to one pool waits for
that pool instead of spilling onto the others), and answers

    FREE   some backend can take the request now: route it (`exclude` names the backends it must
           not go to, None when there are none)
    FULL   every routable backend is saturated, or as full as the class lets it be (its
           `max_kv_use`, `policies.flow` item 8): the request waits
    HOLD   backends are free, but each is predicted to miss the class's TTFT target by far because of
           the prefill queued there: the request waits
    NONE   no backend is routable: routing answers (503)

For a class with a TTFT target (`ttft_target_s`), a free backend whose predicted time to first token,
`base + (queued prefill + the request's tokens) * seconds per token` (its fitted line,
`policies.flow.TtftModel`), exceeds the target is left out of the route when at least one other meets
it; one whose queued prefill alone is predicted to take `FAR_MISS_FACTOR` times the target is left out
always. A backend without a fitted line yet counts as meeting the target.

Below saturation a check reads a few attributes per backend and allocates nothing for a class
without a target (a dict of predictions for one with a target).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from engines.base import EngineLoad
from gateway.core.fleet import Backend, Fleet
from policies.flow import FlowClass, TtftModel, engine_backlog, kv_full, saturated

#: a request whose backends' queued prefill alone is predicted to take this many times its class's
#: TTFT target waits instead (it would miss by far whatever it did; the queue ahead may drain)
FAR_MISS_FACTOR = 3.0

FREE: Final = 0
FULL: Final = 1
HOLD: Final = 2
NONE: Final = 3

#: (state, backends to leave out or None, predicted TTFT by backend or None)
Verdict = tuple[int, "frozenset[str] | None", "dict[str, float] | None"]
_FREE: Verdict = (FREE, None, None)
_FULL: Verdict = (FULL, None, None)
_HOLD: Verdict = (HOLD, None, None)
_NONE: Verdict = (NONE, None, None)

#: the other routing processes' queued prefill tokens by backend (`SharedLoad.others_prefill`)
OthersPrefill = Callable[[], Mapping[str, int]]


class Pressure:
    """See the module docstring. Event loop only."""

    def __init__(self, fleet: Fleet, stale_s: float) -> None:
        self._fleet = fleet
        self._stale_s = stale_s
        #: set by the root when routing processes share their load
        self.others_prefill: OthersPrefill | None = None
        #: seconds per prefill token per backend, learned from first tokens
        self.ttft = TtftModel()
        #: requests released from the queue and not yet sent, by the backend they were counted on:
        #: [requests, prompt tokens]
        self.transit: dict[str, list[int]] = {}
        self._backends: dict[str, tuple[Backend, ...]] = {}
        self._generation = -1
        #: what each engine ran at its last scrape that showed a queue: its capacity, as far as seen
        self._capacity: dict[str, float] = {}

    def backends(self, model: str) -> tuple[Backend, ...]:
        """The backends of the pools serving `model` (remembered until the fleet changes)."""
        fleet = self._fleet
        if fleet.generation != self._generation:
            self._backends.clear()
            self._generation = fleet.generation
        found = self._backends.get(model)
        if found is None:
            found = self._backends[model] = tuple(
                b for p in fleet.pools.values() if model in p.models for b in p.backends.values()
            )
        return found

    def _others(self) -> Mapping[str, int]:
        """The other routing processes' queued prefill tokens by backend (none when not shared)."""
        return self.others_prefill() if self.others_prefill is not None else {}

    def _usable(self, b: Backend, now: float, only: frozenset[str] | None) -> bool:
        """`b` may take a request now: of the pools `only` names (None: any), routable, its pool's
        weight above 0."""
        return (only is None or b.pool in only) and b.routable(now) and self._fleet.pools[b.pool].weight > 0

    def prefill(self, backend: Backend, others: Mapping[str, int] | None = None) -> int:
        """The prefill tokens queued on `backend`: every process's, and what is on its way there."""
        if others is None:
            others = self._others()
        tokens = backend.prefill + others.get(backend.name, 0)
        transit = self.transit.get(backend.name)
        return tokens + transit[1] if transit is not None else tokens

    def _scraped(self, backend: Backend, now: float) -> EngineLoad | None:
        """`backend`'s last scrape, None when there is none or it is stale."""
        load = backend.load
        return None if load is None or now - backend.load_at > self._stale_s else load

    def backlog(self, backend: Backend, now: float) -> float:
        """The requests `backend`'s engine holds waiting, as estimated now (`engine_backlog`)."""
        load = self._scraped(backend, now)
        if load is None:
            return 0.0
        transit = self.transit.get(backend.name)
        sent = backend.requests_total - backend.scrape_sent + (transit[0] if transit is not None else 0)
        started = backend.started - backend.scrape_started
        if load.waiting and load.running:
            self._capacity[backend.name] = load.running
        capacity = self._capacity.get(backend.name)
        return engine_backlog(load.waiting, load.running, sent, started, capacity)

    def is_saturated(
        self,
        backend: Backend,
        now: float,
        others: Mapping[str, int] | None = None,
        klass: FlowClass | None = None,
    ) -> bool:
        """`backend` takes no more requests (of `klass`, when given: its KV headroom counts too)."""
        rate = self.ttft.seconds_per_token(backend.name)
        if saturated(self.backlog(backend, now), self.prefill(backend, others), rate):
            return True
        if klass is None or klass.max_kv_use is None:
            return False
        load = self._scraped(backend, now)
        return load is not None and kv_full(load.kv_usage, klass.max_kv_use)

    def check(
        self, model: str, tokens: int, klass: FlowClass, now: float, only: frozenset[str] | None = None
    ) -> Verdict:
        """See the module docstring; `now` is `time.monotonic()` (circuits and scrapes), `only` the
        pools the request may use (None: all serving `model`)."""
        others = self._others()
        target = klass.ttft_target_s
        full: list[str] | None = None
        routable = free = 0
        for b in self.backends(model):
            if not self._usable(b, now, only):
                continue
            routable += 1
            if self.is_saturated(b, now, others, klass):
                if full is None:
                    full = []
                full.append(b.name)
            else:
                free += 1
        if not routable:
            return _NONE
        if not free:
            return _FULL
        if target is None:
            return _FREE if full is None else (FREE, frozenset(full), None)
        return self._placed(model, tokens, target, now, others, full, only)

    def _placed(
        self,
        model: str,
        tokens: int,
        target: float,
        now: float,
        others: Mapping[str, int],
        full: list[str] | None,
        only: frozenset[str] | None,
    ) -> Verdict:
        """The free backends sorted by their predicted time to first token against `target`."""
        predicted: dict[str, float] = {}
        meets: list[str] = []
        misses: list[str] = []
        far: list[str] = list(full) if full is not None else []
        for b in self.backends(model):
            if b.name in far or not self._usable(b, now, only):
                continue
            line = self.ttft.line(b.name)
            if line is None:
                meets.append(b.name)
                continue
            base, spt = line
            ahead = self.prefill(b, others)
            guess = predicted[b.name] = base + (ahead + tokens) * spt
            if guess <= target:
                meets.append(b.name)
            elif ahead * spt > target * FAR_MISS_FACTOR:
                far.append(b.name)
            else:
                misses.append(b.name)
        if not meets and not misses:
            return (HOLD, None, predicted)
        left_out = far + misses if meets else far
        return (FREE, frozenset(left_out) if left_out else None, predicted)

    def soonest(
        self,
        model: str,
        exclude: frozenset[str] | None,
        now: float,
        only: frozenset[str] | None = None,
        klass: FlowClass | None = None,
    ) -> Backend | None:
        """The free backend of `model` (of the pools `only` names, when given; for `klass`, when
        given) outside `exclude` with the least queued ahead (where a request released now is
        counted until it is sent)."""
        others = self._others()
        best: Backend | None = None
        best_key = (0.0, 0)
        for b in self.backends(model):
            if exclude is not None and b.name in exclude:
                continue
            if not self._usable(b, now, only) or self.is_saturated(b, now, others, klass):
                continue
            key = (self.backlog(b, now), self.prefill(b, others))
            if best is None or key < best_key:
                best, best_key = b, key
        return best

    def add_transit(self, backend: str, tokens: int) -> None:
        entry = self.transit.get(backend)
        if entry is None:
            self.transit[backend] = [1, tokens]
        else:
            entry[0] += 1
            entry[1] += tokens

    def drop_transit(self, backend: str, tokens: int) -> None:
        entry = self.transit.get(backend)
        if entry is None:
            return
        entry[0] -= 1
        entry[1] -= tokens
        if entry[0] <= 0:
            del self.transit[backend]

    def backend_names(self) -> list[str]:
        return list(self._fleet.backends)

    def saturated_backends(self, now: float) -> list[str]:
        """Every routable backend that is saturated now (for operators)."""
        others = self._others()
        return [
            b.name
            for b in self._fleet.backends.values()
            if b.routable(now) and self.is_saturated(b, now, others)
        ]
