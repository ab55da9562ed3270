"""Budget arithmetic: prices, what a request costs, calendar periods, and OpenAI's `insufficient_quota`.

Pure functions and values (no clocks, no I/O: `now` is always passed in). The limiters
(gateway/admission/limits_redis.py in Lua, gateway/admission/limits_local.py in Python) count spend
with these figures; the admit stage reserves at admission and reconciles when the response has ended.

Units, all integers so Lua (doubles, exact below 2**53) and Python agree to the last unit:

    money    nano-dollars (1e-9 USD) per request and per budget: budgets up to $9,000,000
    prices   pico-dollars (1e-12 USD) per token: a price in USD per million tokens × 10**6, exact
             for prices with up to six decimals ($0.000001 per million tokens)
    tokens   prompt + completion tokens (the engine's `usage.total_tokens`)

A request's money is rounded up to the next nano-dollar, once: never under-charged, and never more
than a billionth of a dollar over.

Periods: `day` and `month` are calendar periods in UTC (they roll at 00:00 UTC and on the 1st),
`rolling` is a sliding window of `window_s` seconds, like the per-minute limits.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Literal

Period = Literal["day", "month", "rolling"]
Unit = Literal["tokens", "usd"]

NANOS_PER_USD = 10**9
#: the largest budget: spend must stay exact in a Lua double (2**53 nano-dollars ≈ $9.007M)
MAX_USD = 9_000_000
MAX_TOKENS = 2**53 - 1
DAY_S = 86_400


def _exact(value: float | int | str | Decimal, scale: int, what: str) -> int:
    """`value × 10**scale` as an exact integer (ValueError when it has more decimals than that)."""
    try:
        d = Decimal(str(value)) * (Decimal(10) ** scale)
    except InvalidOperation:
        raise ValueError(f"{what}: {value!r} is not a number") from None
    if d != d.to_integral_value():
        raise ValueError(f"{what}: {value!r} has more than {scale} decimals")
    return int(d)


def usd_to_nanos(usd: float | int | str | Decimal) -> int:
    """An amount of dollars as nano-dollars (exact; ValueError beyond nine decimals)."""
    return _exact(usd, 9, "an amount in USD")


def format_usd(nanos: int) -> str:
    """`$10.00`, `$0.0412`, `$0.000000123`: cents when the amount is whole cents, else every digit."""
    sign = "-" if nanos < 0 else ""
    nanos = abs(nanos)
    dollars, rest = divmod(nanos, NANOS_PER_USD)
    if rest % 10_000_000 == 0:
        return f"{sign}${dollars}.{rest // 10_000_000:02d}"
    return f"{sign}${dollars}.{rest:09d}".rstrip("0")


@dataclass(frozen=True, slots=True)
class Price:
    """A model's prices in pico-dollars per token."""

    prompt: int
    cached_prompt: int
    completion: int

    @classmethod
    def per_million(cls, prompt: float, completion: float, cached_prompt: float | None = None) -> Price:
        """From USD per million tokens (how providers quote them); cached prompt tokens cost the
        prompt price unless a cached price is given."""
        p = _exact(prompt, 6, "a price in USD per million tokens")
        c = p if cached_prompt is None else _exact(cached_prompt, 6, "a price in USD per million tokens")
        return cls(p, c, _exact(completion, 6, "a price in USD per million tokens"))

    @property
    def free(self) -> bool:
        return not (self.prompt or self.cached_prompt or self.completion)

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> int:
        """Nano-dollars for one request's tokens (rounded up once)."""
        cached = min(max(0, cached_tokens), prompt_tokens)
        picos = (
            (prompt_tokens - cached) * self.prompt
            + cached * self.cached_prompt
            + completion_tokens * self.completion
        )
        return -(-picos // 1000)


FREE = Price(0, 0, 0)


@dataclass(frozen=True, slots=True)
class Charge:
    """What a request counts against budgets: tokens and nano-dollars."""

    tokens: int
    nanos: int

    def amount(self, unit: Unit) -> int:
        return self.tokens if unit == "tokens" else self.nanos


NOTHING = Charge(0, 0)


def reserve(price: Price, prompt_estimate: int, completion_budget: int) -> Charge:
    """What a request reserves at admission: its prompt estimate and its whole completion budget,
    prompt tokens priced as uncached (the most the request can cost, bar an estimate that was low)."""
    tokens = max(1, prompt_estimate + completion_budget)
    return Charge(tokens, price.cost(prompt_estimate, completion_budget))


def settle(
    reserved: Charge, price: Price, usage: tuple[int, int, int] | None, reached_engine: bool
) -> Charge:
    """What a request finally counts, once its response has ended: the real cost of `usage`
    (prompt, completion, cached tokens) when the engine reported it; nothing when no engine saw the
    request; the reservation when one did but its usage never arrived (a stream cut or abandoned
    before its usage chunk: conservative, as for tokens per minute)."""
    if usage is not None:
        prompt, completion, cached = usage
        return Charge(max(0, prompt + completion), price.cost(prompt, completion, cached))
    return reserved if reached_engine else NOTHING


@dataclass(frozen=True, slots=True)
class Budget:
    """A spending limit of one scope: `limit` tokens or nano-dollars per period."""

    period: Period
    unit: Unit
    limit: int
    window_s: int = 0  # rolling only

    def __post_init__(self) -> None:
        if self.limit <= 0:
            raise ValueError("a budget's limit must be positive")
        if (self.period == "rolling") != (self.window_s > 0):
            raise ValueError("a rolling budget needs window_s > 0, and only a rolling budget has one")

    @property
    def calendar(self) -> bool:
        return self.period != "rolling"

    @property
    def label(self) -> str:
        """`UTC day`, `UTC month`, `rolling 1h` (for messages)."""
        if self.period == "rolling":
            return "rolling " + _span(self.window_s * 1000)
        return f"UTC {self.period}"

    def show(self, amount: int) -> str:
        return format_usd(amount) if self.unit == "usd" else f"{amount} tokens"

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"period": self.period}
        if self.period == "rolling":
            out["window_s"] = self.window_s
        out[self.unit] = self.limit / NANOS_PER_USD if self.unit == "usd" else self.limit
        return out


@dataclass(frozen=True, slots=True)
class Span:
    """One calendar period: `id` (`2026-12-01`, `2026-12`), its start and end in Unix seconds (UTC)."""

    period: Period
    id: str
    start_s: int
    end_s: int


def calendar_span(period: Period, now_s: float) -> Span:
    """The UTC day or month that contains `now_s`."""
    if period == "rolling":
        raise ValueError("a rolling window is not a calendar period")
    day = int(now_s // DAY_S)
    if period == "day":
        y, m, d = _civil(day)
        return Span("day", f"{y:04d}-{m:02d}-{d:02d}", day * DAY_S, (day + 1) * DAY_S)
    y, m, _ = _civil(day)
    start = calendar.timegm((y, m, 1, 0, 0, 0))
    ny, nm = (y + 1, 1) if m == 12 else (y, m + 1)
    return Span("month", f"{y:04d}-{m:02d}", start, calendar.timegm((ny, nm, 1, 0, 0, 0)))


def span_of(period: Period, id: str) -> Span:
    """The calendar period named `id` (`2026-12-01` for a day, `2026-12` for a month); ValueError if
    the id is not one."""
    try:
        if period == "day":
            y, m, d = (int(p) for p in id.split("-"))
            if len(id) != 10:
                raise ValueError
            start = calendar.timegm((y, m, d, 0, 0, 0))
        elif period == "month":
            y, m = (int(p) for p in id.split("-"))
            if len(id) != 7:
                raise ValueError
            start = calendar.timegm((y, m, 1, 0, 0, 0))
        else:
            raise ValueError
        span = calendar_span(period, start)
    except ValueError:
        raise ValueError(f"{id!r} is not a {period} (YYYY-MM-DD for a day, YYYY-MM for a month)") from None
    if span.id != id:
        raise ValueError(f"{id!r} is not a {period} (YYYY-MM-DD for a day, YYYY-MM for a month)")
    return span


#: how long a period's spend is kept after the period ended (for `GET /admin/spend` of past periods)
RETENTION_S = {"day": 7 * DAY_S, "month": 62 * DAY_S}


def expires_at_s(span: Span) -> int:
    """When a period's spend may be dropped: never before the period ends, then after its retention."""
    return span.end_s + RETENTION_S[span.period]


def _civil(days: int) -> tuple[int, int, int]:
    """(year, month, day) of a day number since 1970-01-01 (Howard Hinnant's civil_from_days)."""
    z = days + 719468
    era = (z if z >= 0 else z - 146096) // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (1 if m <= 2 else 0), m, d


def _span(ms: int) -> str:
    """A duration in the largest whole unit that fits: `1h`, `30m`, `90s`, `2d`."""
    s = ms // 1000
    for unit, size in (("d", DAY_S), ("h", 3600), ("m", 60)):
        if s >= size and s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"


def quota_message(
    budget: Budget, scope_label: str, used: int, requested: int, retry_ms: int | None, resets: str | None
) -> str:
    """OpenAI's `insufficient_quota` opening, with what was exceeded: "You exceeded your current quota
    (tenant acme budget, UTC month: $10.00 of $10.00 used; this request needs up to $0.0412). …"."""
    head = f"You exceeded your current quota ({scope_label} budget, {budget.label}: "
    if requested > budget.limit:
        return (
            head + f"this request alone needs up to {budget.show(requested)}, more than the whole budget of "
            f"{budget.show(budget.limit)}). Reduce max_tokens or the prompt, or ask for a larger budget."
        )
    text = (
        head + f"{budget.show(max(0, used))} of {budget.show(budget.limit)} used; "
        f"this request needs up to {budget.show(requested)})."
    )
    if resets is not None:
        return text + f" The budget resets at {resets}."
    if retry_ms is not None:
        return text + f" Enough of it frees up in {_human(retry_ms)}."
    return text


def quota_headers(requested_over_limit: bool, retry_ms: int | None) -> dict[str, str]:
    """`retry-after` only when it is true: the time until this request would pass if nothing else
    arrived (the end of the calendar period, or when enough of a rolling window's spend has left it).
    A request larger than the whole budget never passes: no `retry-after`, `x-should-retry: false`.
    A wait beyond a minute also says `x-should-retry: false`: the OpenAI SDK honours `retry-after` only
    up to 60 s and would otherwise retry at once, in vain."""
    if requested_over_limit or retry_ms is None:
        return {"x-should-retry": "false"}
    out = {"retry-after": str(max(1, -(-retry_ms // 1000))), "retry-after-ms": str(max(1, retry_ms))}
    if retry_ms > 60_000:
        out["x-should-retry"] = "false"
    return out


def _human(ms: int) -> str:
    s = max(1, -(-ms // 1000))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{-(-s // 60)} minutes"
    return f"{-(-s // 3600)} hours"
