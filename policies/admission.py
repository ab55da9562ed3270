"""Admission arithmetic: token reservations, limit verdicts, OpenAI's rate-limit headers and messages.

Pure functions and values only (no clocks, no I/O): the limiters (gateway/admission/limits_redis.py in Lua,
gateway/admission/limits_local.py in Python) compute a `Verdict` with the same algorithm — an exact sliding
window log, docs/admission.md — and everything the client sees is derived from it here.

Durations are integers in milliseconds throughout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class Outcome(IntEnum):
    """What a limiter decided. The numbers are the Lua script's return codes."""

    ADMITTED = 0
    REQUESTS = 1  # requests per window reached
    TOKENS = 2  # tokens per window reached
    CONCURRENCY = 3  # concurrent requests reached
    TOO_LARGE = 4  # the request alone needs more tokens than the window allows
    QUOTA = 5  # a budget is spent (`scope` is the index of the budget's meter; policies/budgets.py)
    QUOTA_TOO_LARGE = 6  # the request alone may cost more than a whole budget


@dataclass(frozen=True, slots=True)
class ScopeLimits:
    """One scope's limits, 0 = unlimited. `key` names the scope in the shared store."""

    key: str
    label: str  # "user alice" / "tenant acme", for messages
    requests: int
    tokens: int
    concurrent: int

    @property
    def unlimited(self) -> bool:
        return not (self.requests or self.tokens or self.concurrent)


@dataclass(frozen=True, slots=True)
class Verdict:
    """A limiter's answer. Header figures describe the most constrained scope (least remaining).

    `retry_ms`: on a rejection, the time until this same request would be admitted if nothing else
    arrived (0 when admitted; for a calendar budget the caller knows the period's end). `reset_*_ms`:
    the time until the oldest usage counted in the window leaves it (capacity starts coming back).
    `used`/`requested`: the figures of the rejecting limit or budget, for the message. `scope`: index
    (from 1) of the rejecting scope, or of the rejecting budget's meter for the QUOTA outcomes.
    """

    outcome: Outcome
    scope: int = 0
    retry_ms: int = 0
    limit_requests: int = 0
    remaining_requests: int = 0
    reset_requests_ms: int = 0
    limit_tokens: int = 0
    remaining_tokens: int = 0
    reset_tokens_ms: int = 0
    used: int = 0
    requested: int = 0

    @property
    def admitted(self) -> bool:
        return self.outcome is Outcome.ADMITTED


def go_duration(ms: int) -> str:
    """A duration as Go's `time.Duration.String()` prints it (OpenAI's reset headers): `20ms`,
    `1s`, `1.5s`, `6m0s`, `1h0m0s`. Negative values print as `0s`."""
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    s = f"{secs}.{millis:03d}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{s}"
    if minutes:
        return f"{minutes}m{s}"
    return s


def retry_after_seconds(ms: int) -> int:
    """`retry-after` in whole seconds: rounded up (never early), at least 1."""
    return max(1, -(-ms // 1000))


def completion_budget(body: Mapping[str, Any], default_max_tokens: int) -> int:
    """Output tokens a request may generate: `max_completion_tokens` or `max_tokens` (else the
    model's default), times `n` (or `best_of` for completions, which generates that many), times the
    prompts of a completions batch (a list of strings or of token-id lists: one request each)."""
    out = default_max_tokens
    for name in ("max_completion_tokens", "max_tokens"):
        v = body.get(name)
        if type(v) is int and v > 0:
            out = v
            break
    choices = 1
    for name in ("best_of", "n"):
        v = body.get(name)
        if type(v) is int and v > choices:
            choices = v
    prompt = body.get("prompt")
    if type(prompt) is list and prompt and type(prompt[0]) is not int:
        choices *= len(prompt)
    return out * choices


def reconciled(reserved: int, actual: int | None, reached_engine: bool) -> int:
    """Tokens to keep counted once a request ended. Real usage when known; nothing when no engine
    saw the request; the reservation when usage is unknown (an aborted stream: conservative)."""
    if actual is not None:
        return max(0, actual)
    return reserved if reached_engine else 0


_UNIT = {Outcome.REQUESTS: "requests per min (RPM)", Outcome.TOKENS: "tokens per min (TPM)"}


def rejection_message(verdict: Verdict, model: str, scope_label: str) -> str:
    """OpenAI's wording for a 429 ("Rate limit reached for M … on requests per min (RPM): Limit 3,
    Used 3, Requested 1. Please try again in 20s.")."""
    wait = go_duration(verdict.retry_ms)
    if verdict.outcome is Outcome.CONCURRENCY:
        return (
            f"Rate limit reached for {model} for {scope_label} on concurrent requests: Limit {verdict.used}, "
            f"Used {verdict.used}, Requested 1. Please try again when one of your requests has finished."
        )
    if verdict.outcome is Outcome.TOO_LARGE:
        return (
            f"Request too large for {model} for {scope_label} on tokens per min (TPM): Limit {verdict.limit_tokens}, "
            f"Requested {verdict.requested}. The input or output tokens must be reduced in order to run successfully."
        )
    limit = verdict.limit_requests if verdict.outcome is Outcome.REQUESTS else verdict.limit_tokens
    return (
        f"Rate limit reached for {model} for {scope_label} on {_UNIT[verdict.outcome]}: Limit {limit}, "
        f"Used {verdict.used}, Requested {verdict.requested}. Please try again in {wait}."
    )


def error_type(outcome: Outcome) -> str:
    """OpenAI's `type` of a 429: `requests`, `tokens`, or `insufficient_quota` (a budget)."""
    if outcome in (Outcome.QUOTA, Outcome.QUOTA_TOO_LARGE):
        return "insufficient_quota"
    return "tokens" if outcome in (Outcome.TOKENS, Outcome.TOO_LARGE) else "requests"


def header_pairs(v: Verdict) -> list[tuple[bytes, bytes]]:
    """OpenAI's `x-ratelimit-*` headers for the limits that are set (a 0 limit is not reported)."""
    out: list[tuple[bytes, bytes]] = []
    if v.limit_requests:
        out += [
            (b"x-ratelimit-limit-requests", str(v.limit_requests).encode()),
            (b"x-ratelimit-remaining-requests", str(max(0, v.remaining_requests)).encode()),
            (b"x-ratelimit-reset-requests", go_duration(v.reset_requests_ms).encode()),
        ]
    if v.limit_tokens:
        out += [
            (b"x-ratelimit-limit-tokens", str(v.limit_tokens).encode()),
            (b"x-ratelimit-remaining-tokens", str(max(0, v.remaining_tokens)).encode()),
            (b"x-ratelimit-reset-tokens", go_duration(v.reset_tokens_ms).encode()),
        ]
    return out


def retry_headers(v: Verdict) -> dict[str, str]:
    """`retry-after` (whole seconds, ≥ 1, rounded up) and `retry-after-ms` for a 429. A request that
    can never pass (`TOO_LARGE`) also says `x-should-retry: false`, which the SDK obeys."""
    out = {"retry-after": str(retry_after_seconds(v.retry_ms)), "retry-after-ms": str(max(1, v.retry_ms))}
    if v.outcome is Outcome.TOO_LARGE:
        out["x-should-retry"] = "false"
    return out
