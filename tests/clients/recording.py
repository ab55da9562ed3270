"""httpx clients that remember what a library sent to the gateway and which pool answered.

The libraries build their own requests; handing them one of these clients (each takes an `httpx`
client) lets a test assert on the wire — e.g. that `response_format` was `json_object` and that the
answer came from the engine pool under test — without replacing anything.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

import httpx

# openai 3 (and so pydantic-ai) build on httpx2, which keeps httpx's API; older ones on httpx
try:
    _http: Any = importlib.import_module("httpx2")
except ImportError:
    _http = httpx


class Recorder:
    """Chat-completion request bodies sent, and the `x-gateway-pool` of each answer, in order."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.pools: list[str] = []

    def client(self) -> Any:
        """A sync client (`httpx2.Client`, else `httpx.Client`) with this recorder's hooks."""
        return _http.Client(
            timeout=30, event_hooks={"request": [self._request], "response": [self._response]}
        )

    def async_client(self) -> Any:
        """An async client (`httpx2.AsyncClient`, else `httpx.AsyncClient`) with this recorder's hooks."""

        async def on_request(request: Any) -> None:
            self._request(request)

        async def on_response(response: Any) -> None:
            self._response(response)

        return _http.AsyncClient(timeout=30, event_hooks={"request": [on_request], "response": [on_response]})

    def _request(self, request: Any) -> None:
        if request.url.path.endswith("/chat/completions"):
            self.bodies.append(json.loads(request.content))

    def _response(self, response: Any) -> None:
        if response.request.url.path.endswith("/chat/completions"):
            self.pools.append(response.headers.get("x-gateway-pool", ""))
