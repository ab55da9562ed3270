"""The in-process limiter: the sliding-window log of gateway/admission/limits_redis.py, for one process.

Used when no Redis is configured (the embedded default: limits hold per process, and start-up says
so) and, under `fail_open`, while Redis is unreachable. Decisions match the Lua script's exactly
(tests/gateway/admission/test_limits_redis.py runs the same cases against both), budgets and spend
ledgers included. Not thread-safe: one event loop owns it. Concurrency slots need no lease here —
they die with the process; spend ledgers live as long as the process (or their retention).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

from gateway.admission.limits import Ledger, Spend, SpendFigures, Ticket
from gateway.core.shared_load import ShareAsk
from policies.admission import Outcome, ScopeLimits, Verdict
from policies.budgets import Charge

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


class _Log:
    """A rolling budget's sliding log of amounts."""

    __slots__ = ("by_id", "entries", "span", "total")

    def __init__(self, span: int) -> None:
        self.span = span
        self.entries: deque[_Entry] = deque()
        self.by_id: dict[str, _Entry] = {}
        self.total = 0

    def evict(self, cutoff: int) -> None:
        entries = self.entries
        while entries and entries[0].at <= cutoff:
            e = entries.popleft()
            self.total -= e.tokens
            self.by_id.pop(e.id, None)
        if not entries:
            self.total = 0

    def wait(self, need: int, span: int, now: int) -> int:
        """Until enough of the oldest amounts leave the window for `need` more (0: never known)."""
        freed = 0
        for e in self.entries:
            freed += e.tokens
            if freed >= need:
                return e.at + span - now
        return 0


class _Ledger:
    __slots__ = ("expire_at", "fields")

    def __init__(self, expire_at: int) -> None:
        self.fields: dict[str, int] = {}
        self.expire_at = expire_at


_FIELD = {"tokens": "tok", "usd": "usd"}


class LocalLimiter:
    name = "local"

    #: acquisitions between sweeps of idle scopes (bounds memory to the recently active users)
    SWEEP_EVERY = 4096

    def __init__(self, *, window_s: float, clock: Clock = time.monotonic, wall: Clock = time.time) -> None:
        self._window = int(window_s * 1000)
        self._clock = clock
        #: the calendar clock ledgers expire by (Unix time, like the ledgers' expiries)
        self._wall = wall
        self._scopes: dict[str, _Scope] = {}
        self._logs: dict[str, _Log] = {}
        self._ledgers: dict[str, _Ledger] = {}
        self._model_names: dict[str, tuple[str, str, str]] = {}
        self._since_sweep = 0

    def _now(self) -> int:
        return int(self._clock() * 1000)

    def _states(self, ledgers: Sequence[Ledger]) -> list[dict[str, int]]:
        """The fields of each ledger (a fresh one where it expired, as Redis would have dropped it)."""
        wall_ms = self._wall() * 1000
        found = self._ledgers
        out = []
        for ledger in ledgers:
            state = found.get(ledger.key)
            if state is None or state.expire_at <= wall_ms:
                state = found[ledger.key] = _Ledger(ledger.expire_at_ms)
            state.expire_at = ledger.expire_at_ms
            out.append(state.fields)
        return out

    def _model_fields(self, model: str) -> tuple[str, str, str]:
        names = self._model_names.get(model)
        if names is None:
            if len(self._model_names) >= 4096:
                self._model_names.clear()
            names = self._model_names[model] = (f"m:{model}:tok", f"m:{model}:usd", f"m:{model}:req")
        return names

    async def acquire(
        self,
        id: str,
        scopes: Sequence[ScopeLimits],
        cost: int,
        spend: Spend | None = None,
        share: ShareAsk | None = None,
    ) -> Verdict:
        """`share` is not carried: this limiter is this process's alone (no reply is set)."""
        return self.acquire_now(id, scopes, cost, spend)

    def acquire_now(
        self, id: str, scopes: Sequence[ScopeLimits], cost: int, spend: Spend | None = None
    ) -> Verdict:
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
        logs: list[_Log] = []
        ledgers: list[dict[str, int]] = []
        if spend is not None and fail is Outcome.ADMITTED:
            ledgers = self._states(spend.ledgers)
            found = self._check_budgets(spend, ledgers, now, logs)
            if found is not None:
                fail, fail_scope, retry, used, requested = found
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
        if add and spend is not None:
            reserved = spend.reserved
            for fields in ledgers:
                if reserved.tokens:
                    fields["tok"] = fields.get("tok", 0) + reserved.tokens
                if reserved.nanos:
                    fields["usd"] = fields.get("usd", 0) + reserved.nanos
            for m, log in zip(spend.rolling, logs, strict=True):
                e = _Entry(id, now, reserved.amount(m.budget.unit))
                log.entries.append(e)
                log.by_id[id] = e
                log.total += e.tokens
        self._since_sweep += 1
        if self._since_sweep >= self.SWEEP_EVERY:
            self.sweep()
        return Verdict(fail, fail_scope, retry, lr, rr, sr, lt, rt, st_ms, used, requested)

    def _check_budgets(
        self, spend: Spend, states: list[dict[str, int]], now: int, logs: list[_Log]
    ) -> tuple[Outcome, int, int, int, int] | None:
        """The first budget the request does not fit in, as the Lua script reports it (`logs` gets
        each rolling budget's log, evicted, when all fit)."""
        reserved = spend.reserved
        for j, m in enumerate(spend.meters[: spend.n_calendar], 1):
            have = states[m.ledger].get(_FIELD[m.budget.unit], 0)
            amount = reserved.amount(m.budget.unit)
            if amount > m.budget.limit:
                return Outcome.QUOTA_TOO_LARGE, j, 0, have, amount
            if have + amount > m.budget.limit:
                return Outcome.QUOTA, j, 0, have, amount
        for j, m in enumerate(spend.rolling, spend.n_calendar + 1):
            span = m.budget.window_s * 1000
            log = self._logs.get(m.key)
            if log is None:
                log = self._logs[m.key] = _Log(span)
            log.evict(now - span)
            logs.append(log)
            amount = reserved.amount(m.budget.unit)
            if amount > m.budget.limit:
                return Outcome.QUOTA_TOO_LARGE, j, 0, log.total, amount
            if log.total + amount > m.budget.limit:
                return (
                    Outcome.QUOTA,
                    j,
                    log.wait(log.total + amount - m.budget.limit, span, now),
                    log.total,
                    amount,
                )
        return None

    async def finish(
        self, ticket: Ticket, kept_tokens: int, kept: Charge | None = None, share: bool = False
    ) -> None:
        for lim in ticket.scopes:
            st = self._scopes.get(lim.key)
            if st is None:
                continue
            st.slots.discard(ticket.id)
            e = st.by_id.pop(ticket.id, None)
            if e is not None:
                st.token_sum += kept_tokens - e.tokens
                e.tokens = kept_tokens
        spend = ticket.spend
        if spend is None:
            return
        final = kept or spend.reserved
        d_tokens = final.tokens - spend.reserved.tokens
        d_nanos = final.nanos - spend.reserved.nanos
        m_tok, m_usd, m_req = self._model_fields(spend.model)
        for fields in self._states(spend.ledgers):
            get = fields.get
            if d_tokens:
                fields["tok"] = get("tok", 0) + d_tokens
            if d_nanos:
                fields["usd"] = get("usd", 0) + d_nanos
            fields["req"] = get("req", 0) + 1
            fields[m_tok] = get(m_tok, 0) + final.tokens
            if final.nanos:
                fields[m_usd] = get(m_usd, 0) + final.nanos
            fields[m_req] = get(m_req, 0) + 1
        for m in spend.rolling:
            log = self._logs.get(m.key)
            entry = log.by_id.get(ticket.id) if log is not None else None
            if log is not None and entry is not None:
                amount = final.amount(m.budget.unit)
                log.total += amount - entry.tokens
                entry.tokens = amount

    async def read_spend(self, ledgers: Sequence[str], logs: Sequence[tuple[str, int]]) -> SpendFigures:
        wall_ms = self._wall() * 1000
        fields = []
        for key in ledgers:
            state = self._ledgers.get(key)
            fields.append(dict(state.fields) if state is not None and state.expire_at > wall_ms else {})
        now = self._now()
        sums = []
        for key, span in logs:
            log = self._logs.get(key)
            sums.append(sum(e.tokens for e in log.entries if e.at > now - span) if log is not None else 0)
        return fields, sums

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
        now = self._now()
        empty = []
        for key, log in self._logs.items():
            log.evict(now - log.span)
            if not log.entries:
                empty.append(key)
        for key in empty:
            del self._logs[key]
        wall_ms = self._wall() * 1000
        for key in [k for k, ledger in self._ledgers.items() if ledger.expire_at <= wall_ms]:
            del self._ledgers[key]

    def __len__(self) -> int:
        return len(self._scopes)
