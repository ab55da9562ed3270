"""Shared fixtures: real engine simulators, real gateways and a real redis-server on loopback; the two
tiers of the suite.

`make check` runs the tests without the `processes` mark: units and in-process tests, no subprocess.
`make test` runs everything, on pytest-xdist workers: a test marked `processes` starts gateways,
simulators, redis-server, Prometheus, Chromium or the real engines. A test without the mark that
starts a process fails (`_no_processes`), so nothing slow slips into the check tier. Tests that share
a server are kept on one worker (`xdist_group`, set below): a module's own servers with its module,
the real engines with every test that uses them.
"""

from __future__ import annotations

import contextlib
import multiprocessing.util
import os
import re
import subprocess
import threading
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from engines.sim.launcher import SimProcess
from gateway.demo import SERVED, sim_flags
from tests import support
from tests.support import GatewayProcess, RedisServer

MODEL = "test-model"
ENGINES = ("vllm", "sglang")
PROCESSES = "processes"  # the mark of a test that starts processes: `make test` only
# the fixtures that start the real vLLM and SGLang servers (tests/real_engines/conftest.py): every test
# that uses one runs on the same xdist worker, which starts each server once
REAL_ENGINE_FIXTURES = frozenset(
    {"real_engine", "real_vllm", "real_sglang", "real_vllm_spare", "vllm_traces"}
)


# Hypothesis times the drawing of examples and fails a test whose drawing is slow: on a machine whose
# cores are busy elsewhere that is a verdict on the machine, not the test (no deadline, for the same reason)
settings.register_profile("suite", suppress_health_check=[HealthCheck.too_slow], deadline=None)
settings.load_profile("suite")


class ProcessStarted(Exception):
    """A test without the `processes` mark started a process."""


def pytest_configure(config: pytest.Config) -> None:
    # `make check`: property tests draw a share of their examples (tests.support.examples)
    support._quick[0] = config.option.markexpr == f"not {PROCESSES}"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """`make check` (`-m "not processes"`) does not import the modules marked whole: they would all
    be deselected, and importing them (the SDKs, Selenium, ...) is a third of the tier's time."""
    if config.option.markexpr != f"not {PROCESSES}" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    head = collection_path.read_text(encoding="utf-8").split("\ndef ", 1)[0]
    return bool(_MODULE_MARK.search(head)) or None


_MODULE_MARK = re.compile(rf"^pytestmark = \[?pytest\.mark\.{PROCESSES}\b", re.M)


@pytest.hookimpl(wrapper=True)  # before every other implementation: `-m` deselects, xdist reads the groups
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Generator[None, None, None]:
    for item in items:
        if REAL_ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.processes)
            item.add_marker(pytest.mark.xdist_group("real_engines"))
        elif item.get_closest_marker(PROCESSES) and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    return (yield)


def pytest_collection_finish(session: pytest.Session) -> None:
    # a run without a process at all (`make check`): a process started from any thread fails the test;
    # beside servers that start their own in threads, only one started from the test's thread does
    _everywhere[:] = [not any(item.get_closest_marker(PROCESSES) for item in session.items)]


_everywhere: list[bool] = [True]
_started: list[str] = []


def _refuse(what: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        if _everywhere[0] or threading.current_thread() is threading.main_thread():
            _started.append(what)
            raise ProcessStarted(f"{what} in a test without the `{PROCESSES}` mark")
        return real(*args, **kwargs)

    return refuse


@contextlib.contextmanager
def _no_processes(item: pytest.Item) -> Iterator[None]:
    """Within an unmarked test's setup, call and teardown: every way a process starts raises."""
    if item.get_closest_marker(PROCESSES):
        yield
        return
    patched: list[tuple[Any, str, Any]] = [
        (subprocess.Popen, "_execute_child", subprocess.Popen._execute_child),  # type: ignore[attr-defined]
        (os, "fork", os.fork),
        (os, "posix_spawn", os.posix_spawn),
        (os, "posix_spawnp", os.posix_spawnp),
        (os, "system", os.system),
        (multiprocessing.util, "spawnv_passfds", multiprocessing.util.spawnv_passfds),
    ]
    for owner, name, real in patched:
        setattr(owner, name, _refuse(f"{getattr(owner, '__name__', owner)}.{name}", real))
    _started.clear()
    try:
        yield
    finally:
        for owner, name, real in patched:
            setattr(owner, name, real)
    if _started:  # raised where it was called, perhaps in a thread or a task that swallowed it
        raise ProcessStarted(f"{', '.join(_started)} in a test without the `{PROCESSES}` mark")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with _no_processes(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with _no_processes(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    with _no_processes(item):
        return (yield)


def single_pool_config(engine: str, urls: list[str], **overrides: Any) -> dict[str, Any]:
    """A gateway config with one pool of `engine` backends serving MODEL."""
    config: dict[str, Any] = {
        "server": {"graceful_shutdown_s": 5},
        "models": [{"name": MODEL, "context_length": 8192}],
        "pools": [
            {
                "name": engine,
                "dialect": engine,
                "models": {MODEL: SERVED[engine]},
                "backends": [{"name": f"{engine}-{i}", "url": u} for i, u in enumerate(urls)],
            }
        ],
        "upstream": {"health": {"interval_s": 0.5, "failure_threshold": 2, "open_s": 1.0}},
        "routing": {"scrape_interval_s": 0.5},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key].update(value)
        else:
            config[key] = value
    return config


def fast_sim(engine: str, *extra: str) -> SimProcess:
    """A simulator with the demo's engine flags and small latencies (tests stay quick)."""
    flags = [*sim_flags(engine), "--ttft-ms", "2", "--prefill-us-per-token", "0", "--itl-ms", "1", *extra]
    # 90 s to listen: in the side run the real engines' starts (torch in three servers) saturate the
    # two cores, and a simulator's start can then take over 30 s
    # the launcher picks the port, so one another process takes before the simulator binds it is
    # given up for another rather than failing the test
    return SimProcess(engine, None, flags, start_timeout=90.0)


@pytest.fixture(scope="module", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def pool_gateway(engine: str) -> Iterator[GatewayProcess]:
    """One gateway in front of two simulators of `engine` (module-scoped, per engine)."""
    with contextlib.ExitStack() as stack:
        a, b = stack.enter_context(fast_sim(engine)), stack.enter_context(fast_sim(engine))
        yield stack.enter_context(GatewayProcess(single_pool_config(engine, [a.base_url, b.base_url])))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        os.environ.setdefault("TEST_REDIS_URL", server.url)
        yield server
