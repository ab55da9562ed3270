"""This routing process's side of the state routing processes share through Redis: its in-flight
counts and the placement of new prefix groups (docs/routing.md, *Shared load*).

`SharedLoad` is the `gateway.core.shared_load.LoadShare` the root hands to admission, whose one
round trip per request carries it (gateway/admission/limits_redis.py). What to ask and what an answer
means is pure (`policies.shared_load`); here are the process's name, its counts (the fleet's
`in_flight`, which the proxy keeps), the last view of the other processes' counts with its age, and
the request's placement handed to the route stage through the context.

Without an answer - no Redis, an outage, the local limiter deciding - nothing is shared: the view of
the others ages out after one lease and the route stage routes on this process's own counts, as a
single process does. Nothing here can fail a request.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping

from gateway.core.context import RequestContext
from gateway.core.fleet import Fleet
from gateway.core.shared_load import ShareAsk, ShareReply
from policies.router import Router
from policies.shared_load import FLOW, Ask, SharedRouting, WithOthers, flow_waiting, key_text, split
from policies.types import FleetSnapshot, RequestFeatures

#: a group's placement lives this long in the store after it was last read or set: ten minutes
#: outlast a conversation's pauses, and a placement no request reads stops costing Redis memory
PLACEMENT_TTL_S = 600.0
#: a process's counts count this long after its last call: a crashed process's load is gone within
#: ten seconds, and an idle one's renewals (every lease / 3) stay rare
LEASE_S = 10.0

#: the request's features with its tokens (the route stage's `prepare`)
Prepare = Callable[[RequestContext], Awaitable[RequestFeatures]]


def process_name() -> str:
    """A name no other routing process has: host, pid and a random part (pids repeat in containers)."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


class SharedLoad:
    """See the module docstring. Event loop only."""

    def __init__(
        self,
        fleet: Fleet,
        router: Router,
        prepare: Prepare,
        *,
        process: str | None = None,
        lease_s: float = LEASE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.process = process or process_name()
        self.lease_s = lease_s
        self.placement_ttl_s = PLACEMENT_TTL_S
        self._fleet = fleet
        self._prepare = prepare
        self._routing = SharedRouting(router)
        self._clock = clock
        self._others: Mapping[str, int] = {}
        self._sets: Mapping[str, int] = {}  # the others' working sets and tails (`policies.shared_load`)
        self._prefill: Mapping[str, int] = {}  # ... and queued prefill tokens
        self._flow: Mapping[str, int] = {}  # ... and their flow queues' waiting requests by class
        #: this process's flow queue's waiting requests by class (set by the root), or None
        self.flow_queued: Callable[[], Mapping[str, int]] | None = None
        self._flow_names: dict[str, str] = {}  # class -> its name among the figures, built once
        self._at = -float("inf")
        self._with_others = WithOthers()  # the snapshot with the others' figures, rebuilt as they change
        #: answers received, and requests whose group placement came from the store (for operators)
        self.replies = 0
        self.placements = 0

    # -- LoadShare --------------------------------------------------------------------------------
    async def ask(self, ctx: RequestContext) -> ShareAsk:
        counts = self.counts()
        features = ctx.extras.get("features")
        if features is None or not self._routing.grouped(features):
            return ShareAsk(counts)
        features = await self._prepare(ctx)  # the engines' events need the request's tokens
        ask = self._routing.ask(self.snapshot, features, bool(self.others()), self.others_sets())
        if ask is None:
            return ShareAsk(counts)
        ctx.extras["share_ask"] = ask
        return ShareAsk(counts, key_text(ask.key), ask.proposal, ask.candidates, ask.blocks)

    def told(self, ctx: RequestContext, ask: ShareAsk) -> None:
        reply = ask.reply
        if reply is None:
            return
        self.heard(reply.others)
        mine: Ask | None = ctx.extras.get("share_ask")
        if mine is not None:
            self._routing.learn(mine.key, reply.placed)
            if reply.placed is not None:
                ctx.extras["share_reply"] = reply
                self.placements += 1

    def counts(self) -> dict[str, int]:
        """This process's in-flight counts and working sets (`SharedRouting.report`): while it has
        either, the limiter's renewer keeps them in the store."""
        own: dict[str, int] = {}
        prefill: dict[str, int] = {}
        for name, b in self._fleet.backends.items():
            if b.in_flight > 0:
                own[name] = b.in_flight
            if b.prefill > 0:
                prefill[name] = b.prefill
        out = self._routing.report(own, prefill)
        queued = self.flow_queued() if self.flow_queued is not None else None
        if queued:
            names = self._flow_names
            for klass, n in queued.items():
                key = names.get(klass)
                if key is None:
                    key = names[klass] = FLOW + klass
                out[key] = n
        return out

    def heard(self, others: Mapping[str, int]) -> None:
        counts, self._sets, self._prefill = split(others)
        self._others = counts
        # the figures split took are backends'; any other name is a flow queue's
        if len(counts) + len(self._sets) + len(self._prefill) < len(others):
            self._flow = flow_waiting(others)
        elif self._flow:
            self._flow = {}
        self._at = self._clock()
        self.replies += 1

    # -- the route stage's view ---------------------------------------------------------------------
    def others(self) -> Mapping[str, int]:
        """The other processes' in-flight counts as last heard, empty once older than a lease."""
        return self._others if self._heard_lately() else {}

    def others_sets(self) -> Mapping[str, int]:
        """The other processes' working sets and tails by backend as last heard, empty once older
        than a lease (a document's placement proposal adds them to this process's own)."""
        return self._sets if self._heard_lately() else {}

    def others_prefill(self) -> Mapping[str, int]:
        """The other processes' queued prefill tokens by backend as last heard, empty once older than
        a lease."""
        return self._prefill if self._heard_lately() else {}

    def others_flow(self) -> Mapping[str, int]:
        """The requests waiting in the other processes' flow queues by class as last heard, empty
        once older than a lease."""
        return self._flow if self._heard_lately() else {}

    def _heard_lately(self) -> bool:
        """The last answer is at most a lease old (a crashed process's figures expire with it)."""
        return self._clock() - self._at <= self.lease_s

    def elsewhere(self, backend: str) -> int:
        """The other processes' requests in flight on `backend`, as last heard (0 once a lease old):
        the health checker's sign of a busy backend."""
        return self.others().get(backend, 0)

    def snapshot(self, now: float | None = None) -> FleetSnapshot:
        """The fleet with the other processes' counts added to this process's own."""
        snapshot = self._fleet.snapshot(self._clock() if now is None else now)
        return self._with_others(snapshot, self.others(), self.others_prefill())

    def features(self, ctx: RequestContext, features: RequestFeatures) -> RequestFeatures:
        """`features` with the store's placement of the request's group, if it named one."""
        reply: ShareReply | None = ctx.extras.get("share_reply")
        if reply is None:
            return SharedRouting.placed(features, None)
        return SharedRouting.placed(features, reply.placed, not reply.fresh)

    def describe(self) -> dict[str, object]:
        """For the explain endpoint: the view of the others and its age."""
        age = self._clock() - self._at
        return {
            "process": self.process,
            "others_in_flight": dict(self.others()),
            "others_working_sets": dict(self.others_sets()),
            "others_prefill": dict(self.others_prefill()),
            "age_s": round(age, 3) if age != float("inf") else None,
            "replies": self.replies,
            "placements_read": self.placements,
        }
