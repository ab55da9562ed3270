"""A tiny KV-event publisher in vLLM 0.32's exact wire format, for the consumer's tests.

What `vllm/distributed/kv_events.py`'s `ZmqEventPublisher` sends: PUB `[topic, seq (8 bytes,
big-endian), msgpack([ts, [event maps], dp_rank])]`, events tagged maps (`type` first, then the fields
in declaration order, fields at their default omitted); an optional ROUTER replay socket answering
`[identity, b"", start]` with `[identity, b"", topic, seq, payload]` per buffered batch and
`[identity, b"", b"", -1, b""]`. Block hashes are vLLM's default int hashes (the last 8 bytes of
SHA-256 over the parent and the tokens; the consumer treats them as opaque).

The socket is an XPUB, which a SUB cannot tell from a PUB (same wire), so that a test can wait until
every routing process has subscribed (`wait_subscribers`) instead of sleeping: ZMQ drops what a PUB
sends before a subscription has arrived.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import httpx
import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def vllm_hashes(tokens: Sequence[int], block_size: int, parent: int | None = None) -> list[int]:
    out: list[int] = []
    h = parent
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size : (i + 1) * block_size]
        digest = hashlib.sha256(repr((h, tuple(block))).encode()).digest()
        h = int.from_bytes(digest, "big") & ((1 << 64) - 1)
        out.append(h)
    return out


def stored(tokens: Sequence[int], block_size: int = 16, start: int = 0) -> dict[str, Any]:
    """vLLM's `BlockStored` for blocks `start..` of `tokens` (full blocks only)."""
    full = len(tokens) // block_size * block_size
    hashes = vllm_hashes(tokens[:full], block_size)
    return {
        "type": "BlockStored",
        "block_hashes": hashes[start:],
        "parent_block_hash": hashes[start - 1] if start else None,
        "token_ids": list(tokens[start * block_size : full]),
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None] * (len(hashes) - start),
        "group_idx": 0,
    }


def removed(hashes: Sequence[int]) -> list[dict[str, Any]]:
    """vLLM's `BlockRemoved`: one event per evicted block."""
    return [{"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": 0} for h in hashes]


CLEARED: dict[str, Any] = {"type": "AllBlocksCleared"}


class Publisher:
    """PUB (+ replay ROUTER) bound on loopback ports chosen by the OS."""

    def __init__(
        self, topic: str = "kv", *, replay: bool = False, buffer_steps: int = 10_000, port: int | None = None
    ) -> None:
        self.ctx = zmq.Context()
        self.topic = topic.encode()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSER, 1)  # every (un)subscription, one per SUB socket
        self.subscribers = 0
        #: subscriptions received in all (a new connection's shows here even while the publisher has
        #: not yet seen the old one's end, which keeps `subscribers` unchanged)
        self.subscriptions_total = 0
        if port is None:
            port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        else:  # the same address again: an engine restarted in place
            self.pub.bind(f"tcp://127.0.0.1:{port}")
        self.port = port
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.replay_endpoint: str | None = None
        self._running = True
        self._thread: threading.Thread | None = None
        if replay:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            rport = self.router.bind_to_random_port("tcp://127.0.0.1")
            self.replay_endpoint = f"tcp://127.0.0.1:{rport}"
            self._thread = threading.Thread(target=self._serve_replay, daemon=True)
            self._thread.start()

    def publish(self, events: list[dict[str, Any]], *, send: bool = True) -> int:
        """One batch; `send=False` buffers it for replay without sending it (a lost message)."""
        payload = msgpack.packb([time.time(), events, 0], use_bin_type=True)
        seq = self.seq
        self.seq += 1
        if send:
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        self.buffer.append((seq, payload))
        return seq

    def poll_subscriptions(self) -> int:
        """The SUB sockets subscribed now, from the (un)subscriptions received so far (no wait)."""
        while self.pub.poll(0):
            msg = self.pub.recv()
            if msg[:1] == b"\x01":
                self.subscribers += 1
                self.subscriptions_total += 1
            elif msg[:1] == b"\x00":
                self.subscribers -= 1
        return self.subscribers

    def wait_subscribers(self, n: int, timeout: float = 10.0) -> None:
        """Until exactly `n` SUB sockets are subscribed (AssertionError after `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while self.poll_subscriptions() != n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.subscribers} subscribers after {timeout}s, expected {n}")
            self.pub.poll(20)

    def restart(self) -> None:
        """The engine restarted: its sequence starts over, its buffer is empty."""
        self.seq = 0
        self.buffer.clear()

    def _serve_replay(self) -> None:
        while self._running:
            if not self.router.poll(50):
                continue
            client, _, start = self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, payload in list(self.buffer):
                if seq >= first:
                    self.router.send_multipart((client, b"", self.topic, seq.to_bytes(8, "big"), payload))
            self.router.send_multipart((client, b"", b"", END_SEQ, b""))

    def close(self) -> None:
        self._running = False
        if self._thread is not None:
            self._thread.join(2)
            self.router.close(0)
        self.pub.close(0)
        self.ctx.term()


class EngineEvents:
    """What a vLLM simulator's engine would publish for the requests it served, on `publisher`.

    The simulators do not publish KV events yet; this stands in for their publisher without
    inventing the tokens: it takes the body the simulator received (`GET /sim/requests`) and has
    the simulator tokenize it (`POST /tokenize`, as vLLM's does for chat messages), so the token ids
    are the engine's own, not the test's idea of them. Like vLLM, it announces each full block once:
    a prompt whose first blocks are already cached announces only the rest, under its parent's hash.
    """

    def __init__(self, base_url: str, publisher: Publisher, block_size: int = 16) -> None:
        self.base_url = base_url
        self.publisher = publisher
        self.block_size = block_size
        self.announced: set[int] = set()
        self._http = httpx.Client(base_url=base_url, timeout=5)

    def close(self) -> None:
        self._http.close()

    def prompt_ids(self, body: dict[str, Any]) -> list[int]:
        """The simulator's token ids for a chat body as it received it."""
        ask = {k: body[k] for k in ("messages", "tools", "add_generation_prompt") if k in body}
        r = self._http.post("/tokenize", json=ask)
        r.raise_for_status()
        return list(r.json()["tokens"])

    def last_body(self) -> dict[str, Any]:
        r = self._http.get("/sim/requests", params={"limit": 1})
        r.raise_for_status()
        body: dict[str, Any] = r.json()["requests"][-1]["body"]
        return body

    def announce(self, body: dict[str, Any] | None = None) -> int:
        """Announce the new full blocks of `body` (default: the last request the simulator
        received); returns how many were announced."""
        ids = self.prompt_ids(body if body is not None else self.last_body())
        hashes = vllm_hashes(ids, self.block_size)
        start = next((i for i, h in enumerate(hashes) if h not in self.announced), len(hashes))
        if start == len(hashes):
            return 0
        self.publisher.publish([stored(ids, self.block_size, start)])
        self.announced.update(hashes[start:])
        return len(hashes) - start
