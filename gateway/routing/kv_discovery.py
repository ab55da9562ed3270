"""Where a backend's KV-cache events come from: the config's `kv_events`, or the engine's own answer.

Each engine announces its publisher over HTTP, in its own shape (`DISCOVERY`, by pool dialect):
- vLLM: `GET /kv_event_sources`, its `KVEventsConfig` per data-parallel rank
  (`{"0": {"enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "topic", ...}}`);
- SGLang: `GET /server_info`, whose `kv_events` describes the publisher (0.5.23:
  `{"publisher", "endpoint_host", "endpoint_port_base", "topic", "block_size", "dp_size",
  "replay_endpoint_port_base"?}`, rank r publishing on base + r), or, from servers without that key,
  the `kv_events_config` string it was started with (SGLang's defaults: `tcp://*:5557`, topic "").
A wildcard host (`tcp://*:5557`, `0.0.0.0`, `::`: where the engine binds) becomes the backend's own
host. A backend with several data-parallel ranks has one cache per rank behind one URL: its events
would not say which rank a request reaches, so it is not subscribed (approximate affinity).
Everything here is pure: a bad or unexpected answer is None, never an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

log = logging.getLogger("gateway.kv_events")

_WILDCARDS = ("*", "0.0.0.0", "[::]", "::", "")


@dataclass(frozen=True, slots=True)
class KvSource:
    """Where one backend's events come from."""

    endpoint: str
    topic: str = ""
    replay_endpoint: str | None = None


def discover_vllm(sources: Any, backend_url: str) -> KvSource | None:
    """A backend's source from vLLM's `GET /kv_event_sources` answer, or None (none, or several
    data-parallel ranks)."""
    if not isinstance(sources, Mapping):
        return None
    configs = [c for c in sources.values() if isinstance(c, Mapping) and c.get("enable_kv_cache_events")]
    configs = [
        c for c in configs if c.get("publisher", "zmq") == "zmq" and isinstance(c.get("endpoint"), str)
    ]
    if not configs or not _one_rank(len(configs), backend_url):
        return None
    config = configs[0]
    return _source(config["endpoint"], config.get("topic"), config.get("replay_endpoint"), backend_url)


def discover_sglang(info: Any, backend_url: str) -> KvSource | None:
    """A backend's source from SGLang's `GET /server_info` answer, or None (no ZMQ publisher, an
    address it cannot be reached at, or several data-parallel ranks)."""
    if not isinstance(info, Mapping):
        return None
    described = info.get("kv_events")
    if isinstance(described, Mapping):  # 0.5.23: what the engine bound, resolved by the engine
        found = _described(described)
    elif isinstance(info.get("kv_events_config"), str):  # older servers: the flag's JSON as given
        found = _flag(info["kv_events_config"], info.get("dp_size", 1))
    else:
        return None
    if found is None or not _one_rank(found[3], backend_url):
        return None
    return _source(*found[:3], backend_url)


#: an SGLang publisher as read: endpoint, topic, replay endpoint, data-parallel ranks
_Found = tuple[str, Any, Any, Any]


def _described(described: Mapping[str, Any]) -> _Found | None:
    """SGLang 0.5.23's `kv_events` descriptor (rank r publishes on the base ports + r)."""
    port, replay_port = described.get("endpoint_port_base"), described.get("replay_endpoint_port_base")
    host = described.get("endpoint_host")
    if described.get("publisher") != "zmq" or not _is_port(port) or not isinstance(host, str):
        return None
    host = _bracketed(host.strip("[]"))
    replay = f"tcp://{host}:{replay_port}" if _is_port(replay_port) else None
    return f"tcp://{host}:{port}", described.get("topic"), replay, described.get("dp_size", 1)


def _flag(text: str, ranks: Any) -> _Found | None:
    """The `--kv-events-config` JSON an SGLang server was started with, with SGLang's defaults."""
    try:
        config = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(config, Mapping) or config.get("publisher", "null") != "zmq":
        return None
    endpoint = config.get("endpoint", "tcp://*:5557")
    if not isinstance(endpoint, str):
        return None
    return endpoint, config.get("topic"), config.get("replay_endpoint"), ranks


def _one_rank(ranks: Any, backend_url: str) -> bool:
    """One data-parallel rank: one cache behind the URL (several: not used, see the docstring)."""
    if ranks == 1:
        return True
    log.warning("%s publishes KV events per data-parallel rank: not used for routing", backend_url)
    return False


#: per pool dialect: the path its engines announce their publisher at, and how to read the answer
DISCOVERY: Mapping[str, tuple[str, Callable[[Any, str], KvSource | None]]] = {
    "vllm": ("/kv_event_sources", discover_vllm),
    "sglang": ("/server_info", discover_sglang),
}


def _is_port(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536


def _source(endpoint: str, topic: Any, replay: Any, backend_url: str) -> KvSource | None:
    host = urlsplit(backend_url).hostname or "127.0.0.1"
    if not endpoint.startswith(("tcp://", "ipc://")):
        return None  # inproc:// and the like: not reachable from another process
    return KvSource(
        endpoint=_with_host(endpoint, host),
        topic=topic if isinstance(topic, str) else "",
        replay_endpoint=_with_host(replay, host) if isinstance(replay, str) else None,
    )


def _with_host(endpoint: str, host: str) -> str:
    """`tcp://*:5557` (a bind address) -> `tcp://<host>:5557` (where to connect)."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme != "tcp":
        return endpoint
    addr, _, port = rest.rpartition(":")
    if addr in _WILDCARDS:
        addr = _bracketed(host)
    return f"tcp://{addr}:{port}"


def _bracketed(host: str) -> str:
    """A host as an endpoint names it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host
