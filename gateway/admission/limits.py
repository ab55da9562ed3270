"""The limiter interface, and the limiter that survives a Redis outage.

    Limiter (Protocol)      acquire(id, scopes, cost) -> Verdict;  finish(ticket, kept_tokens)
    ├── RedisLimiter        gateway/admission/limits_redis.py: exact across replicas (one Lua call per request)
    ├── LocalLimiter        gateway/admission/limits_local.py: the same algorithm for this process only
    └── FailoverLimiter     here: Redis while it answers; on a connection error either the local
                            limiter (`fail_open`) or `LimiterUnavailable` → 503 (`fail_closed`);
                            a probe every `probe_s` brings Redis back without a restart.

A `Ticket` is what an admitted request holds: its id, its scopes and its token reservation, and
its `Spend` (the budgets it was checked against and the ledgers its spend is recorded in, with what
it reserved); it is handed back to `finish` exactly once, when the response has ended (or was
abandoned), with what the request finally counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from gateway.core.shared_load import ShareAsk
from policies.admission import ScopeLimits, Verdict
from policies.budgets import Budget, Charge

log = logging.getLogger("gateway.limits")


class LimiterUnavailable(Exception):
    """The shared limiter cannot decide (Redis unreachable) and the policy is `fail_closed`."""


class StoreDown(Exception):
    """Raised by a limiter backend when its store cannot be reached (connection refused, timeout)."""


@dataclass(frozen=True, slots=True)
class Ledger:
    """One scope's spend in one calendar period: a hash (tokens, money, requests, per model) in the
    store, dropped at `expire_at_ms` (after the period ended and its retention passed)."""

    key: str
    expire_at_ms: int


@dataclass(frozen=True, slots=True)
class Meter:
    """One budget, checked for one request. A calendar budget reads its ledger (`ledger`: the index
    in `Spend.ledgers`; `ends_at_ms`: when its period ends); a rolling one keeps its own sliding log
    at `key` (`key + ":sum"` the running sum). `scope` is `user`, `tenant` or `key` (metrics);
    `label` names the scope in messages."""

    budget: Budget
    label: str
    scope: str
    key: str = ""
    ledger: int = -1
    ends_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class Spend:
    """What one request's spend touches: its ledgers, its budgets (calendar meters first, then
    rolling ones: `n_calendar` of them), its model and what it reserved at admission."""

    ledgers: tuple[Ledger, ...]
    meters: tuple[Meter, ...]
    n_calendar: int
    model: str
    reserved: Charge

    @property
    def rolling(self) -> tuple[Meter, ...]:
        return self.meters[self.n_calendar :]


@dataclass(slots=True)
class Ticket:
    id: str
    scopes: tuple[ScopeLimits, ...]
    reserved: int
    #: which limiter admitted it ("redis" or "local"); the same one must finish it
    holder: str = "redis"
    spend: Spend | None = None


class Limiter(Protocol):
    name: str

    async def acquire(
        self,
        id: str,
        scopes: Sequence[ScopeLimits],
        cost: int,
        spend: Spend | None = None,
        share: ShareAsk | None = None,
    ) -> Verdict:
        """Admit (and count) one request of `cost` tokens in every scope and, with `spend`, of
        `spend.reserved` in every budget and ledger — or reject it without counting anything (limits
        are checked before budgets). A shared limiter also carries `share` (the routing state,
        gateway/core/shared_load.py) and sets its reply. Raises `StoreDown` when the backing store
        is unreachable."""
        ...

    async def finish(
        self, ticket: Ticket, kept_tokens: int, kept: Charge | None = None, share: bool = False
    ) -> None:
        """Replace the ticket's reservation by `kept_tokens` (and its spend's by `kept`, recorded per
        model in its ledgers) and free its concurrency slots; with `share`, a shared limiter also
        carries this process's routing counts."""
        ...

    async def read_spend(self, ledgers: Sequence[str], logs: Sequence[tuple[str, int]]) -> SpendFigures:
        """The fields of each ledger hash (missing: empty), and the sum of each rolling log over its
        window in ms (`(key, window_ms)`), as they are now."""
        ...


#: what `read_spend` answers: each ledger's fields, each rolling log's sum
SpendFigures = tuple[list[dict[str, int]], list[int]]


#: called on outage transitions and fallback decisions: event in {"down", "up", "fallback"}
OutageHook = Callable[[str], None]


#: Redis is probed this often while it is down: limits are shared again within a quarter second of
#: its return, at four cheap pings a second meanwhile
PROBE_S = 0.25


class FailoverLimiter:
    """Redis first; on `StoreDown`, the configured policy until a background probe sees Redis again.

    Without a bound primary (no Redis configured) every decision is the local limiter's.
    """

    name = "failover"

    def __init__(
        self,
        local: Limiter,
        mode: Literal["fail_open", "fail_closed"],
        probe_s: float = PROBE_S,
        on_event: OutageHook | None = None,
    ) -> None:
        self._primary: Limiter | None = None
        self._probe: Callable[[], Awaitable[object]] | None = None
        self._local = local
        self._mode = mode
        self._probe_s = probe_s
        self._on_event = on_event
        self._down = False
        self._prober: asyncio.Task[None] | None = None

    def bind(self, primary: Limiter, probe: Callable[[], Awaitable[object]]) -> None:
        """Use `primary` (the shared limiter) from now on; `probe` raises while its store is down."""
        self._primary = primary
        self._probe = probe

    @property
    def shared(self) -> bool:
        return self._primary is not None

    @property
    def down(self) -> bool:
        return self._down

    async def acquire(
        self,
        id: str,
        scopes: Sequence[ScopeLimits],
        cost: int,
        spend: Spend | None = None,
        share: ShareAsk | None = None,
    ) -> tuple[Verdict, str]:
        """The verdict and the name of the limiter that gave it (`share` rides with Redis only: its
        reply stays None when this process decided alone)."""
        primary = self._primary
        if primary is None:
            return await self._local.acquire(id, scopes, cost, spend), self._local.name
        if not self._down:
            try:
                return await primary.acquire(id, scopes, cost, spend, share), primary.name
            except StoreDown:
                self._mark_down()
        if self._mode == "fail_closed":
            raise LimiterUnavailable
        self._emit("fallback")
        return await self._local.acquire(id, scopes, cost, spend), self._local.name

    async def finish(
        self, ticket: Ticket, kept_tokens: int, kept: Charge | None = None, share: bool = False
    ) -> None:
        if ticket.holder == self._local.name or self._primary is None:
            await self._local.finish(ticket, kept_tokens, kept)
            return
        try:
            await self._primary.finish(ticket, kept_tokens, kept, share)
        except StoreDown:
            # The slot's lease expires on its own; the reservation stays counted (conservative).
            self._mark_down()

    async def read_spend(self, ledgers: Sequence[str], logs: Sequence[tuple[str, int]]) -> SpendFigures:
        """From the shared store when one is bound (StoreDown while it is unreachable), else this
        process's own figures."""
        if self._primary is None:
            return await self._local.read_spend(ledgers, logs)
        return await self._primary.read_spend(ledgers, logs)

    def _mark_down(self) -> None:
        if self._down:
            return
        self._down = True
        log.warning(
            "redis unreachable: limits now %s until it answers again",
            "enforced by this process only (fail_open)"
            if self._mode == "fail_open"
            else "refused with 503 (fail_closed)",
        )
        self._emit("down")
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe_until_up())

    async def _probe_until_up(self) -> None:
        while self._down:
            await asyncio.sleep(self._probe_s)
            try:
                assert self._probe is not None
                await self._probe()
            except Exception:
                continue
            self._down = False
            log.warning("redis reachable again: limits are shared across replicas again")
            self._emit("up")

    def _emit(self, event: str) -> None:
        if self._on_event is not None:
            self._on_event(event)

    async def aclose(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
