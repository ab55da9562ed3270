"""The active health probe, one module: its verdicts against a transport whose health path answers
late, fails or answers (a stand-in transport: the probe's logic is what is under test; the real
transport and simulators are exercised by tests/reliability)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from gateway.core.circuit import CircuitBreaker
from gateway.core.fleet import Backend
from gateway.upstream.health import HealthChecker
from gateway.upstream.transport import ConnectFailed


class _Dialect:
    health_path = "/health"


class _Pool:
    dialect = _Dialect()


class _Fleet:
    def __init__(self, backend: Backend) -> None:
        self.backends = {backend.name: backend}
        self.pools = {backend.pool: _Pool()}


class _Response:
    status = 200

    async def read(self) -> bytes:
        return b"{}"

    def close(self) -> None:
        pass


class _Transport:
    """Its health path: `hang` seconds late, and then answering, or failing to connect."""

    def __init__(self, hang: float, fail: bool = False, during: Any = None) -> None:
        self.hang, self.fail, self.during = hang, fail, during

    async def request(
        self, method: str, url: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> _Response:
        if self.during is not None:
            self.during()
        await asyncio.sleep(self.hang)
        if self.fail:
            raise ConnectFailed("refused")
        return _Response()


def _backend() -> Backend:
    backend = Backend("b0", "http://127.0.0.1:1", "vllm", CircuitBreaker(3, 10.0))
    backend.healthy = True
    return backend


def _checker(backend: Backend, transport: _Transport) -> HealthChecker:
    return HealthChecker(
        _Fleet(backend),  # type: ignore[arg-type]
        transport,  # type: ignore[arg-type]
        interval_s=60,
        timeout_s=0.05,
        scrape_interval_s=0,
    )


async def test_a_probe_that_times_out_marks_an_idle_backend_unhealthy() -> None:
    backend = _backend()
    await _checker(backend, _Transport(hang=1.0)).probe_all()
    assert backend.healthy is False and backend.circuit._failures == 1


async def test_a_probe_that_times_out_while_the_backend_completes_answers_changes_nothing() -> None:
    backend = _backend()
    # an answer completes on the backend while its health path is slow (the proxy reports it)
    await _checker(backend, _Transport(hang=1.0, during=backend.circuit.success)).probe_all()
    assert backend.healthy is True and backend.circuit._failures == 0


@pytest.mark.parametrize("healthy", [True, None])
async def test_a_refused_probe_marks_it_unhealthy_even_while_it_answers(healthy: bool | None) -> None:
    backend = _backend()
    backend.healthy = healthy
    await _checker(backend, _Transport(hang=0, fail=True, during=backend.circuit.success)).probe_all()
    assert backend.healthy is False


async def test_a_200_brings_it_back() -> None:
    backend = _backend()
    backend.healthy = False
    await _checker(backend, _Transport(hang=0)).probe_all()
    assert backend.healthy is True
