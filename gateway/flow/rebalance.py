"""The opt-in closed loop (`routing.rebalance: true`): every `REBALANCE_INTERVAL_S`, one replica reads
the engine comparison of the last `REBALANCE_WINDOW_S` and moves pool weight toward the pools that
serve each model's traffic better. policies/rebalance.py decides (bounded steps, a floor, pools an
admin set left alone); this module takes the turn, reads, applies and reports.

Whose turn. With Redis, the replica that sets `gw:{engines}:rebalance` (SET NX, expiring after the
interval) runs the round: one replica a round and one round an interval fleet-wide, whichever
replicas come and go. Every replica looks every `REBALANCE_POLL_S`. While Redis does not answer,
no round runs (its figures and its writes are both there). Without Redis, this process runs a
round every interval on its own figures.

A move is written like an admin's change (the root hands in `apply`: `FleetControl.change_fleet`):
the pools' new weights as the loop's overrides `rebalance:<pool>`, which an admin's
`weight:<pool>` outranks, and an audit entry `pool_rebalanced` (actor `gateway`, target the model,
before → after with the reason); every replica applies it within a second. The last round (when,
which replica, its moves, why each other model was left alone) is kept, in Redis with one, and
shown by `GET /admin/engines/compare`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Final

import orjson
from redis.exceptions import RedisError

from gateway.core.fleet import Fleet
from gateway.core.outage_log import OutageLog
from gateway.core.redis_client import RedisClient
from gateway.core.replica import REPLICA
from gateway.core.tasks import cancel_and_wait, stop_requested
from gateway.flow.compare import EngineStats, summaries
from policies.rebalance import FLOOR_SHARE, MIN_ADVANTAGE, STEP_SHARE, Move, PoolState, plan

log = logging.getLogger("gateway.flow")

#: a round a minute: a step's effect is in the figures (a fifth of the window) before the next step
REBALANCE_INTERVAL_S: Final = 60.0
#: the figures a round reads: five minutes give a moderately busy model enough requests per class,
#: and forget what the weights were a few steps ago
REBALANCE_WINDOW_S: Final = 300
#: how often a replica looks whether a round is due: a round starts at most this late
REBALANCE_POLL_S: Final = 5.0
LOCK_KEY: Final = "gw:{engines}:rebalance"
LAST_KEY: Final = "gw:{engines}:rebalance:last"

#: writes a move: (model, before, after, the pools' new weights) -> whether the shared store has it
Apply = Callable[[str, dict[str, Any], dict[str, Any], dict[str, float]], Awaitable[bool]]


class Rebalancer:
    """The loop (module docstring). `pinned` names the pools whose weight an admin set;
    `interval_s` and `poll_s` are the constants above unless a test hands in others."""

    def __init__(
        self,
        stats: EngineStats,
        fleet: Fleet,
        pinned: Callable[[], Collection[str]],
        apply: Apply,
        *,
        interval_s: float = REBALANCE_INTERVAL_S,
        poll_s: float = REBALANCE_POLL_S,
    ) -> None:
        self._stats = stats
        self._fleet = fleet
        self._pinned = pinned
        self._apply = apply
        self._interval_s = interval_s
        self._poll_s = poll_s
        self._redis: RedisClient | None = None
        self._next = 0.0  # without Redis: the loop time of the next round
        self._last: dict[str, Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._outage = OutageLog(log, "the pool rebalancing loop (Redis)")

    async def start(self, redis: RedisClient | None) -> None:
        self._redis = redis
        self._next = asyncio.get_running_loop().time() + self._interval_s
        self._task = asyncio.create_task(self._run(), name="rebalance")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task], within_s=2.0, what="the rebalancing loop")
            self._task = None

    async def _run(self) -> None:
        while not stop_requested():
            await asyncio.sleep(self._poll_s)
            try:
                if await self._due():
                    await self.round()
                self._outage.worked()
            except (RedisError, OSError) as exc:
                if stop_requested():
                    return
                self._outage.failed(exc)

    async def _due(self) -> bool:
        """This replica's turn: the shared turn taken (with Redis), or an interval gone by."""
        redis = self._redis
        if redis is not None:
            ttl_ms = int(self._interval_s * 1000)
            return bool(await redis.set(LOCK_KEY, REPLICA, nx=True, px=ttl_ms))
        now = asyncio.get_running_loop().time()
        if now < self._next:
            return False
        self._next = now + self._interval_s
        return True

    async def round(self) -> dict[str, Any]:
        """One round: read the window, decide, write each move; the round's report."""
        window = await self._stats.window(REBALANCE_WINDOW_S)
        moves: list[dict[str, Any]] = []
        held: dict[str, str]
        if self._redis is not None and window.scope != "fleet":
            held = {"*": "Redis is unreachable: no round without the fleet's figures"}
        else:
            pinned = set(self._pinned())
            pools = [PoolState(p.name, p.weight, p.name in pinned) for p in self._fleet.pools.values()]
            serving: dict[str, list[str]] = {}
            for p in self._fleet.pools.values():
                for model in p.models:
                    serving.setdefault(model, []).append(p.name)
            decided = plan(pools, serving, summaries(window.series))
            held = dict(decided.held)
            for move in decided.moves:
                moves.append(await self._write(move))
        report = {
            "at": round(self._stats.now(), 3),
            "replica": REPLICA,
            "window_s": REBALANCE_WINDOW_S,
            "moves": moves,
            "held": held,
        }
        self._last = report
        if self._redis is not None:
            await self._redis.set(LAST_KEY, orjson.dumps(report), ex=int(10 * self._interval_s))
        return report

    async def _write(self, move: Move) -> dict[str, Any]:
        why = move.verdict.why()
        before = {"weights": move.before}
        after = {"weights": move.after, "why": why}
        shared = await self._apply(move.model, before, after, move.after)
        log.info("pool_rebalanced %s: %s -> %s (%s)", move.model, move.before, move.after, why)
        return {"model": move.model, "before": move.before, "after": move.after, "why": why, "shared": shared}

    async def status(self) -> dict[str, Any]:
        """The loop as `GET /admin/engines/compare` shows it: its constants and the last round
        (any replica's, with Redis)."""
        last = self._last
        if self._redis is not None:
            try:
                raw = await self._redis.get(LAST_KEY)
                last = orjson.loads(raw) if raw else None
            except (RedisError, OSError):
                pass  # this replica's own last round, if it ran one
        return {
            "enabled": True,
            "interval_s": self._interval_s,
            "window_s": REBALANCE_WINDOW_S,
            "step_share": STEP_SHARE,
            "floor_share": FLOOR_SHARE,
            "min_advantage": MIN_ADVANTAGE,
            "last_round": last,
        }
