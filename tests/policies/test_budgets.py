"""Budget arithmetic: exact prices, costs rounded once, UTC calendar periods, honest messages."""

from __future__ import annotations

import calendar
import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.budgets import (
    Budget,
    Charge,
    Price,
    calendar_span,
    expires_at_s,
    format_usd,
    quota_headers,
    quota_message,
    reserve,
    settle,
    span_of,
    usd_to_nanos,
)


def test_prices_are_exact_integers() -> None:
    p = Price.per_million(0.15, 0.6, cached_prompt=0.075)
    assert (p.prompt, p.completion, p.cached_prompt) == (150_000, 600_000, 75_000)
    assert Price.per_million(3, 15).cached_prompt == 3_000_000  # cached costs the prompt price by default
    assert Price.per_million(0.000001, 0).prompt == 1
    with pytest.raises(ValueError, match="more than 6 decimals"):
        Price.per_million(0.0000001, 1)
    assert usd_to_nanos(0.015244) == 15_244_000 and usd_to_nanos("10") == 10 * 10**9
    with pytest.raises(ValueError, match="more than 9 decimals"):
        usd_to_nanos("0.0000000001")


def test_cost_is_rounded_up_once_and_cached_tokens_are_cheaper() -> None:
    p = Price.per_million(0.15, 0.6, cached_prompt=0.075)
    # 1000 prompt tokens (400 cached) and 200 completion tokens: 600 x 150k + 400 x 75k + 200 x 600k picos
    assert p.cost(1000, 200, 400) == (600 * 150_000 + 400 * 75_000 + 200 * 600_000) // 1000
    assert Price.per_million(0.000001, 0).cost(1, 0) == 1  # one pico-dollar rounds up to a nano-dollar
    assert p.cost(10, 0, cached_tokens=50) == p.cost(10, 0, cached_tokens=10)  # never more cached than prompt


@given(st.integers(0, 10**6), st.integers(0, 10**5), st.integers(0, 10**6))
def test_cost_never_under_charges_by_a_nano_dollar(prompt: int, completion: int, cached: int) -> None:
    p = Price.per_million(2.5, 10, cached_prompt=1.25)
    cached = min(cached, prompt)
    exact = ((prompt - cached) * 2.5 + cached * 1.25 + completion * 10) * 1000  # nano-dollars
    assert exact <= p.cost(prompt, completion, cached) < exact + 1


def test_reserve_and_settle() -> None:
    p = Price.per_million(1, 2)
    reserved = reserve(p, 12, 200)
    assert reserved == Charge(212, 12 * 1000 + 200 * 2000)
    assert settle(reserved, p, (15, 40, 0), True) == Charge(55, 15 * 1000 + 40 * 2000)
    assert settle(reserved, p, None, False) == Charge(0, 0)  # no engine saw it
    assert settle(reserved, p, None, True) == reserved  # cut before its usage: conservative


@pytest.mark.parametrize(
    ("when", "day", "month"),
    [
        ("2026-12-31T23:59:59", "2026-12-31", "2026-12"),
        ("2027-01-01T00:00:00", "2027-01-01", "2027-01"),
        ("2028-02-29T12:00:00", "2028-02-29", "2028-02"),
        ("1970-01-01T00:00:00", "1970-01-01", "1970-01"),
    ],
)
def test_calendar_periods_roll_at_utc_boundaries(when: str, day: str, month: str) -> None:
    now = calendar.timegm(dt.datetime.fromisoformat(when).timetuple())
    d, m = calendar_span("day", now), calendar_span("month", now)
    assert (d.id, m.id) == (day, month)
    assert d.start_s <= now < d.end_s and d.end_s - d.start_s == 86_400
    assert m.start_s <= now < m.end_s
    start = dt.datetime.fromtimestamp(m.start_s, dt.UTC)
    end = dt.datetime.fromtimestamp(m.end_s, dt.UTC)
    assert (start.day, start.hour, end.day, end.hour) == (1, 0, 1, 0)
    assert span_of("day", day) == d and span_of("month", month) == m
    # spend is kept past the end of its period, never dropped before
    assert expires_at_s(d) > d.end_s and expires_at_s(m) > m.end_s


@given(st.integers(0, 4_102_444_800))
def test_calendar_span_agrees_with_datetime(now: int) -> None:
    t = dt.datetime.fromtimestamp(now, dt.UTC)
    assert calendar_span("day", now).id == t.strftime("%Y-%m-%d")
    assert calendar_span("month", now).id == t.strftime("%Y-%m")


@pytest.mark.parametrize("bad", ["2026-13", "2026-1", "2026-12-32", "yesterday", "2026-02-30", ""])
def test_bad_period_ids_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="is not a"):
        span_of("day" if bad.count("-") == 2 else "month", bad)


def test_money_is_shown_in_cents_or_every_digit() -> None:
    assert format_usd(10 * 10**9) == "$10.00"
    assert format_usd(412_000) == "$0.000412"
    assert format_usd(10_000_000) == "$0.01"
    assert format_usd(1) == "$0.000000001"


def test_budget_values_are_checked() -> None:
    with pytest.raises(ValueError):
        Budget("rolling", "usd", 10)
    with pytest.raises(ValueError):
        Budget("day", "usd", 10, window_s=60)
    with pytest.raises(ValueError):
        Budget("day", "tokens", 0)
    assert Budget("rolling", "usd", 1, 3600).label == "rolling 1h"
    assert Budget("month", "usd", 1).label == "UTC month"


def test_quota_message_names_scope_period_and_figures() -> None:
    month = Budget("month", "usd", 10 * 10**9)
    text = quota_message(month, "tenant acme", 9_990_000_000, 20_000_000, 3_600_000, "2027-01-01T00:00:00Z")
    assert text == (
        "You exceeded your current quota (tenant acme budget, UTC month: $9.99 of $10.00 used; this request "
        "needs up to $0.02). The budget resets at 2027-01-01T00:00:00Z."
    )
    alone = quota_message(Budget("day", "tokens", 100), "user bob", 0, 150, None, None)
    assert "this request alone needs up to 150 tokens, more than the whole budget of 100 tokens" in alone
    rolling = quota_message(Budget("rolling", "tokens", 100, 3600), "API key key_1", 90, 20, 61_000, None)
    assert rolling.endswith("Enough of it frees up in 61s.")


def test_retry_after_only_when_true() -> None:
    assert quota_headers(True, 5000) == {"x-should-retry": "false"}  # can never pass
    assert quota_headers(False, None) == {"x-should-retry": "false"}
    assert quota_headers(False, 1500) == {"retry-after": "2", "retry-after-ms": "1500"}
    long = quota_headers(False, 86_400_000)
    assert long["retry-after"] == "86400" and long["x-should-retry"] == "false"
