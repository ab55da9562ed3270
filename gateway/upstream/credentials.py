"""Engines started with `--api-key` (vLLM and SGLang both take it, as a second lock behind the
gateway): the bearer key the gateway sends them.

Per pool, or per backend (which wins), from an environment variable (`api_key_env`) or a mounted
secret file (`api_key_file`) — never the YAML itself. `read_keys` reads them at start-up and again on
every reload, so a rotated secret needs no restart; a source that is missing is a start-up error, or
a refused reload. A key is never logged and never in an admin answer (they name its source).
`KeyedTransport` puts the key on every request to its engine: generation, health probes, metrics,
KV-event discovery and warm-ups (SGLang guards every path but health and metrics; vLLM its `/v1`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gateway.core.settings import EngineKeySource, PoolSettings
from gateway.upstream.transport import JSON_HEADERS, Transport, UpstreamResponse

#: (pool keys, backend keys): each "Bearer <key>" by pool name and by backend name
EngineKeys = tuple[dict[str, str], dict[str, str]]


def read_keys(pools: Sequence[PoolSettings]) -> tuple[EngineKeys, list[str]]:
    """Every configured key, read now, and a line per source that cannot be read."""
    pool_keys: dict[str, str] = {}
    backend_keys: dict[str, str] = {}
    problems: list[str] = []
    for pool in pools:
        found = _read(pool, f"pools[{pool.name}]", problems)
        if found is not None:
            pool_keys[pool.name] = found
        for backend in pool.backends:
            found = _read(backend, f"backend {backend.name}", problems)
            if found is not None:
                backend_keys[backend.name] = found
    return (pool_keys, backend_keys), problems


def _read(source: EngineKeySource, where: str, problems: list[str]) -> str | None:
    if source.api_key_env is not None:
        value = os.environ.get(source.api_key_env, "").strip()
        if not value:
            problems.append(
                f"{where}: the environment variable {source.api_key_env} (api_key_env) is not set"
            )
            return None
        return "Bearer " + value
    if source.api_key_file is not None:
        try:
            value = Path(source.api_key_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            problems.append(
                f"{where}: the key file {source.api_key_file} (api_key_file) cannot be read: {exc.strerror}"
            )
            return None
        if not value:
            problems.append(f"{where}: the key file {source.api_key_file} (api_key_file) is empty")
            return None
        return "Bearer " + value
    return None


class KeyedTransport:
    """A transport that adds each engine's key (`authorization(url)`, None: none) to what it sends."""

    def __init__(self, inner: Transport, authorization: Callable[[str], str | None]) -> None:
        self._inner = inner
        self._authorization = authorization

    async def request(
        self, method: str, url: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> UpstreamResponse:
        key = self._authorization(url)
        if key is not None:
            headers = {**(headers if headers is not None else JSON_HEADERS), "authorization": key}
        return await self._inner.request(method, url, body, headers)

    async def aclose(self) -> None:
        await self._inner.aclose()
