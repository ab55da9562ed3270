"""Session-scoped real engine servers: `real_vllm`, `real_sglang`, and `real_engine` (both, parametrized);
`real_vllm_spare`, a second vLLM server for the failover test to kill (started only when it is used), which
also serves a LoRA adapter of the tiny model (`LORA_MODEL`, for tests/real_engines/test_engine_lora.py);
`vllm_traces`, the OTLP/HTTP receiver `real_vllm` exports its OpenTelemetry spans to (`--otlp-traces-endpoint`:
vLLM makes one span per finished request, a child of the `traceparent` it was sent, and exports it every
0.2 s from a thread of its API server; tests/real_engines/test_tracing.py points a gateway at it too).

Every server is started with `--api-key ENGINE_KEY`, as production engines are: a request sent to one
directly carries `server.headers`, and the tests' gateways read the key from `ENGINE_KEY_ENV`
(`real_pool_config`'s `api_key_env`), which this module sets for the gateway processes to inherit.

Each takes 16-30 s to become healthy and ~3 GB of memory, so they are started in the background as soon
as collection has finished, and only when a collected test asks for them: their startup overlaps the
tests that run before `tests/real_engines/`. The spare starts only once the others are healthy
(`LATER`). The fixtures wait for health (bounded) and hand out the running server. Each is stopped (by process group) as soon as the last collected test that uses it has
finished, not at the session's end: an idle vLLM or SGLang still polls (~half a core between them),
and `make test` runs other parts after this folder in the same process. The session's end stops
whatever is left. Logs: `.engines/logs/<engine>.log`.

A server that cannot start fails the tests that use it, with its log's tail; nothing is skipped.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tests.otlp_receiver import OtlpReceiver
from tests.real_engines.rig import ENGINE_KEY, ENGINE_KEY_ENV
from tests.real_engines.servers import (
    ENGINES_DIR,
    EngineServer,
    SglangServer,
    VllmServer,
    build_tiny_lora,
    build_tiny_model,
)

SERVED_MODEL = "tiny-qwen3"
LORA_MODEL = "tiny-lora"  # the LoRA adapter the spare vLLM server also serves
ENGINES = ("sglang", "vllm")  # what `real_engine` is parametrized over
_KINDS: dict[str, type[EngineServer]] = {"vllm": VllmServer, "sglang": SglangServer, "vllm_spare": VllmServer}
_servers: dict[str, EngineServer] = {}
_errors: dict[str, BaseException] = {}
_watchers: dict[str, threading.Thread] = {}
_first_startup: dict[str, float | None] = {}
_receiver: list[OtlpReceiver] = []  # started with the first vLLM server, stopped after every server
_model: list[Path] = []  # the tiny model's directory, built once
_lock = threading.RLock()  # launches come from the session's thread and from `_launch_after`
_closed: list[bool] = []  # set at the session's end: nothing is launched any more
_started: set[str] = set()  # every engine launched in this session
# Started only once the others are healthy: three engines importing PyTorch at once, beside the other
# test runs, hold the CPU for ~90 s (a simulator's start then takes over 15 s), and the tests that use
# the spare run long after (test_engine_lora.py, test_failover.py).
LATER = {"vllm_spare"}
os.environ[ENGINE_KEY_ENV] = ENGINE_KEY


def _wanted(items: list[pytest.Item]) -> set[str]:
    wanted: set[str] = set()
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        wanted |= {engine for engine in _KINDS if f"real_{engine}" in names}
        if "real_engine" in names:
            callspec = getattr(item, "callspec", None)
            param = callspec.params.get("real_engine") if callspec is not None else None
            wanted |= {param} if param in ENGINES else set(ENGINES)
    return wanted


def _launch(engines: set[str]) -> None:
    with _lock:
        if not _closed:
            _launch_locked(engines)


def _launch_after(engines: set[str], others: list[threading.Thread]) -> None:
    for watcher in others:
        watcher.join()  # bounded: wait_healthy gives up after the start timeout
    with _lock:  # not if a test asked for it first (and may have stopped it since)
        _launch({engine for engine in engines if engine not in _started})


def _launch_locked(engines: set[str]) -> None:
    try:
        if not _model:
            _model.append(build_tiny_model())
        model = _model[0]
    except Exception as exc:  # reported by the fixtures, so the tests fail with it
        for engine in engines:
            _errors[engine] = exc
        return
    for engine in sorted(engines):
        if engine in _servers or engine in _errors:
            continue
        logs = ENGINES_DIR / "logs" / ("spare" if engine.endswith("_spare") else "")
        server: EngineServer
        if engine == "vllm":
            if not _receiver:
                _receiver.append(OtlpReceiver().start())
            traces = _receiver[0].url
            server = VllmServer(
                model,
                served_model_name=SERVED_MODEL,
                log_dir=logs,
                api_key=ENGINE_KEY,
                otlp_traces_endpoint=traces,
            )
        elif engine == "vllm_spare":
            try:
                adapter = build_tiny_lora(model)
            except Exception as exc:
                _errors[engine] = exc
                continue
            server = VllmServer(
                model,
                served_model_name=SERVED_MODEL,
                log_dir=logs,
                api_key=ENGINE_KEY,
                extra=lora_flags(adapter),
            )
        else:
            server = _KINDS[engine](model, served_model_name=SERVED_MODEL, log_dir=logs, api_key=ENGINE_KEY)
        _started.add(engine)
        try:
            server.start(wait=False)
        except Exception as exc:
            _errors[engine] = exc
            continue
        _servers[engine] = server
        # Watch its health from now on, so startup_s is the real time to healthy.
        _watchers[engine] = threading.Thread(target=_watch, args=(engine, server), daemon=True)
        _watchers[engine].start()


def _watch(engine: str, server: EngineServer) -> None:
    try:
        server.wait_healthy()
        _first_startup[engine] = server.startup_s
    except Exception as exc:
        _errors[engine] = exc


_last_user: dict[str, str] = {}  # engine -> node id of the last collected test that uses it


_deferred: set[str] = set()  # on an xdist worker: launched when its first test that uses one starts


def pytest_collection_finish(session: pytest.Session) -> None:
    wanted = _wanted(session.items)
    _last_user.clear()
    for item in session.items:
        for engine in _wanted([item]):
            _last_user[engine] = item.nodeid
    if hasattr(session.config, "workerinput"):
        # every xdist worker collects the whole suite, and one runs the tests that use the engines
        # (their `xdist_group`, tests/conftest.py): that one starts them
        _deferred.update(wanted)
    elif wanted:
        _launch_all(wanted)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _deferred and _wanted([item]):
        wanted = set(_deferred)
        _deferred.clear()
        _launch_all(wanted)


def _launch_all(wanted: set[str]) -> None:
    first = wanted - LATER or wanted
    _launch(first)
    if later := wanted - first:
        others = [_watchers[engine] for engine in first if engine in _watchers]
        threading.Thread(target=_launch_after, args=(later, others), daemon=True).start()


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """After the last test that uses an engine (its teardown included): stop that engine."""
    done = [engine for engine, last in _last_user.items() if last == nodeid]
    for engine in done:
        del _last_user[engine]
    _retire([engine for engine in done if engine in _servers])


def _running(engine: str) -> EngineServer:
    with _lock:
        if engine not in _servers and engine not in _errors:
            _launch({engine})  # not launched yet (LATER), or not seen at collection (getfixturevalue)
    if engine in _watchers:
        _watchers.pop(engine).join()  # bounded: wait_healthy gives up after the start timeout
    if engine in _errors:
        raise RuntimeError(f"real {engine} server could not be started") from _errors[engine]
    server = _servers[engine]
    try:
        server.wait_healthy()
    except Exception as exc:
        _errors[engine] = exc
        raise
    return server


@pytest.fixture(scope="session")
def real_vllm() -> VllmServer:
    server = _running("vllm")
    assert isinstance(server, VllmServer)
    return server


@pytest.fixture(scope="session")
def real_sglang() -> SglangServer:
    server = _running("sglang")
    assert isinstance(server, SglangServer)
    return server


@pytest.fixture(scope="session")
def vllm_traces(real_vllm: VllmServer) -> OtlpReceiver:
    """The receiver of `real_vllm`'s spans (and of any gateway a test points at its `url`)."""
    return _receiver[0]


def lora_flags(adapter: Path) -> list[str]:
    """vLLM's flags to serve `adapter` as the model `LORA_MODEL` (its `/v1/models` lists it, `parent`
    the base model)."""
    return [
        "--enable-lora",
        "--lora-modules",
        f"{LORA_MODEL}={adapter}",
        "--max-lora-rank",
        "8",
        "--max-loras",
        "1",
    ]


@pytest.fixture(scope="session")
def real_vllm_spare() -> VllmServer:
    """Another vLLM server (~2.7 GB), serving the tiny model's LoRA adapter too (`LORA_MODEL`,
    `build_lora.py`): tests may kill it; it is not restarted."""
    server = _running("vllm_spare")
    assert isinstance(server, VllmServer)
    return server


@pytest.fixture(scope="session", params=ENGINES)
def real_engine(request: pytest.FixtureRequest) -> EngineServer:
    return _running(str(request.param))


_summary: list[str] = []


def _retire(engines: list[str]) -> None:
    """Stop `engines`' servers (a line of the summary each); a later test that asks for one of them
    starts it again (`_running`)."""
    servers = [(engine, _servers.pop(engine)) for engine in sorted(engines)]
    for engine, server in servers:
        first = _first_startup.get(engine)
        startup = f"healthy {first:.1f}s after its start" if first is not None else "never healthy"
        if server.startup_s is not None and server.startup_s != first:
            startup += f" (last restart: {server.startup_s:.1f}s)"
        _summary.append(
            f"real {engine}: {startup}, RSS at the end {server.rss_bytes() / 2**20:.0f} MiB "
            f"(process group), log {server.log_path}"
        )
    # SIGTERM every group first so they shut down together, then wait for (or SIGKILL) each.
    for _, server in servers:
        server.terminate()
    for _, server in servers:
        server.stop()
    for engine, _ in servers:
        _watchers.pop(engine, None)


def pytest_sessionfinish(session: pytest.Session) -> None:
    with _lock:
        _closed.append(True)
    _retire(list(_servers))
    while _receiver:
        _receiver.pop().stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _summary:
        terminalreporter.write_line(line)
