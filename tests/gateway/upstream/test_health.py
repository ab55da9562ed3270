"""The active health probe, one module: its verdicts against a transport whose health path never
answers, fails or answers (a stand-in transport: the probe's logic is what is under test; the real
transport and simulators are exercised by tests/reliability). The probes run on virtual time
(tests/virtual_time.py): a timeout fires at its exact time, and a stall of this process is the clock
moved on by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import pytest

from engines.base import EngineLoad
from engines.sglang import SGLangDialect
from gateway.core.circuit import CircuitBreaker
from gateway.core.fleet import Backend
from gateway.demo import SERVED
from gateway.upstream.h1 import H1Transport
from gateway.upstream.health import HELD_S, HealthChecker
from gateway.upstream.transport import ConnectFailed
from tests.conftest import fast_sim
from tests.support import HTTP, until
from tests.virtual_time import on_virtual_time, virtual_loop


class _Dialect:
    health_path = "/health"


class _Pool:
    dialect = _Dialect()


class _Fleet:
    def __init__(self, backend: Backend, dialect: Any = None) -> None:
        self.backends = {backend.name: backend}
        self.pools = {backend.pool: _Pool()}
        if dialect is not None:
            self.pools[backend.pool].dialect = dialect


class _Response:
    status = 200

    async def read(self) -> bytes:
        return b"{}"

    def close(self) -> None:
        pass


class _Transport:
    """Its health path: answering at once, never (`hang`), or failing to connect; `during` runs as
    the request starts."""

    def __init__(self, hang: bool, fail: bool = False, during: Callable[[], object] | None = None) -> None:
        self.hang, self.fail, self.during = hang, fail, during

    async def request(
        self, method: str, url: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> _Response:
        if self.during is not None:
            self.during()
        if self.hang:
            await asyncio.Event().wait()  # until the probe's timeout cancels it
        if self.fail:
            raise ConnectFailed("refused")
        return _Response()


def _stall(seconds: float) -> Callable[[], None]:
    """This process held for `seconds` (its clock moves on, nothing runs meanwhile)."""
    return lambda: virtual_loop().advance(seconds)


def _backend() -> Backend:
    backend = Backend("b0", "http://127.0.0.1:1", "vllm", CircuitBreaker(3, 10.0))
    backend.healthy = True
    return backend


def _checker(
    backend: Backend, transport: _Transport, timeout_s: float = 0.05, held_s: float | None = None
) -> HealthChecker:
    """A probe timing out after `timeout_s` of the running (virtual) loop's clock. Every timeout is a
    verdict unless `held_s` is given, so a test of what a timeout does never meets the no-verdict of
    a held process."""
    return HealthChecker(
        _Fleet(backend),  # type: ignore[arg-type]
        transport,  # type: ignore[arg-type]
        interval_s=60,
        timeout_s=timeout_s,
        scrape_interval_s=0,
        held_s=held_s,
        clock=virtual_loop().time,
    )


@on_virtual_time
async def test_a_probe_that_times_out_marks_an_idle_backend_unhealthy() -> None:
    backend = _backend()
    await _checker(backend, _Transport(hang=True)).probe_all()
    assert backend.healthy is False and backend.circuit._failures == 1


@on_virtual_time
async def test_a_probe_that_times_out_while_the_backend_completes_answers_changes_nothing() -> None:
    backend = _backend()
    # an answer completes on the backend while its health path is slow (the proxy reports it)
    await _checker(backend, _Transport(hang=True, during=backend.circuit.success)).probe_all()
    assert backend.healthy is True and backend.circuit._failures == 0


@pytest.mark.parametrize("healthy", [True, None])
@on_virtual_time
async def test_a_refused_probe_marks_it_unhealthy_even_while_it_answers(healthy: bool | None) -> None:
    backend = _backend()
    backend.healthy = healthy
    await _checker(backend, _Transport(hang=False, fail=True, during=backend.circuit.success), 30).probe_all()
    assert backend.healthy is False


@on_virtual_time
async def test_a_probe_whose_timeout_fired_long_after_its_deadline_is_no_verdict() -> None:
    """This process held for 0.5 s (a host stopping the machine's vCPUs) as the probe starts: the
    0.05 s timeout fires 0.45 s late. With `held_s` 0.2 that is no verdict: the backend stays
    healthy and its circuit untouched; held 0.2 s (0.15 s late) it is one. (Without `held_s` the
    held probe is a verdict too: the idle backend's tests above. The default is a second.)"""
    assert HELD_S == 1.0
    backend = _backend()
    loop = virtual_loop()
    start = loop.time()
    await _checker(backend, _Transport(hang=True, during=_stall(0.5)), held_s=0.2).probe_all()
    assert loop.time() - start == pytest.approx(0.5)  # the timeout fired as soon as the loop ran again
    assert backend.healthy is True and backend.circuit._failures == 0
    await _checker(backend, _Transport(hang=True, during=_stall(0.2)), held_s=0.2).probe_all()
    assert backend.healthy is False and backend.circuit._failures == 1
    backend.healthy = True
    await _checker(backend, _Transport(hang=True, during=_stall(0.5))).probe_all()
    assert backend.healthy is False and backend.circuit._failures == 2


@on_virtual_time
async def test_a_200_brings_it_back() -> None:
    backend = _backend()
    backend.healthy = False
    await _checker(backend, _Transport(hang=False), 30).probe_all()
    assert backend.healthy is True


@on_virtual_time
async def test_a_busy_backend_is_marked_unhealthy_only_at_its_second_timed_out_probe_in_a_row() -> None:
    backend = _backend()
    backend.in_flight = 2  # requests of this process under way there (a long prefill, nothing answered yet)
    checker = _checker(backend, _Transport(hang=True))
    await checker.probe_all()
    assert backend.healthy is True and backend.circuit._failures == 0
    await checker.probe_all()
    assert backend.healthy is False and backend.circuit._failures == 1


@on_virtual_time
async def test_an_answered_probe_between_two_timeouts_of_a_busy_backend_starts_the_count_again() -> None:
    backend = _backend()
    backend.in_flight = 1
    slow, quick = _Transport(hang=True), _Transport(hang=False)
    checker = _checker(backend, slow)
    await checker.probe_all()
    checker._transport, checker._timeout = quick, 30  # type: ignore[assignment]
    await checker.probe_all()
    checker._transport, checker._timeout = slow, 0.05  # type: ignore[assignment]
    await checker.probe_all()
    assert backend.healthy is True


@on_virtual_time
async def test_a_backend_busy_with_the_other_processes_requests_gets_the_same_grace() -> None:
    """Four routing processes: the one whose probe times out may have nothing of its own in flight
    there, while the others' requests (as the shared store last told it) are."""
    backend = _backend()
    elsewhere = {"b0": 0}
    checker = HealthChecker(
        _Fleet(backend),  # type: ignore[arg-type]
        _Transport(hang=True),  # type: ignore[arg-type]
        interval_s=60,
        timeout_s=0.05,
        scrape_interval_s=0,
        elsewhere=elsewhere.__getitem__,
        held_s=None,
    )
    elsewhere["b0"] = 3
    await checker.probe_all()
    assert backend.healthy is True
    await checker.probe_all()  # the second in a row still takes it out
    assert backend.healthy is False
    backend.healthy = True
    checker._timed_out.clear()
    elsewhere["b0"] = 0  # idle everywhere: out at the first
    await checker.probe_all()
    assert backend.healthy is False


@on_virtual_time
async def test_a_busy_engine_by_its_scraped_load_gets_the_same_grace() -> None:
    backend = _backend()  # nothing of this process in flight; the engine says it runs requests
    backend.load, backend.load_at = EngineLoad(running=3.0, waiting=5.0), virtual_loop().time()
    await _checker(backend, _Transport(hang=True)).probe_all()
    assert backend.healthy is True


@pytest.mark.processes
async def test_a_real_sglang_simulator_prefilling_a_long_prompt_stays_healthy() -> None:
    """The simulator's `/health` is SGLang's `health_generate` (docs/simulators.md): a one-token
    generation that waits behind a long prefill. Pure prefill for ~1.5 s (nothing decoding, so
    nothing answered) times a 0.3 s probe out; the backend, with this request in flight, stays
    routable (taking it out would send its warm prefixes to cold engines)."""
    flags = [
        "--prefill-us-per-token",
        "1000",
        "--max-num-batched-tokens",
        "256",
        "--chunked-prefill-size",
        "256",
    ]
    with fast_sim("sglang", *flags) as sim:
        transport = H1Transport(connect_timeout_s=1.0)
        backend = Backend("s0", sim.base_url, "sglang", CircuitBreaker(3, 10.0))
        checker = HealthChecker(
            _Fleet(backend, SGLangDialect()),  # type: ignore[arg-type]
            transport,  # type: ignore[arg-type]
            interval_s=60,
            timeout_s=0.3,
            scrape_interval_s=0,
        )
        try:
            await checker.probe_all()
            assert backend.healthy is True
            body = {
                "model": SERVED["sglang"],
                "messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(1500))}],
                "max_tokens": 2,
                "stream": True,
            }
            url = sim.base_url + "/v1/chat/completions"
            async with httpx.AsyncClient(timeout=30) as http, http.stream("POST", url, json=body) as resp:
                backend.in_flight += 1  # as the proxy counts it
                stats = sim.base_url + "/sim/stats"
                await until(lambda: HTTP.get(stats).json()["running"] == 1, what="the prefill under way")
                await checker.probe_all()
                assert backend.name in checker._timed_out, "the probe was expected to time out"
                assert backend.healthy is True
                text = (await resp.aread()).decode()
                backend.in_flight -= 1
            assert resp.status_code == 200 and "data: [DONE]" in text
            await checker.probe_all()
            assert backend.healthy is True
        finally:
            await transport.aclose()


@on_virtual_time
async def test_a_busy_backend_whose_probes_keep_timing_out_counts_each_against_its_circuit() -> None:
    backend = _backend()
    backend.in_flight = 1
    checker = _checker(backend, _Transport(hang=True))
    for _ in range(4):
        await checker.probe_all()
    assert backend.healthy is False and backend.circuit._failures == 3
