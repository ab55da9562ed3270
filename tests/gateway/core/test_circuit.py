"""gateway/core/circuit.py: the breaker's states on the time it is handed (seconds, as the proxy and
the health checker pass their clock's), so order and counts are asserted without waiting."""

from __future__ import annotations

from gateway.core.circuit import CircuitBreaker


def test_consecutive_failures_open_it_and_a_success_resets_the_count() -> None:
    c = CircuitBreaker(failure_threshold=3, open_s=2.0)
    c.failure(1.0)
    c.failure(1.1)
    c.success()  # the count starts again
    c.failure(1.2)
    c.failure(1.3)
    assert c.state == "closed" and c.allow(1.3)
    c.failure(1.4)
    assert c.state == "open" and not c.allow(1.5) and c.is_open(3.39)


def test_once_open_s_has_passed_exactly_one_trial_goes_through() -> None:
    c = CircuitBreaker(failure_threshold=1, open_s=2.0)
    c.failure(10.0)
    assert not c.allow(11.999)
    assert c.allow(12.0) and c.state == "half_open"  # the trial
    assert not c.allow(12.0) and not c.allow(30.0)  # nothing else until it reports
    assert c.is_open(12.0)  # routing does not count it as available meanwhile
    c.success()
    assert c.state == "closed" and c.allow(12.1) and c.allow(12.1)


def test_a_failed_trial_opens_it_for_another_period() -> None:
    c = CircuitBreaker(failure_threshold=1, open_s=2.0)
    c.failure(10.0)
    assert c.allow(12.0)
    c.failure(12.5)
    assert c.state == "open" and not c.allow(14.4) and c.allow(14.5)


def test_circuit_reopens_when_a_request_after_the_open_period_fails() -> None:
    c = CircuitBreaker(failure_threshold=3, open_s=2.0)
    for _ in range(3):
        c.failure(10.0)
    assert c.is_open(11.0)
    # Routing lets traffic through once the open period is over (is_open turns False) ...
    assert not c.is_open(12.5)
    # ... and a failure then re-opens the circuit for another period (it does not stay passable).
    c.failure(12.5)
    assert c.is_open(13.0) and c.is_open(14.4)
    assert not c.is_open(14.6)
    c.success()
    assert c.state == "closed" and not c.is_open(14.6)
