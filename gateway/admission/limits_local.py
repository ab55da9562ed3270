"""The in-process limiter: the sliding-window log of gateway/admission/limits_redis.py, for one process.

Used when no Redis is configured (the embedded default: limits hold per process, and start-up says
so) and, under `fail_open`, while Redis is unreachable. Decisions match the Lua script's exactly
(tests/gateway/test_limits_local.py runs the same cases against both). Not thread-safe: one event
loop owns it. Concurrency slots need no lease here — they die with the process.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

from gateway.admission.limits import Ticket
from policies.admission import Outcome, ScopeLimits, Verdict

Clock = Callable[[], float]


class _Entry:
    __slots__ = ("at", "id", "tokens")

    def __init__(self, id: str, at: int, tokens: int) -> None:
        self.id = id
        self.at = at
        self.tokens = tokens


class _Scope:
    __slots__ = ("by_id", "requests", "slots", "token_sum", "tokens")

    def __init__(self) -> None:
        self.requests: deque[int] = deque()
        self.tokens: deque[_Entry] = deque()
        self.by_id: dict[str, _Entry] = {}
        self.token_sum = 0
        self.slots: set[str] = set()

    def evict(self, cutoff: int) -> None:
        req = self.requests
        while req and req[0] <= cutoff:
            req.popleft()
        tok = self.tokens
        while tok and tok[0].at <= cutoff:
            e = tok.popleft()
            self.token_sum -= e.tokens
            self.by_id.pop(e.id, None)
        if not tok:
            self.token_sum = 0

    @property
    def idle(self) -> bool:
        return not (self.requests or self.tokens or self.slots)


class LocalLimiter:
    name = "local"

    #: acquisitions between sweeps of idle scopes (bounds memory to the recently active users)
    SWEEP_EVERY = 4096

    def __init__(self, *, window_s: float, clock: Clock = time.monotonic) -> None:
        self._window = int(window_s * 1000)
        self._clock = clock
        self._scopes: dict[str, _Scope] = {}
        self._since_sweep = 0

    def _now(self) -> int:
        return int(self._clock() * 1000)

    async def acquire(self, id: str, scopes: Sequence[ScopeLimits], cost: int) -> Verdict:
        return self.acquire_now(id, scopes, cost)

    def acquire_now(self, id: str, scopes: Sequence[ScopeLimits], cost: int) -> Verdict:
        now = self._now()
        window = self._window
        cutoff = now - window
        states: list[_Scope] = []
        fail, fail_scope, retry, used, requested = Outcome.ADMITTED, 0, 0, 0, 0
        for i, lim in enumerate(scopes, 1):
            st = self._scopes.get(lim.key)
            if st is None:
                st = self._scopes[lim.key] = _Scope()
            st.evict(cutoff)
            states.append(st)
            if fail is not Outcome.ADMITTED:
                continue
            n_req = len(st.requests)
            if lim.requests and n_req + 1 > lim.requests:
                at = st.requests[n_req - lim.requests]
                fail, fail_scope, retry, used, requested = Outcome.REQUESTS, i, at + window - now, n_req, 1
                continue
            if lim.tokens:
                if cost > lim.tokens:
                    fail, fail_scope, retry, used, requested = (
                        Outcome.TOO_LARGE,
                        i,
                        window,
                        st.token_sum,
                        cost,
                    )
                    continue
                if st.token_sum + cost > lim.tokens:
                    need, freed = st.token_sum + cost - lim.tokens, 0
                    for e in st.tokens:
                        freed += e.tokens
                        if freed >= need:
                            retry = e.at + window - now
                            break
                    fail, fail_scope, used, requested = Outcome.TOKENS, i, st.token_sum, cost
                    continue
            if lim.concurrent and len(st.slots) + 1 > lim.concurrent:
                fail, fail_scope, retry, used, requested = Outcome.CONCURRENCY, i, 1000, lim.concurrent, 1
        add = 1 if fail is Outcome.ADMITTED else 0
        lr = rr = sr = lt = rt = st_ms = 0
        for lim, st in zip(scopes, states, strict=True):
            if add:
                if lim.requests:
                    st.requests.append(now)
                if lim.tokens:
                    e = _Entry(id, now, cost)
                    st.tokens.append(e)
                    st.by_id[id] = e
                    st.token_sum += cost
                if lim.concurrent:
                    st.slots.add(id)
            if lim.requests:
                rem = lim.requests - len(st.requests)
                if lr == 0 or rem < rr:
                    lr, rr, sr = lim.requests, rem, (st.requests[0] if st.requests else now) + window - now
            if lim.tokens:
                rem = lim.tokens - st.token_sum
                if lt == 0 or rem < rt:
                    lt, rt, st_ms = lim.tokens, rem, (st.tokens[0].at if st.tokens else now) + window - now
        self._since_sweep += 1
        if self._since_sweep >= self.SWEEP_EVERY:
            self.sweep()
        return Verdict(fail, fail_scope, retry, lr, rr, sr, lt, rt, st_ms, used, requested)

    async def finish(self, ticket: Ticket, kept_tokens: int) -> None:
        for lim in ticket.scopes:
            st = self._scopes.get(lim.key)
            if st is None:
                continue
            st.slots.discard(ticket.id)
            e = st.by_id.pop(ticket.id, None)
            if e is not None:
                st.token_sum += kept_tokens - e.tokens
                e.tokens = kept_tokens

    def sweep(self) -> None:
        """Forget scopes with nothing in their window and no slot held."""
        self._since_sweep = 0
        cutoff = self._now() - self._window
        idle = []
        for key, st in self._scopes.items():
            st.evict(cutoff)
            if st.idle:
                idle.append(key)
        for key in idle:
            del self._scopes[key]

    def __len__(self) -> int:
        return len(self._scopes)
