"""The limiter interface, and the limiter that survives a Redis outage.

    Limiter (Protocol)      acquire(id, scopes, cost) -> Verdict;  finish(ticket, kept_tokens)
    ├── RedisLimiter        gateway/admission/limits_redis.py: exact across replicas (one Lua call per request)
    ├── LocalLimiter        gateway/admission/limits_local.py: the same algorithm for this process only
    └── FailoverLimiter     here: Redis while it answers; on a connection error either the local
                            limiter (`fail_open`) or `LimiterUnavailable` → 503 (`fail_closed`);
                            a probe every `probe_s` brings Redis back without a restart.

A `Ticket` is what an admitted request holds: its id, its scopes and its token reservation; it is
handed back to `finish` exactly once, when the response has ended (or was abandoned).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from policies.admission import ScopeLimits, Verdict

log = logging.getLogger("gateway.limits")


class LimiterUnavailable(Exception):
    """The shared limiter cannot decide (Redis unreachable) and the policy is `fail_closed`."""


class StoreDown(Exception):
    """Raised by a limiter backend when its store cannot be reached (connection refused, timeout)."""


@dataclass(slots=True)
class Ticket:
    id: str
    scopes: tuple[ScopeLimits, ...]
    reserved: int
    #: which limiter admitted it ("redis" or "local"); the same one must finish it
    holder: str = "redis"


class Limiter(Protocol):
    name: str

    async def acquire(self, id: str, scopes: Sequence[ScopeLimits], cost: int) -> Verdict:
        """Admit (and count) one request of `cost` tokens in every scope, or reject it without
        counting anything. Raises `StoreDown` when the backing store is unreachable."""
        ...

    async def finish(self, ticket: Ticket, kept_tokens: int) -> None:
        """Replace the ticket's reservation by `kept_tokens` and free its concurrency slots."""
        ...


#: called on outage transitions and fallback decisions: event in {"down", "up", "fallback"}
OutageHook = Callable[[str], None]


class FailoverLimiter:
    """Redis first; on `StoreDown`, the configured policy until a background probe sees Redis again.

    Without a bound primary (no Redis configured) every decision is the local limiter's.
    """

    name = "failover"

    def __init__(
        self,
        local: Limiter,
        mode: Literal["fail_open", "fail_closed"],
        probe_s: float,
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

    async def acquire(self, id: str, scopes: Sequence[ScopeLimits], cost: int) -> tuple[Verdict, str]:
        """The verdict and the name of the limiter that gave it."""
        primary = self._primary
        if primary is None:
            return await self._local.acquire(id, scopes, cost), self._local.name
        if not self._down:
            try:
                return await primary.acquire(id, scopes, cost), primary.name
            except StoreDown:
                self._mark_down()
        if self._mode == "fail_closed":
            raise LimiterUnavailable
        self._emit("fallback")
        return await self._local.acquire(id, scopes, cost), self._local.name

    async def finish(self, ticket: Ticket, kept_tokens: int) -> None:
        if ticket.holder == self._local.name or self._primary is None:
            await self._local.finish(ticket, kept_tokens)
            return
        try:
            await self._primary.finish(ticket, kept_tokens)
        except StoreDown:
            # The slot's lease expires on its own; the reservation stays counted (conservative).
            self._mark_down()

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
