"""`Lease` (gateway/upstream/lease.py): what one upstream attempt holds on its backend, and that it
gives each back exactly once whatever path ends the attempt."""

from __future__ import annotations

from gateway.core.circuit import CircuitBreaker
from gateway.core.fleet import Backend
from gateway.upstream.lease import Lease


def backend() -> Backend:
    return Backend("b0", "http://127.0.0.1:9", "vllm", CircuitBreaker(failure_threshold=1, open_s=10.0))


class Failures:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, backend: Backend, kind: str) -> None:
        self.seen.append((backend.name, kind))


def test_an_attempt_counts_in_flight_and_its_prefill_until_released() -> None:
    b = backend()
    first, second = Lease(b, 300, Failures()), Lease(b, 0, Failures())
    assert (b.in_flight, b.prefill, b.requests_total) == (2, 300, 2)
    first.prefilled()  # its first token came back: the prompt leaves the queue, the attempt does not
    assert (b.in_flight, b.prefill) == (2, 0)
    first.release()
    first.release()  # a second path ending the same attempt changes nothing
    second.release()
    assert (b.in_flight, b.prefill, b.requests_total) == (0, 0, 2)


def test_an_attempt_released_before_its_first_token_takes_its_prefill_back() -> None:
    b = backend()
    lease = Lease(b, 120, Failures())
    lease.release()
    lease.prefilled()
    assert (b.in_flight, b.prefill) == (0, 0)


def test_the_circuit_hears_one_verdict_per_attempt() -> None:
    b, failures = backend(), Failures()
    lease = Lease(b, 0, failures)
    lease.failed("timeout")
    lease.failed("upstream_broken")
    lease.succeeded()
    assert b.circuit.state == "open" and b.circuit.successes == 0
    assert failures.seen == [("b0", "timeout")]

    b = backend()
    lease = Lease(b, 0, failures)
    lease.succeeded()
    lease.failed("upstream_broken")  # a stream cut after the answer was judged: no second verdict
    assert b.circuit.state == "closed" and b.circuit.successes == 1
    assert failures.seen == [("b0", "timeout")]


def test_an_attempt_without_a_verdict_leaves_the_circuit_alone() -> None:
    b = backend()
    Lease(b, 10, Failures()).release()  # e.g. the client left before the engine answered
    assert b.circuit.state == "closed" and b.circuit.successes == 0
