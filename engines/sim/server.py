"""Serving one simulator with uvicorn (uvloop + httptools), plus the connection-level faults.

The protocol class is uvicorn's httptools protocol with two additions: with the `refuse` fault on, an
accepted connection is aborted at once (the client sees a reset, never a response); and every request
scope carries its transport under `extensions["sim.transport"]`, so the app can cut a connection
mid-stream. `--listen-delay` keeps the port closed (connection refused) for that many seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from engines.sim.app_base import SimApp
from engines.sim.config import SimConfig
from engines.sim.faults import FaultState
from engines.sim.sglang_app import SglangApp
from engines.sim.vllm_app import VllmApp

APPS: dict[str, type[SimApp]] = {"vllm": VllmApp, "sglang": SglangApp}


def build_app(cfg: SimConfig, clock: Callable[[], float] = time.perf_counter) -> SimApp:
    """The ASGI app of the configured dialect; its latencies are read on `clock`."""
    return APPS[cfg.engine](cfg, clock)


def protocol_class(faults: FaultState) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with the connection faults of `faults`."""

    class SimProtocol(HttpToolsProtocol):
        _refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if faults.refusing():
                self._refused = True
                transport.abort()
                return
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            if not self._refused:
                super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if not self._refused:
                super().data_received(data)

        def eof_received(self) -> None:
            if not self._refused:
                super().eof_received()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            scope: Any = self.scope
            scope["extensions"] = {"sim.transport": self.transport}

    return SimProtocol


def run(cfg: SimConfig) -> None:
    """Serve until SIGINT/SIGTERM (blocking)."""
    if cfg.listen_delay_s > 0:
        time.sleep(cfg.listen_delay_s)
    app = build_app(cfg)
    config = uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        loop="uvloop",
        http=protocol_class(app.engine.faults),
        lifespan="off",
        log_level=cfg.log_level,
        access_log=False,
        proxy_headers=False,  # one ASGI layer less on every resume; the sim is never behind a proxy
        backlog=4096,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=2,
    )
    logging.getLogger("engines.sim").info("%s simulator on %s:%d", cfg.engine, cfg.host, cfg.port)
    try:
        uvicorn.Server(config).run()
    finally:
        app.engine.stop_events()
