"""KV-cache events in vLLM 0.32's and SGLang 0.5.23's wire formats, published over ZMQ.

Enabled with the engines' own flag, e.g.
`--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv"}'`.

**Transport** (`vllm/distributed/kv_events.py` and `sglang/srt/disaggregation/kv_events.py`,
`ZmqEventPublisher`): a PUB socket that binds when the endpoint has `*` or `::` (SGLang also
`0.0.0.0`, or `"bind": true`) or is `ipc://`/`inproc://`, and connects otherwise. Each message is
multipart `[topic, sequence as 8 bytes big-endian (0, 1, 2, ...), payload]`. With `replay_endpoint`,
a ROUTER socket answers `[identity, b"", start sequence (8 bytes big-endian)]` with every buffered
message from that sequence on, each `[identity, b"", topic, sequence, payload]`, then
`[identity, b"", b"", -1 as 8 signed bytes, b""]`; the last `buffer_steps` messages are kept.

**Payload** (msgspec's msgpack encoding of their structs, reproduced byte for byte): the batch is an
array `[timestamp (float64), [event, ...], rank]` (vLLM `data_parallel_rank`, SGLang `attn_dp_rank`;
0 here). Events are maps whose first key `type` is the struct's name, then its fields in declaration
order, fields at their `None` default left out (`omit_defaults`):

- vLLM `BlockStored`: `block_hashes`, `parent_block_hash`, `token_ids`, `block_size`, `lora_id`
  (null), `medium` ("GPU"), `lora_name` (null), `extra_keys` (one entry per block: null, or `[salt]`
  for a salted request's first block), `group_idx` (0), then `session_id` when the request had one.
  One event per request per step, for the blocks that became full. `BlockRemoved`: `block_hashes`
  (one hash: one event per evicted block), `medium`, `group_idx`. `AllBlocksCleared`: no fields.
- SGLang `BlockStored`: `block_hashes`, `parent_block_hash`, `token_ids`, `block_size` (the page
  size), `lora_id` (null), `medium` ("GPU"), then `cache_salt` when set. Consecutive events that chain
  (an event's parent is the previous one's last hash) are merged into one, as SGLang's
  `KVCacheEventRecorder.enqueue` does, and so are consecutive `BlockRemoved`.

Hashes: `block_hashes.py`. A batch is published per engine step that produced events (both engines
publish after each scheduler step), SGLang's first batch holds the `AllBlocksCleared` its radix
cache records when it starts.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import msgpack
import zmq

from engines.sim.block_hashes import HASH_ALGOS, HashAlgo, SglangBlockHasher, VllmBlockHasher
from engines.sim.prefix_cache import LoraRequest
from engines.sim.step_model import BlockEvent, ClearedBlocks, RemovedBlocks, StoredBlocks

Dialect = Literal["vllm", "sglang"]
END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIUM_GPU = "GPU"
_log = logging.getLogger("engines.sim.kv_events")

_VLLM_FIELDS = {
    "enable_kv_cache_events",
    "publisher",
    "endpoint",
    "replay_endpoint",
    "buffer_steps",
    "hwm",
    "max_queue_size",
    "topic",
}


class KvEventsConfigError(ValueError):
    """A `--kv-events-config` the engine would refuse."""


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    """The publisher settings, as each engine parses `--kv-events-config`."""

    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    bind: bool | None = None  # SGLang only

    @property
    def publishing(self) -> bool:
        """Whether a ZMQ publisher runs."""
        return self.publisher == "zmq"

    def source(self, endpoint: str) -> dict[str, Any]:
        """vLLM's `KVEventsConfig` as `GET /kv_event_sources` serves it (the resolved endpoint)."""
        return {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": endpoint,
            "replay_endpoint": self.replay_endpoint,
            "buffer_steps": self.buffer_steps,
            "hwm": self.hwm,
            "max_queue_size": self.max_queue_size,
            "topic": self.topic,
        }


def parse_kv_events_config(text: str, dialect: Dialect) -> KvEventsConfig:
    """Parse the flag's JSON like the engine: vLLM (a pydantic dataclass forbidding extra fields;
    `publisher` defaults to "zmq" when events are enabled, else "null") or SGLang (a pydantic model
    that ignores unknown keys such as `enable_kv_cache_events`; `publisher` defaults to "null")."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KvEventsConfigError(f"--kv-events-config is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise KvEventsConfigError("--kv-events-config must be a JSON object")
    if dialect == "vllm":
        extra = sorted(set(raw) - _VLLM_FIELDS)
        if extra:
            raise KvEventsConfigError(f"--kv-events-config: unknown field(s) {', '.join(extra)}")
        enabled = bool(raw.get("enable_kv_cache_events", False))
        publisher = raw.get("publisher") or ("zmq" if enabled else "null")
        if not enabled:
            publisher = "null"  # vLLM's EventPublisherFactory: disabled events -> NullEventPublisher
    else:
        if raw.get("format", "default") != "default":
            raise KvEventsConfigError('--kv-events-config: only "format": "default" is simulated')
        publisher = raw.get("publisher", "null")
        enabled = publisher == "zmq"
    if publisher not in ("zmq", "null"):
        raise KvEventsConfigError(f"Unknown event publisher '{publisher}'")
    try:
        return KvEventsConfig(
            enable_kv_cache_events=enabled,
            publisher=str(publisher),
            endpoint=str(raw.get("endpoint", "tcp://*:5557")),
            replay_endpoint=raw.get("replay_endpoint"),
            buffer_steps=int(raw.get("buffer_steps", 10_000)),
            hwm=int(raw.get("hwm", 100_000)),
            max_queue_size=int(raw.get("max_queue_size", 100_000)),
            topic=str(raw.get("topic", "")),
            bind=raw.get("bind") if dialect == "sglang" else None,
        )
    except (TypeError, ValueError) as exc:
        raise KvEventsConfigError(f"--kv-events-config: {exc}") from None


def should_bind(endpoint: str, dialect: Dialect, bind: bool | None = None) -> bool:
    """Bind or connect the PUB socket, by each engine's rule."""
    if bind is not None and dialect == "sglang":
        return bind
    wildcard = "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))
    return wildcard or (dialect == "sglang" and "0.0.0.0" in endpoint)


def vllm_block_stored(
    hashes: list[Any],
    parent: Any,
    token_ids: list[int],
    block_size: int,
    *,
    cache_salt: str | None = None,
    first_block: bool = False,
    session_id: str | None = None,
    lora: LoraRequest | None = None,
) -> dict[str, Any]:
    """vLLM's `BlockStored` map (`first_block`: the run starts at the request's first block, the
    only one a `cache_salt` enters). A LoRA adapter's blocks carry its id and name, and every
    block's extra keys start with its name (vLLM 0.32: `[["tiny-lora"], ...]`)."""
    head = [lora.name] if lora is not None else []
    out: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": token_ids,
        "block_size": block_size,
        "lora_id": lora.id if lora is not None else None,
        "medium": MEDIUM_GPU,
        "lora_name": lora.name if lora is not None else None,
        "extra_keys": [
            [*head, cache_salt] if i == 0 and first_block and cache_salt else (head or None)
            for i in range(len(hashes))
        ],
        "group_idx": 0,
    }
    if session_id is not None:
        out["session_id"] = session_id
    return out


def vllm_block_removed(block_hash: Any) -> dict[str, Any]:
    """vLLM's `BlockRemoved` map (one per evicted block)."""
    return {"type": "BlockRemoved", "block_hashes": [block_hash], "medium": MEDIUM_GPU, "group_idx": 0}


def sglang_block_stored(
    hashes: list[int],
    parent: int | None,
    token_ids: list[int],
    page_size: int,
    *,
    cache_salt: str | None = None,
) -> dict[str, Any]:
    """SGLang's `BlockStored` map."""
    out: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": token_ids,
        "block_size": page_size,
        "lora_id": None,
        "medium": MEDIUM_GPU,
    }
    if cache_salt is not None:
        out["cache_salt"] = cache_salt
    return out


def sglang_block_removed(hashes: list[int]) -> dict[str, Any]:
    """SGLang's `BlockRemoved` map."""
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": MEDIUM_GPU}


ALL_BLOCKS_CLEARED: dict[str, Any] = {"type": "AllBlocksCleared"}


def pack_batch(ts: float, events: list[dict[str, Any]], rank: int = 0) -> bytes:
    """The msgpack batch `[ts, events, rank]`, byte for byte what msgspec writes for the engines'
    `KVEventBatch` (maps in insertion order, ints in their shortest form, floats as float64)."""
    packed: bytes = msgpack.packb([ts, events, rank], use_bin_type=True)
    return packed


class EventEncoder:
    """Turns the engine's block events into one dialect's msgpack payloads (keeps each cached
    block's digest, to hash its children and to name it when it is removed)."""

    def __init__(
        self, dialect: Dialect, block_size: int, hash_algo: HashAlgo = "sha256", *, int_hashes: bool = True
    ) -> None:
        if hash_algo not in HASH_ALGOS:
            raise KvEventsConfigError(f"--prefix-caching-hash-algo {hash_algo} is not simulated")
        self.dialect = dialect
        self.block_size = block_size
        self.hasher: VllmBlockHasher | SglangBlockHasher = (
            VllmBlockHasher(hash_algo, int_hashes=int_hashes) if dialect == "vllm" else SglangBlockHasher()
        )
        self._digests: dict[int, bytes] = {}

    def events(self, events: list[BlockEvent]) -> list[dict[str, Any]]:
        """The wire events (maps) for one batch."""
        out: list[dict[str, Any]] = []
        for ev in events:
            if isinstance(ev, StoredBlocks):
                stored = self._stored(ev)
                if stored is not None:
                    self._append(out, stored)
            elif isinstance(ev, RemovedBlocks):
                for removed in self._removed(ev):
                    self._append(out, removed)
            elif isinstance(ev, ClearedBlocks):
                self._digests.clear()
                out.append(dict(ALL_BLOCKS_CLEARED))
        return out

    def payload(self, events: list[dict[str, Any]], ts: float | None = None) -> bytes:
        """The msgpack batch `[ts, events, rank]`."""
        return pack_batch(time.time() if ts is None else ts, events)

    def _stored(self, ev: StoredBlocks) -> dict[str, Any] | None:
        hasher = self.hasher
        bs = self.block_size
        parent = self._digests.get(ev.parent) if ev.parent is not None else None
        if ev.parent is not None and parent is None:
            _log.debug("stored blocks under an unknown parent; skipped")
            return None
        hashes: list[Any] = []
        digest = parent
        lora = (ev.lora.name, ev.lora.path) if ev.lora is not None else None
        for i, key in enumerate(ev.keys):
            digest = hasher.digest(digest, ev.token_ids[i * bs : (i + 1) * bs], ev.cache_salt, lora)
            self._digests[key] = digest
            hashes.append(hasher.external(digest))
        parent_hash = hasher.external(parent) if parent is not None else None
        if self.dialect == "vllm":
            return vllm_block_stored(
                hashes,
                parent_hash,
                list(ev.token_ids),
                bs,
                cache_salt=ev.cache_salt,
                first_block=ev.parent is None,
                session_id=ev.session_id,
                lora=ev.lora,
            )
        assert not isinstance(parent_hash, bytes)
        return sglang_block_stored(hashes, parent_hash, list(ev.token_ids), bs, cache_salt=ev.cache_salt)

    def _removed(self, ev: RemovedBlocks) -> list[dict[str, Any]]:
        hashes = []
        for key in ev.keys:
            digest = self._digests.pop(key, None)
            if digest is not None:
                hashes.append(self.hasher.external(digest))
        if not hashes:
            return []
        if self.dialect == "vllm":
            return [
                {"type": "BlockRemoved", "block_hashes": [h], "medium": MEDIUM_GPU, "group_idx": 0}
                for h in hashes
            ]
        return [{"type": "BlockRemoved", "block_hashes": hashes, "medium": MEDIUM_GPU}]

    def _append(self, out: list[dict[str, Any]], ev: dict[str, Any]) -> None:
        """SGLang merges an event into the previous one when they continue each other."""
        if self.dialect == "sglang" and out:
            tail = out[-1]
            if tail["type"] == ev["type"] == "BlockRemoved" and tail["medium"] == ev["medium"]:
                tail["block_hashes"].extend(ev["block_hashes"])
                return
            if (
                tail["type"] == ev["type"] == "BlockStored"
                and tail["block_hashes"]
                and ev["parent_block_hash"] == tail["block_hashes"][-1]
                and all(tail.get(k) == ev.get(k) for k in ("medium", "lora_id", "block_size", "cache_salt"))
            ):
                tail["block_hashes"].extend(ev["block_hashes"])
                tail["token_ids"].extend(ev["token_ids"])
                return
        out.append(ev)


class KvEventPublisher:
    """The ZMQ PUB (and optional replay ROUTER) sockets, owned by one thread as in the engines.

    `publish(events)` (from the event loop) queues a batch; the thread encodes it, sends it with the
    next sequence number and keeps it for replay. `endpoint` is the bound address (a `tcp://*:0`
    endpoint binds a free port, reported here and by `/kv_event_sources`)."""

    def __init__(self, cfg: KvEventsConfig, encoder: EventEncoder, *, host: str = "127.0.0.1") -> None:
        self.cfg = cfg
        self.encoder = encoder
        self._queue: queue.Queue[list[BlockEvent] | None] = queue.Queue(maxsize=cfg.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=max(1, cfg.buffer_steps))
        self._topic = cfg.topic.encode("utf-8")
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(cfg.hwm)
        self.endpoint = cfg.endpoint
        if should_bind(cfg.endpoint, encoder.dialect, cfg.bind):
            self.endpoint = self._bind(self._pub, cfg.endpoint, host)
        else:
            self._pub.connect(cfg.endpoint)
        self._replay: zmq.Socket[bytes] | None = None
        self.replay_endpoint = cfg.replay_endpoint
        if cfg.replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self.replay_endpoint = self._bind(self._replay, cfg.replay_endpoint, host)
        self.sent = 0
        self._running = True
        self._thread = threading.Thread(target=self._serve, name="kv-events", daemon=True)
        self._thread.start()

    @staticmethod
    def _bind(sock: zmq.Socket[bytes], endpoint: str, host: str) -> str:
        if not endpoint.endswith(":0"):
            sock.bind(endpoint)
            return endpoint
        sock.bind(endpoint)
        port = sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1]
        shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        return f"tcp://{shown}:{port}"

    def publish(self, events: list[BlockEvent]) -> None:
        """Queue one batch (never blocks; a full queue drops it, as the PUB socket would)."""
        if events and self._running:
            try:
                self._queue.put_nowait(events)
            except queue.Full:
                _log.warning("KV event queue full; batch dropped")

    def close(self, timeout: float = 1.0) -> None:
        """Send what is queued, then close the sockets."""
        if not self._running:
            return
        self._running = False
        self._queue.put(None)
        self._thread.join(timeout)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def _serve(self) -> None:
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._answer_replay()
            try:
                batch = self._queue.get(timeout=0.05)
            except queue.Empty:
                if not self._running:
                    return
                continue
            if batch is None:
                return
            wire = self.encoder.events(batch)
            if not wire:
                continue
            payload = self.encoder.payload(wire)
            seq = self.sent
            self.sent += 1
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            self._buffer.append((seq, payload))

    def _answer_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            _log.warning("invalid replay request: %d frames", len(frames))
            return
        client, _, start_bytes = frames
        start = int.from_bytes(start_bytes, "big")
        for seq, payload in list(self._buffer):
            if seq >= start:
                self._replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))
