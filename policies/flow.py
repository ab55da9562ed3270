"""Flow control at saturation: when a backend is saturated, which waiting request goes next, which to
refuse, and what a request's time to first token is predicted to be. Pure: no clock (time is handed
in), no I/O, no asyncio.

1. **Saturation** (`engine_backlog`, `saturated`). A backend is saturated while its engine queues
   requests or while the prefill queued there would take long. The engine's own waiting gauge says
   the first, as of its last scrape; the gateway corrects it for what it saw since: every request
   sent there since the scrape adds one, every first token (or end, for a request that showed none)
   since takes one away, so the backlog is known between scrapes and one that drains is seen at
   once. An engine that queued nothing at the scrape had room for more: what it ran at its last
   scrape with a queue (its capacity, as far as seen) less what it runs now, at least one; before it
   was ever seen queueing, `SCRAPE_ROOM` (so a queue that drained is not refilled all at once
   between two reads). The second is the prompt
   tokens sent there and not yet answered with a first token (`BackendView.prefill`, every routing
   process's), timed at the backend's learned seconds per token (item 7). Until a backend has a
   rate, its queued prefill says nothing: a count of tokens is no measure of time, and a
   non-streamed request's prompt counts there until its whole answer is back.
2. **Classes, strictly by priority.** Each request belongs to a class (`interactive`, `standard`,
   `batch` by default); a lower `priority` number always goes first.
3. **Fair shares within a class, by tokens.** Start-time fair queuing over tenants: a tenant's next
   request is tagged `start = max(V, finish[tenant])`, and `finish[tenant] = start + cost / weight`,
   where `cost` is the request's prompt tokens plus the output it asks for and `weight` the tenant's
   share. The smallest start tag goes first and the class's virtual time `V` moves to it. A tenant
   of long prompts gets tokens at its weight's share, not requests, and cannot starve one of short
   prompts; an idle tenant's credit does not pile up (its start never lies behind `V`).
4. **Deadlines.** A request leaves at its deadline (its class's `max_queue_s`, or shorter when it
   asks): `expired` hands those back to be refused (503: the fleet is saturated).
5. **Depth.** A class holds at most `max_depth` waiting requests. A newcomer to a full class is
   refused (429) when its tenant already holds at least its weighted share of the class's queued
   tokens: the caller's share is used up. Otherwise it takes the place of the request that would go
   last of the tenant furthest over its share (`evict_for`), which is refused instead (429): a
   tenant that fills the queue cannot keep a lighter one out.
6. **Release.** `pop(can_start)` gives the first request, in the order above, for which
   `can_start` says a backend can take it now (the caller's view of which backends are free).
7. **Time to first token** (`TtftModel`). A backend's first token comes after the prefill queued
   ahead of the request and its own: `base + (ahead + own) * seconds_per_token`, a line fitted per
   backend (least squares over its recent first tokens) to the times to first token it showed
   against the tokens they waited for. `base` is what a request costs whatever its size (a step, the
   scheduling); a backend whose first tokens all waited for about as many tokens has no rate yet.
8. **Headroom** (`kv_full`). A class may stop short of saturation: with `max_kv_use`, a backend whose
   engine reported that share of its KV cache in use takes no more of it, so the room left is the
   more urgent classes'. An engine admits no request it has no KV room for, and preempts none for
   priority: without headroom, an urgent request at a full engine waits for a running one to end.
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

Refusal = Literal["quota", "saturated"]

#: queued prefill, in seconds at the backend's learned rate, at which it takes no more: a request sent
#: behind it waits that long for its own first token, a quarter of the interactive class's target
PREFILL_SATURATED_S = 0.25


#: requests an engine never seen queueing is assumed to take, after a scrape with no queue, before it
#: queues: a release after a drained queue is a burst of this size, not the whole gateway queue
SCRAPE_ROOM = 16


def engine_backlog(
    waiting: float | None,
    running: float | None,
    sent_since: int,
    started_since: int,
    capacity: float | None = None,
) -> float:
    """The requests the engine is estimated to hold waiting now (above 0: saturated): its waiting
    gauge as of the last scrape (None: unknown or stale, then 0), plus the requests sent there
    since, less the requests that got a first token (or ended) since. When the scrape showed no
    queue, the requests sent since and not started fill its room first: `capacity` (what it ran at
    its last scrape with a queue; None: never seen) less `running`, at least one (item 1)."""
    if waiting is None:
        return 0.0
    unstarted = sent_since - started_since
    if waiting > 0:
        return waiting + unstarted
    room = SCRAPE_ROOM if capacity is None else max(1.0, capacity - (running or 0.0))
    return unstarted - room


def kv_full(kv_use: float | None, max_kv_use: float | None) -> bool:
    """The engine's KV cache is as full as a class lets it be (item 8); unknown use is not full."""
    return max_kv_use is not None and kv_use is not None and kv_use >= max_kv_use


def saturated(backlog: float, prefill: int, seconds_per_token: float | None = None) -> bool:
    """A backend takes no more requests now: its engine queues some, or the prefill queued there
    (every routing process's) takes `PREFILL_SATURATED_S` at its learned rate (None: not learned
    yet, and then the queued prefill does not count)."""
    if backlog > 0:
        return True
    return seconds_per_token is not None and prefill * seconds_per_token >= PREFILL_SATURATED_S


@dataclass(frozen=True, slots=True)
class FlowClass:
    name: str
    #: lower goes first
    priority: int
    #: the longest a request of the class waits (a request may ask for less)
    max_queue_s: float
    #: waiting requests the class holds at most
    max_depth: int
    #: the time to first token the class aims for (None: none)
    ttft_target_s: float | None = None
    #: the KV-cache use at which a backend takes no more of the class (None: no limit)
    max_kv_use: float | None = None


@dataclass(slots=True, eq=False)
class Waiting:
    """One queued request. `ref` is the caller's handle for it (its future, its context); `since`
    when it was queued (the caller's clock)."""

    klass: str
    tenant: str
    cost: int
    weight: float
    deadline: float
    ref: Any = None
    since: float = 0.0
    start: float = 0.0
    finish: float = 0.0
    seq: int = 0
    queued: bool = False


def _order(w: Waiting) -> tuple[float, int]:
    return (w.start, w.seq)


@dataclass(slots=True)
class _ClassQueue:
    spec: FlowClass
    #: by start tag, then arrival
    items: list[Waiting] = field(default_factory=list)
    virtual: float = 0.0
    finish: dict[str, float] = field(default_factory=dict)
    tokens: int = 0
    #: per tenant with requests queued: its queued tokens, its requests, its weight
    held: dict[str, int] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    weight_sum: float = 0.0


def _weight_sum_with(q: _ClassQueue, item: Waiting) -> float:
    """The weights of the tenants queued in `q`, `item`'s tenant counted once whether queued or not:
    what shares of the class's queued tokens are taken of."""
    return q.weight_sum + (0.0 if item.tenant in q.weights else item.weight)


class FlowQueue:
    """Every class's waiting requests (one per gateway process)."""

    def __init__(self, classes: Iterable[FlowClass]) -> None:
        specs = sorted(classes, key=lambda c: c.priority)
        self._queues: dict[str, _ClassQueue] = {c.name: _ClassQueue(c) for c in specs}
        self._order = [self._queues[c.name] for c in specs]
        self._deadlines: list[tuple[float, int, Waiting]] = []
        self._seq = 0
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def depth(self, klass: str) -> int:
        return len(self._queues[klass].items)

    def queued_tokens(self, klass: str) -> int:
        return self._queues[klass].tokens

    def held(self, klass: str, tenant: str) -> tuple[int, int]:
        """The tokens `tenant` holds queued in `klass`, and the class's queued tokens in all."""
        q = self._queues[klass]
        return q.held.get(tenant, 0), q.tokens

    def items(self, klass: str) -> list[Waiting]:
        """The class's waiting requests, in the order they would go (a copy)."""
        return list(self._queues[klass].items)

    def top_priority(self) -> int | None:
        """The most urgent priority with a request waiting (None: nothing waits)."""
        for q in self._order:
            if q.items:
                return q.spec.priority
        return None

    def push(self, item: Waiting) -> Refusal | None:
        """Queue `item`; a refusal (and nothing queued) when its class is full."""
        q = self._queues[item.klass]
        if len(q.items) >= q.spec.max_depth:
            return "quota" if self._over_share(q, item) else "saturated"
        item.start = max(q.virtual, q.finish.get(item.tenant, 0.0))
        item.finish = item.start + item.cost / item.weight
        self._seq += 1
        item.seq = self._seq
        item.queued = True
        q.finish[item.tenant] = item.finish
        insort(q.items, item, key=_order)
        q.tokens += item.cost
        tenant = item.tenant
        n = q.count.get(tenant, 0)
        if n == 0:
            q.weights[tenant] = item.weight
            q.weight_sum += item.weight
        q.count[tenant] = n + 1
        q.held[tenant] = q.held.get(tenant, 0) + item.cost
        heapq.heappush(self._deadlines, (item.deadline, item.seq, item))
        self._len += 1
        return None

    def evict_for(self, item: Waiting) -> Waiting | None:
        """Room in `item`'s full class for it (item 5): the last-going request of the tenant holding
        the most tokens over its weighted share, taken out (None: no tenant is over its share)."""
        q = self._queues[item.klass]
        weight_sum = _weight_sum_with(q, item)
        worst, excess = "", 0.0
        for tenant, held in q.held.items():
            over = held - q.tokens * q.weights[tenant] / weight_sum
            if over > excess and tenant != item.tenant:
                worst, excess = tenant, over
        if not worst:
            return None
        for i in range(len(q.items) - 1, -1, -1):
            victim = q.items[i]
            if victim.tenant == worst:
                del q.items[i]
                if q.finish.get(worst) == victim.finish:
                    q.finish[worst] = victim.start  # it is not served: its tokens are not charged
                self._taken(q, victim)
                return victim
        return None

    def _over_share(self, q: _ClassQueue, item: Waiting) -> bool:
        """Does `item`'s tenant hold at least its weighted share of the class's queued tokens?"""
        if q.tokens <= 0:
            return False
        held = q.held.get(item.tenant, 0)
        return held >= q.tokens * item.weight / _weight_sum_with(q, item)

    def _taken(self, q: _ClassQueue, item: Waiting) -> None:
        """Bookkeeping of `item` leaving class queue `q` (its list entry is already gone)."""
        item.queued = False
        q.tokens -= item.cost
        tenant = item.tenant
        n = q.count[tenant] - 1
        if n:
            q.count[tenant] = n
            q.held[tenant] -= item.cost
        else:
            del q.count[tenant]
            del q.held[tenant]
            q.weight_sum -= q.weights.pop(tenant)
        self._len -= 1
        if not q.items:
            q.finish.clear()  # an empty class starts afresh: no credit carried over
            q.weight_sum = 0.0
        if not self._len:
            self._deadlines.clear()

    def pop(self, can_start: Callable[[Waiting], bool]) -> Waiting | None:
        """The next request a backend can take now, taken out of the queue (None: none can)."""
        for q in self._order:
            items = q.items
            for i in range(len(items)):
                w = items[i]
                if can_start(w):
                    del items[i]
                    q.virtual = max(q.virtual, w.start)
                    self._taken(q, w)
                    return w
        return None

    def remove(self, item: Waiting) -> bool:
        """Take `item` out (its client left); False when it was not queued."""
        if not item.queued:
            return False
        q = self._queues[item.klass]
        q.items.remove(item)
        self._taken(q, item)
        return True

    def expired(self, now: float) -> list[Waiting]:
        """Every request whose deadline has passed, taken out of the queue, earliest first."""
        out: list[Waiting] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            w = heapq.heappop(heap)[2]
            if w.queued:
                q = self._queues[w.klass]
                q.items.remove(w)
                self._taken(q, w)
                out.append(w)
        return out

    def next_deadline(self) -> float | None:
        heap = self._deadlines
        while heap and not heap[0][2].queued:
            heapq.heappop(heap)
        return heap[0][0] if heap else None


#: a backend's fit forgets old first tokens with this weight per new one (about the last fifty count):
#: an engine's speed changes with its batch, and the estimate follows within seconds
TTFT_DECAY = 0.98
#: first tokens a backend must have sent back before its fit is used
TTFT_MIN_SAMPLES = 3
#: the spread of tokens waited for (standard deviation) below which the fit has no slope: first tokens
#: of requests behind about the same prefill say what a request costs, not what a token costs
TTFT_MIN_SPREAD_TOKENS = 64.0


@dataclass(slots=True)
class _Fit:
    """Decayed sums of (tokens x, seconds y) for a least-squares line."""

    n: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0
    samples: int = 0


class TtftModel:
    """Time to first token per backend against the prefill it waited for (item 7 above)."""

    __slots__ = ("_fits",)

    def __init__(self) -> None:
        self._fits: dict[str, _Fit] = {}

    def observe(self, backend: str, seconds: float, tokens: int) -> None:
        """A first token from `backend`, `seconds` after the request was sent, which waited for
        `tokens` of prefill (the queue ahead of it and its own)."""
        if tokens <= 0 or seconds < 0:
            return
        fit = self._fits.get(backend)
        if fit is None:
            fit = self._fits[backend] = _Fit()
        d = TTFT_DECAY
        fit.n = fit.n * d + 1.0
        fit.x = fit.x * d + tokens
        fit.y = fit.y * d + seconds
        fit.xx = fit.xx * d + float(tokens) * tokens
        fit.xy = fit.xy * d + seconds * tokens
        fit.samples += 1

    def line(self, backend: str) -> tuple[float, float] | None:
        """(base seconds, seconds per token) of the fitted line; None until `TTFT_MIN_SAMPLES` first
        tokens with a spread of at least `TTFT_MIN_SPREAD_TOKENS` came back, or when the fit is not
        rising (more prefill ahead never makes a first token sooner)."""
        fit = self._fits.get(backend)
        if fit is None or fit.samples < TTFT_MIN_SAMPLES:
            return None
        mean_x = fit.x / fit.n
        variance = fit.xx / fit.n - mean_x * mean_x
        if variance < TTFT_MIN_SPREAD_TOKENS * TTFT_MIN_SPREAD_TOKENS:
            return None
        slope = (fit.xy / fit.n - mean_x * fit.y / fit.n) / variance
        if slope <= 0:
            return None
        return max(0.0, fit.y / fit.n - slope * mean_x), slope

    def seconds_per_token(self, backend: str) -> float | None:
        """The fitted seconds per prefill token (`line`'s slope), None while there is none."""
        found = self.line(backend)
        return found[1] if found is not None else None

    def forget(self, backend: str) -> None:
        self._fits.pop(backend, None)
