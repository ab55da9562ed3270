"""The uvicorn internals the gateway's edge is written against, checked by name and signature.

gateway/edge/http_cycle.py and http_guard.py subclass uvicorn's httptools protocol and its request
cycle, read their attributes and call two of its helpers; engines/sim/server.py subclasses the same
protocol. None of that is uvicorn's public API, so pyproject.toml pins uvicorn to one minor version.
Raising the pin means running this module first: a release that renamed or reshaped one of these
fails here, naming it, instead of leaving a gateway that silently loses its coalesced writes, its
disconnect callbacks or its head limits.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import logging
import tomllib
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from uvicorn.config import Config
from uvicorn.protocols import utils
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.server import ServerState

from tests.support import one_turn

ROOT = Path(__file__).resolve().parents[3]


def _parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def _uvicorn_requirement() -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (line,) = [d for d in project["dependencies"] if Requirement(d).name == "uvicorn"]
    return Requirement(line)


def test_uvicorn_is_pinned_to_one_minor_version_and_that_one_is_installed() -> None:
    requirement = _uvicorn_requirement()
    bounds = {spec.operator: Version(spec.version) for spec in requirement.specifier}
    assert set(bounds) == {">=", "<"}, f"uvicorn must be pinned as >=X.Y,<X.Y+1, not {requirement}"
    low, high = bounds[">="], bounds["<"]
    assert (high.major, high.minor) == (low.major, low.minor + 1), f"one minor version only: {requirement}"
    installed = importlib.metadata.version("uvicorn")
    assert requirement.specifier.contains(installed), f"uvicorn {installed} installed, {requirement} pinned"


def test_the_protocol_has_the_hooks_the_edge_overrides() -> None:
    protocol = httptools_impl.HttpToolsProtocol
    hooks = {
        "connection_made": ["self", "transport"],
        "connection_lost": ["self", "exc"],
        "data_received": ["self", "data"],
        "eof_received": ["self"],
        "on_message_begin": ["self"],
        "on_headers_complete": ["self"],
        "on_message_complete": ["self"],
    }
    for name, parameters in hooks.items():
        assert _parameters(getattr(protocol, name)) == parameters, f"HttpToolsProtocol.{name} changed"


async def test_a_protocol_has_the_attributes_the_edge_reads() -> None:
    config = Config(app=_app, loop="asyncio", http="httptools", lifespan="off")
    config.load()
    protocol = httptools_impl.HttpToolsProtocol(config, ServerState(), app_state={})
    for name in ("loop", "transport", "cycle", "scope"):
        assert hasattr(protocol, name), f"HttpToolsProtocol instances no longer have `{name}`"


async def test_headers_complete_builds_a_plain_request_response_cycle() -> None:
    """GatewayHttpProtocol swaps the class of the cycle uvicorn builds in `on_headers_complete`,
    and only when it is exactly `RequestResponseCycle`."""
    from gateway.edge.http_cycle import GatewayCycle, GatewayHttpProtocol

    config = Config(app=_app, loop="asyncio", http=GatewayHttpProtocol, lifespan="off")
    config.load()
    protocol = GatewayHttpProtocol(config, ServerState(), app_state={})
    transport = _Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(b"GET / HTTP/1.1\r\nhost: test\r\n\r\n")
    assert type(protocol.cycle) is GatewayCycle, "uvicorn no longer builds a RequestResponseCycle there"
    for _ in range(100):  # bounded: the app's task answers in a few loop turns
        if transport.writes:
            break
        await one_turn()
    assert transport.writes and transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    protocol.connection_lost(None)


def test_the_cycle_takes_and_keeps_what_the_edge_reads() -> None:
    cycle_class = httptools_impl.RequestResponseCycle
    assert _parameters(cycle_class.__init__) == [
        "self", "scope", "transport", "flow", "logger", "access_logger", "access_log",
        "default_headers", "message_event", "expect_100_continue", "keep_alive", "on_response",
    ], "RequestResponseCycle.__init__ changed"  # fmt: skip
    assert inspect.iscoroutinefunction(cycle_class.send) and _parameters(cycle_class.send) == [
        "self",
        "message",
    ]
    transport = _Transport()
    cycle = cycle_class(
        scope={"type": "http", "method": "GET", "http_version": "1.1", "path": "/"},  # type: ignore[typeddict-item]
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test.access"),
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )
    read = (
        "scope", "transport", "flow", "access_log", "access_logger", "default_headers", "keep_alive",
        "disconnected", "response_started", "response_complete", "waiting_for_100_continue",
        "chunked_encoding", "expected_content_length",
    )  # fmt: skip
    for name in read:
        assert hasattr(cycle, name), f"RequestResponseCycle instances no longer have `{name}`"
    assert hasattr(cycle.flow, "write_paused") and inspect.iscoroutinefunction(cycle.flow.drain)


def test_the_helpers_and_tables_the_edge_calls() -> None:
    assert _parameters(utils.get_client_addr) == ["scope"]
    assert _parameters(utils.get_path_with_query_string) == ["scope"]
    for status in HTTPStatus:
        line = httptools_impl.STATUS_LINE[status.value]
        assert line == f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode(), status


@pytest.mark.parametrize("key", ["loop", "http", "lifespan", "access_log", "server_header"])
def test_the_server_options_the_gateway_sets_exist(key: str) -> None:
    from gateway.server import uvicorn_kwargs
    from gateway.settings import parse_settings
    from tests.conftest import single_pool_config

    kwargs = uvicorn_kwargs(parse_settings(single_pool_config("vllm", ["http://127.0.0.1:9"]), environ={}))
    assert key in kwargs and set(kwargs) <= set(_parameters(Config.__init__))


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol: Any) -> None:
        pass


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})
