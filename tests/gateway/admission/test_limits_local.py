"""gateway/admission/limits_local.py on a clock the test moves: the retry-after it advertises is the
true wait, to the millisecond (the same behaviour against Redis's own clock:
tests/gateway/admission/test_limits_redis.py)."""

from __future__ import annotations

from gateway.admission.limits_local import LocalLimiter
from policies.admission import Outcome, ScopeLimits


class Clock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1024.0  # and binary fractions of a second from it: exact in milliseconds

    def __call__(self) -> float:
        return self.now


def user(requests: int) -> ScopeLimits:
    return ScopeLimits("gw:rl:{u:alice}:u", "user alice", requests, 0, 0)


async def test_retry_after_is_true() -> None:
    """After exactly the advertised wait the refused request passes, and not a moment before (1 s
    window, two requests 0.25 s apart)."""
    clock = Clock()
    limiter = LocalLimiter(window_s=1.0, clock=clock)
    scopes = [user(requests=2)]
    assert (await limiter.acquire("a", scopes, 1)).admitted
    clock.now += 0.25
    assert (await limiter.acquire("b", scopes, 1)).admitted
    refused = await limiter.acquire("c", scopes, 1)
    assert refused.outcome is Outcome.REQUESTS and refused.retry_ms == 750  # when "a" leaves
    clock.now += 0.75 - 1 / 512
    assert (await limiter.acquire("c", scopes, 1)).outcome is Outcome.REQUESTS
    clock.now += 1 / 512
    assert (await limiter.acquire("d", scopes, 1)).admitted
    assert (await limiter.acquire("e", scopes, 1)).outcome is Outcome.REQUESTS  # "b" is still in
