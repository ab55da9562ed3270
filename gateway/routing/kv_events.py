"""The engines' KV-cache event streams, consumed: one ZMQ SUB socket per backend per routing process.

Every routing process subscribes to every backend's stream (they all hear the same events, so they
agree on what each engine holds) and feeds `policies.kv_index.KvIndex` from its event loop
(`zmq.asyncio`, nothing blocks). The wire format is `engines.kv_events`.

Per backend (`_Stream.run`):
- connect a SUB socket to the engine's publisher (the engine binds `tcp://*:5557`), subscribe to its
  topic, with ZMTP heartbeats so a dead peer is noticed; ZMQ reconnects by itself;
- a socket monitor says when the publisher is connected: only then is the stream live
  (`KvIndex.set_live`); a disconnect makes the backend fall back to approximate affinity at once; a
  reconnection to a publisher heard before is live only from its next message, whose sequence says
  whether the engine restarted (its cache is then empty) or the connection only dropped;
- sequence numbers: the first message after connecting, or a gap, is filled from the engine's replay
  socket when one is configured (vLLM's `replay_endpoint`: a ROUTER that sends the buffered batches
  from a sequence on); a gap that cannot be filled is `KvIndex.gap` (forget, distrust for a while); a
  sequence that goes back (the engine restarted, its counter too) is `KvIndex.cleared`;
- a stream silent for `CATCH_UP_AFTER_S` after a message (or its connection) asks the replay socket
  once for anything after its last sequence: a batch the publisher dropped (a subscription still on
  its way, ZMQ's "slow joiner", or a full send queue) is learnt then, not at the engine's next batch.
Nothing here can fail a request: every error is logged (rate-limited) and the loop goes on; the index
only ever loses knowledge, and routing without it is the approximate affinity.

Discovery (`KvEventSync`, for pools with `kv_event_discovery`): each engine is asked where it
publishes, in its own dialect (`gateway.routing.kv_discovery`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from engines.kv_events import END_SEQ, DecodeError, KvEvent, Removed, Stored, decode_batch, sequence
from gateway.core.fleet import Fleet
from gateway.core.settings import PoolSettings
from gateway.routing.kv_discovery import DISCOVERY, KvSource
from policies.kv_index import KvIndex

log = logging.getLogger("gateway.kv_events")

_MONITORED = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_MONITOR_STOPPED
#: messages handled before yielding to the event loop (a replay may bring thousands)
_YIELD_EVERY = 64
#: silence after which a stream with a replay socket asks it, once, for batches it did not hear: an
#: idle engine's last batches are not followed by another that would reveal the gap
CATCH_UP_AFTER_S = 2.0


class StreamReport(NamedTuple):
    """One backend's event stream as the metrics show it (`KvEventSubscriber.report`)."""

    connected: bool
    usable: bool
    blocks: int
    events: int
    gaps: int
    restarts: int
    errors: int
    anchored: int  # stores under an unknown parent placed on a routed prompt
    orphans: int  # stores under an unknown parent skipped


#: `KvIndex.stats()` of a backend the index has no stream for
_NOT_ATTACHED: Mapping[str, int | bool] = {"blocks": 0, "orphans": 0, "anchored": 0, "usable": False}


class KvEventSubscriber:
    """The event streams of the backends `watch`ed, feeding one index. Start and stop on the event
    loop that routes; `clock` is the logical clock handed to the index (seconds)."""

    def __init__(
        self,
        index: KvIndex,
        *,
        clock: Callable[[], float] = time.monotonic,
        heartbeat_s: float = 1.0,
        replay_timeout_s: float = 2.0,
        catch_up_after_s: float = CATCH_UP_AFTER_S,
    ) -> None:
        self.index = index
        self._clock = clock
        self._heartbeat_ms = max(1, int(heartbeat_s * 1000))
        self._replay_timeout_s = replay_timeout_s
        self._catch_up_ms = max(1, int(catch_up_after_s * 1000))
        self._ctx: zmq.asyncio.Context | None = None  # made on the first watch (an I/O thread)
        self._streams: dict[str, tuple[KvSource, asyncio.Task[None], _Stream]] = {}

    @property
    def watched(self) -> Mapping[str, KvSource]:
        return {name: entry[0] for name, entry in self._streams.items()}

    def report(self) -> dict[str, StreamReport]:
        """Per watched backend: its stream's counters and the index's view of it (for the metrics)."""
        index = self.index
        index.tick(self._clock())
        stats = index.stats()
        out = {}
        for name, (_, _, st) in self._streams.items():
            seen = stats.get(name, _NOT_ATTACHED)
            out[name] = StreamReport(
                st.connected,
                bool(seen["usable"]),
                int(seen["blocks"]),
                st.events,
                st.gaps,
                st.restarts,
                st.errors,
                int(seen["anchored"]),
                int(seen["orphans"]),
            )
        return out

    def stream(self, backend: str) -> _Stream | None:
        entry = self._streams.get(backend)
        return entry[2] if entry is not None else None

    def watch(self, backend: str, source: KvSource) -> None:
        """Subscribe to `backend`'s events (again, if its source changed)."""
        current = self._streams.get(backend)
        if current is not None:
            if current[0] == source:
                return
            self.unwatch(backend)
        self.index.attach(backend)
        stream = _Stream(self, backend, source)
        task = asyncio.create_task(stream.run(), name=f"kv-events-{backend}")
        self._streams[backend] = (source, task, stream)

    def unwatch(self, backend: str) -> None:
        """Stop listening to `backend` and forget its blocks."""
        entry = self._streams.pop(backend, None)
        if entry is not None:
            entry[1].cancel()
        self.index.detach(backend)

    async def stop(self) -> None:
        tasks = [entry[1] for entry in self._streams.values()]
        for name in list(self._streams):
            self.unwatch(name)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
        sock.setsockopt(zmq.HEARTBEAT_IVL, self._heartbeat_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * self._heartbeat_ms)
        sock.setsockopt(zmq.HEARTBEAT_TTL, 3 * self._heartbeat_ms)
        return sock


class _Stream:
    """One backend's stream: sockets, sequence and the counters an operator reads."""

    def __init__(self, owner: KvEventSubscriber, backend: str, source: KvSource) -> None:
        self.owner = owner
        self.backend = backend
        self.source = source
        self.last: int | None = None  # last sequence applied
        self.heard = -1  # last sequence received on the SUB socket (`last` may be ahead: a catch-up)
        self.messages = 0
        self.events = 0
        self.skipped = 0  # events of another tier or group, or malformed
        self.gaps = 0
        self.replayed = 0
        self.restarts = 0
        self.errors = 0
        self.connected = False
        self._reconnected = False
        self._logged_at = 0.0

    async def run(self) -> None:
        index = self.owner.index
        while True:
            sub = self.owner._socket(zmq.SUB)
            monitor = sub.get_monitor_socket(_MONITORED)
            try:
                sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
                sub.connect(self.source.endpoint)
                await self._consume(sub, monitor)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._error("stream failed", exc)
                await asyncio.sleep(1.0)
            finally:
                self.connected = False
                index.set_live(self.backend, False)
                with contextlib.suppress(Exception):
                    sub.disable_monitor()
                monitor.close(linger=0)
                sub.close(linger=0)

    async def _consume(self, sub: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket) -> None:
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        index = self.owner.index
        silence_ms = self.owner._catch_up_ms if self.source.replay_endpoint else None
        armed = False  # a message (or the connection) since the last catch-up
        while True:
            ready = dict(await poller.poll(silence_ms if armed else None))
            if not ready:
                armed = False
                await self._catch_up()
                continue
            armed = True
            if monitor in ready:
                event = parse_monitor_message(await monitor.recv_multipart())
                kind = event["event"]
                if kind == zmq.EVENT_CONNECTED:
                    self.connected = True
                    self._reconnected = True
                    # Reconnected to a publisher heard before: it may be a restarted engine with an
                    # empty cache, which only its next message's sequence tells. Until then its
                    # blocks are not trusted (approximate affinity), so a restart never routes
                    # requests to a cache that is gone.
                    index.set_live(self.backend, self.last is None)
                elif kind == zmq.EVENT_DISCONNECTED:
                    self.connected = False
                    index.set_live(self.backend, False)
                elif kind == zmq.EVENT_MONITOR_STOPPED:
                    return
            if sub in ready:
                for handled in range(_YIELD_EVERY):
                    try:
                        frames = await sub.recv_multipart(flags=zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    await self._message(frames)
                    if handled == _YIELD_EVERY - 1:
                        await asyncio.sleep(0)

    async def _message(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            self._error(f"message of {len(frames)} frames")
            return
        _, seq_frame, payload = frames
        seq = sequence(seq_frame)
        heard, self.heard = self.heard, seq
        index = self.owner.index
        index.tick(self.owner._clock())
        last = self.last
        if last is not None and seq <= last:
            if not self._reconnected and (seq == last or seq > heard):
                return  # a duplicate, or a batch a catch-up already applied
            # the sequence went back: the publisher (the engine) restarted with an empty cache
            self.restarts += 1
            index.cleared(self.backend)
            last = self.last = None
        if self._reconnected:
            self._reconnected = False
            index.set_live(self.backend, True)
        expected = 0 if last is None else last + 1
        if seq > expected and not (last is None and not self.source.replay_endpoint):
            # missed messages (or joined late): fill them in from the replay buffer when there is one
            filled = (
                await self._replay(expected, seq, strict=last is not None)
                if self.source.replay_endpoint
                else False
            )
            if not filled and last is not None:
                self.gaps += 1
                index.gap(self.backend)
        self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        index = self.owner.index
        try:
            batch = decode_batch(payload)
        except DecodeError as exc:
            self._error("undecodable batch", exc)
            self.last = seq
            return
        backend = self.backend
        try:
            apply_events(index, backend, batch.events)
        except Exception as exc:  # a defect, not the engine's: the batch is half applied
            self._error("batch not applied", exc)
            index.gap(backend)
        if not batch.events:
            index.removed(backend, ())  # still a sign of life
        self.messages += 1
        self.events += len(batch.events)
        self.skipped += batch.skipped
        self.last = seq

    async def _catch_up(self) -> None:
        """The batches after the last one applied that the replay buffer holds. Not while a
        reconnection to a publisher heard before is unconfirmed: the next live message's sequence
        says whether the engine restarted, and a catch-up ahead of it would hide that."""
        if not self.connected or (self._reconnected and self.last is not None):
            return
        fresh = self.last is None
        await self._replay(0 if self.last is None else self.last + 1, None, strict=not fresh)
        if fresh and self.last is not None:
            self._reconnected = False  # the replayed sequence is the stream's, as a first message's is

    async def _replay(self, start: int, until: int | None, *, strict: bool) -> bool:
        """Ask the replay socket for the batches from `start` up to `until` (excluded: it is being
        handled; None: all it holds); True when every one of them was applied. Not `strict` (joining a
        running engine): the buffer's oldest batch may be later than `start`, and it is taken from
        there."""
        endpoint = self.source.replay_endpoint
        assert endpoint is not None
        sock = self.owner._socket(zmq.DEALER)
        want = start
        try:
            sock.connect(endpoint)
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = asyncio.get_running_loop().time() + self.owner._replay_timeout_s
            handled = 0
            while True:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0 or not await sock.poll(int(left * 1000)):
                    self._error("replay timed out")
                    return False
                frames = await sock.recv_multipart()
                if len(frames) != 4:
                    continue
                seq = sequence(frames[2])
                if seq == END_SEQ:
                    return until is None or want >= until
                if seq < want or (until is not None and seq >= until):
                    continue
                if not strict and handled == 0:
                    want = seq
                if seq != want:
                    return False  # the buffer no longer holds `want`
                self._apply(seq, frames[3])
                self.replayed += 1
                want = seq + 1
                handled += 1
                if handled % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)
        except Exception as exc:
            self._error("replay failed", exc)
            return False
        finally:
            sock.close(linger=0)

    def _error(self, what: str, exc: BaseException | None = None) -> None:
        self.errors += 1
        now = time.monotonic()
        if now - self._logged_at >= 10.0:
            self._logged_at = now
            log.warning("KV events of %s: %s%s", self.backend, what, f": {exc}" if exc else "")


def apply_events(index: KvIndex, backend: str, events: Sequence[KvEvent]) -> None:
    """One decoded batch of `backend`'s events into the index, in order."""
    for event in events:
        if isinstance(event, Stored):
            index.stored(
                backend,
                event.block_hashes,
                event.parent,
                event.token_ids,
                event.block_size,
                event.extra_keys,
                event.lora,
            )
        elif isinstance(event, Removed):
            index.removed(backend, event.block_hashes)
        else:
            index.cleared(backend)


#: `GET url` -> the decoded JSON answer, or None (handed in by the root: it owns the transport)
FetchJson = Callable[[str], Awaitable[Any]]


def configured_sources(pools: Sequence[PoolSettings]) -> dict[str, KvSource]:
    """The sources the config names (`backends[].kv_events`), by backend."""
    return {
        b.name: KvSource(b.kv_events.endpoint, b.kv_events.topic, b.kv_events.replay_endpoint)
        for p in pools
        for b in p.backends
        if b.kv_events is not None
    }


class KvEventSync:
    """Keeps the subscriber's streams equal to the fleet's backends, every `interval_s`: the source the
    config names for a backend, or for pools with `kv_event_discovery` the one its engine announces
    (vLLM's `GET /kv_event_sources`, SGLang's `GET /server_info`; asked again every `rediscover_s` while
    it has none, and when its URL changes). Backends that leave the fleet (the admin API, a reload) are
    unwatched and their blocks forgotten; a drained backend stays watched (its cache is still there when
    it is undrained). The config is read through `pools` on every pass, so a reload takes effect."""

    def __init__(
        self,
        subscriber: KvEventSubscriber,
        backends: Callable[[], Mapping[str, tuple[str, str]]],
        pools: Callable[[], Sequence[PoolSettings]],
        fetch_json: FetchJson,
        *,
        interval_s: float = 1.0,
        rediscover_s: float = 30.0,
        fetch_timeout_s: float = 3.0,
    ) -> None:
        self.subscriber = subscriber
        self._backends = backends  # name -> (pool, url)
        self._pools = pools
        self._fetch = fetch_json
        self._interval = interval_s
        self._rediscover = rediscover_s
        self._fetch_timeout = fetch_timeout_s
        self._asked: dict[str, tuple[str, float]] = {}  # backend -> (url, when) of the last discovery
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.sync()
        self._task = asyncio.create_task(self._loop(), name="kv-events-sync")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.subscriber.stop()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.sync()
            except Exception:
                log.exception("KV event sources sync failed")

    async def sync(self) -> None:
        backends = self._backends()
        pools = self._pools()
        configured = configured_sources(pools)
        discovery = {p.name: DISCOVERY[p.dialect] for p in pools if p.kv_event_discovery}
        sub = self.subscriber
        for name in [n for n in sub.watched if n not in backends]:
            sub.unwatch(name)
        for name in [n for n in self._asked if n not in backends]:
            del self._asked[name]
        now = time.monotonic()
        for name, (pool, url) in backends.items():
            source = configured.get(name)
            if source is None and pool in discovery:
                path, read = discovery[pool]
                asked = self._asked.get(name)
                if (
                    asked is not None
                    and asked[0] == url
                    and (name in sub.watched or now - asked[1] < self._rediscover)
                ):
                    continue  # discovered already, or asked recently in vain
                self._asked[name] = (url, now)
                try:
                    answer = await asyncio.wait_for(self._fetch(url + path), self._fetch_timeout)
                except Exception as exc:
                    log.info("no KV event sources from %s: %s", name, exc or type(exc).__name__)
                    answer = None
                source = read(answer, url)
            if source is not None:
                sub.watch(name, source)
            elif name in sub.watched:
                sub.unwatch(name)  # no longer configured, or its engine no longer publishes


def build_kv_sync(
    index: KvIndex | None,
    fleet: Fleet,
    pools: Callable[[], Sequence[PoolSettings]],
    fetch_json: FetchJson,
) -> KvEventSync | None:
    """The event streams the config asks for (per backend `kv_events`, per pool discovery), kept
    in step with the fleet and the config; None when the routing policy keeps no KV index."""
    if index is None:
        return None

    def backends() -> dict[str, tuple[str, str]]:
        return {name: (b.pool, b.url) for name, b in fleet.backends.items()}

    return KvEventSync(KvEventSubscriber(index), backends, pools, fetch_json)
