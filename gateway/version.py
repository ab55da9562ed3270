"""The gateway's version: the installed distribution's (`llm-gateway`)."""

from __future__ import annotations

import importlib.metadata


def version() -> str:
    """The installed version, or "unknown" when the package is run from a tree not installed."""
    try:
        return importlib.metadata.version("llm-gateway")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
