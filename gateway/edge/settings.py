"""Settings of the ASGI edge: the listening socket, workers, the body limit, logging."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.core.settings import SettingsModel

#: seconds a client's idle keep-alive connection stays open: longer than the load balancers in front
#: keep theirs (nginx and cloud balancers 60 s), so a balancer, not the gateway, closes one first
CLIENT_KEEPALIVE_S = 75


class ServerSettings(SettingsModel):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    workers: int = Field(1, ge=1, le=64)
    #: seconds in-flight streams may take to finish on shutdown before they are cancelled
    graceful_shutdown_s: float = Field(30.0, ge=0)
    #: largest request body accepted (413 above)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    #: serve the OpenAPI document and its interactive page (`/openapi.json`, `/docs`) to anyone;
    #: off, both are 404 (the document names every admin endpoint)
    api_docs: bool = False
    #: log level of the gateway's own logger
    log_level: Literal["debug", "info", "warning", "error"] = "info"
