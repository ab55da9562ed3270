"""The gateway's queue at saturation: which waiting request goes next, and which to refuse. Pure: no
clock (time is handed in), no I/O, no asyncio.

1. **Classes, strictly by priority.** Each request belongs to a class (`interactive`, `standard`,
   `batch` by default); a lower `priority` number always goes first.
2. **Fair shares within a class, by tokens.** Start-time fair queuing over tenants: a tenant's next
   request is tagged `start = max(V, finish[tenant])`, and `finish[tenant] = start + cost / weight`,
   where `cost` is the request's prompt tokens plus the output it asks for and `weight` the tenant's
   share. The smallest start tag goes first and the class's virtual time `V` moves to it. A tenant
   of long prompts gets tokens at its weight's share, not requests, and cannot starve one of short
   prompts; an idle tenant's credit does not pile up (its start never lies behind `V`).
3. **Deadlines.** A request leaves at its deadline (its class's `max_queue_s`, or shorter when it
   asks): `expired` hands those back to be refused (503: the fleet is saturated).
4. **Depth.** A class holds at most `max_depth` waiting requests. A newcomer to a full class is
   refused: 429 when its tenant already holds at least its weighted share of the class's queued
   tokens (the caller's share is used up), else 503 (the fleet is saturated).
5. **Release.** `pop(can_start)` gives the first request, in the order above, for which
   `can_start` says a backend can take it now (the caller's view of which backends are free).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

Refusal = Literal["quota", "saturated"]


@dataclass(frozen=True, slots=True)
class FlowClass:
    name: str
    #: lower goes first
    priority: int
    #: the longest a request of the class waits (a request may ask for less)
    max_queue_s: float
    #: waiting requests the class holds at most
    max_depth: int


@dataclass(slots=True, eq=False)
class Waiting:
    """One queued request. `ref` is the caller's handle for it (its future, its context)."""

    klass: str
    tenant: str
    cost: int
    weight: float
    deadline: float
    ref: Any = None
    start: float = 0.0
    finish: float = 0.0


@dataclass(slots=True)
class _ClassQueue:
    spec: FlowClass
    items: list[Waiting] = field(default_factory=list)
    virtual: float = 0.0
    finish: dict[str, float] = field(default_factory=dict)


class FlowQueue:
    """Every class's waiting requests (one per gateway process)."""

    def __init__(self, classes: Iterable[FlowClass]) -> None:
        specs = sorted(classes, key=lambda c: c.priority)
        self._queues: dict[str, _ClassQueue] = {c.name: _ClassQueue(c) for c in specs}
        self._order = [self._queues[c.name] for c in specs]

    def __len__(self) -> int:
        return sum(len(q.items) for q in self._order)

    def depth(self, klass: str) -> int:
        return len(self._queues[klass].items)

    def queued_tokens(self, klass: str) -> int:
        return sum(w.cost for w in self._queues[klass].items)

    def push(self, item: Waiting) -> Refusal | None:
        """Queue `item`; a refusal (and nothing queued) when its class is full."""
        q = self._queues[item.klass]
        if len(q.items) >= q.spec.max_depth:
            return "quota" if self._over_share(q, item) else "saturated"
        item.start = max(q.virtual, q.finish.get(item.tenant, 0.0))
        item.finish = item.start + item.cost / item.weight
        q.finish[item.tenant] = item.finish
        q.items.append(item)
        return None

    def _over_share(self, q: _ClassQueue, item: Waiting) -> bool:
        """Does `item`'s tenant hold at least its weighted share of the class's queued tokens?"""
        weights: dict[str, float] = {w.tenant: w.weight for w in q.items}
        weights[item.tenant] = item.weight
        held = sum(w.cost for w in q.items if w.tenant == item.tenant)
        total = sum(w.cost for w in q.items)
        return total > 0 and held >= total * item.weight / sum(weights.values())

    def pop(self, can_start: Callable[[Waiting], bool]) -> Waiting | None:
        """The next request a backend can take now, taken out of the queue (None: none can)."""
        for q in self._order:
            best: Waiting | None = None
            for w in q.items:
                if (best is None or w.start < best.start) and can_start(w):
                    best = w
            if best is not None:
                q.items.remove(best)
                q.virtual = max(q.virtual, best.start)
                if not q.items:
                    q.finish.clear()  # an empty class starts afresh: no credit carried over
                return best
        return None

    def remove(self, item: Waiting) -> bool:
        """Take `item` out (its client left); False when it was not queued."""
        q = self._queues[item.klass]
        try:
            q.items.remove(item)
        except ValueError:
            return False
        if not q.items:
            q.finish.clear()
        return True

    def expired(self, now: float) -> list[Waiting]:
        """Every request whose deadline has passed, taken out of the queue."""
        out: list[Waiting] = []
        for q in self._order:
            late = [w for w in q.items if w.deadline <= now]
            for w in late:
                q.items.remove(w)
            out += late
            if late and not q.items:
                q.finish.clear()
        return out

    def next_deadline(self) -> float | None:
        deadlines = [w.deadline for q in self._order for w in q.items]
        return min(deadlines) if deadlines else None
