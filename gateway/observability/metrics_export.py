"""`GET /metrics`: the exposition, its optional protection, and prometheus-client multiprocess mode.

One worker process (the default): the text is the `Metrics` registry itself.

Several workers (`server.workers > 1`): uvicorn starts each worker as a fresh interpreter, and a
scrape reaches one of them at random, so every worker writes its values to memory-mapped files in
one directory (`PROMETHEUS_MULTIPROC_DIR`) and the worker that answers merges all of them:

    serve()  ── multiprocess_dir(): a fresh directory per run (an operator-given one is emptied),
       │        exported as PROMETHEUS_MULTIPROC_DIR before any worker starts; removed at exit
       ├── worker 1 ── Metrics writes counter_<pid>.db, histogram_<pid>.db, gauge_live*_<pid>.db
       └── worker 2 ──   "        (a scrape: MetricsExporter merges every file of the directory)

Counters and histograms of a worker that died stay in the sum (they are monotonic totals the
process did serve). Its gauges must not: before each merge, the exporter removes the live-gauge
files of pids that no longer exist (`mark_process_dead`), so uvicorn's replacement worker is not
counted twice. The merge rules of each gauge (sum, min, max, most recent) are in gateway/observability/metrics.py.
"""

from __future__ import annotations

import contextlib
import glob
import hmac
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest, values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from gateway.observability.settings import MetricsSettings

log = logging.getLogger("gateway.metrics")

ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


def multiprocess_active() -> bool:
    """This process writes its metrics to the multiprocess directory (decided when prometheus-client
    was imported, which is why `serve` sets the variable before any worker starts)."""
    return bool(os.environ.get(ENV)) and values.ValueClass is not values.MutexValue


@contextlib.contextmanager
def multiprocess_dir() -> Iterator[str]:
    """Export a clean PROMETHEUS_MULTIPROC_DIR for the worker processes of this run.

    An operator-given directory is emptied of metric files (files of an earlier run would be added to
    this run's totals) and kept; otherwise a temporary directory is created and removed at the end.
    """
    given = os.environ.get(ENV)
    if given:
        os.makedirs(given, exist_ok=True)
        for f in glob.glob(os.path.join(given, "*.db")):
            os.remove(f)
        path, owned = given, False
    else:
        path, owned = tempfile.mkdtemp(prefix="gateway-metrics-"), True
        os.environ[ENV] = path
    log.info("metrics: multiprocess mode, directory %s", path)
    try:
        yield path
    finally:
        if owned:
            os.environ.pop(ENV, None)
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed worker stays a zombie until its supervisor reaps it; it writes nothing any more.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in (b"Z", b"X")


def reap_dead_workers(path: str) -> list[int]:
    """Remove the live-gauge files of processes that no longer exist; returns their pids."""
    dead: set[int] = set()
    me = os.getpid()
    for f in glob.glob(os.path.join(path, "gauge_live*_*.db")):
        tail = os.path.basename(f)[: -len(".db")].rsplit("_", 1)[-1]
        if tail.isdigit() and int(tail) != me and not _alive(int(tail)):
            dead.add(int(tail))
    for pid in dead:
        mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
    return sorted(dead)


class MetricsExporter:
    """Renders the exposition for one process: its own registry, or the merge of all workers."""

    def __init__(self, registry: CollectorRegistry, settings: MetricsSettings) -> None:
        self._token = settings.bearer_token.encode() if settings.bearer_token else None
        self._path: str | None = None
        if multiprocess_active():
            self._path = os.environ[ENV]
            self._registry = CollectorRegistry(auto_describe=False)
            MultiProcessCollector(self._registry, self._path)  # type: ignore[no-untyped-call]
        else:
            if os.environ.get(ENV):
                log.warning(
                    "%s is set but prometheus-client was imported before it: one-process metrics", ENV
                )
            self._registry = registry

    @property
    def multiprocess(self) -> bool:
        return self._path is not None

    def authorized(self, headers: dict[bytes, bytes]) -> bool:
        """No token configured, or `Authorization: Bearer <token>` (compared in constant time)."""
        if self._token is None:
            return True
        auth = headers.get(b"authorization", b"")
        scheme, _, credentials = auth.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self._token)

    def render(self) -> bytes:
        if self._path is not None:
            reap_dead_workers(self._path)
        return generate_latest(self._registry)
