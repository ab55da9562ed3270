"""Routing state shared between routing processes, carried by the admission's one round trip to Redis.

Two wings meet here: routing knows what to share (`gateway/routing/shared_load.py`, over the pure
`policies.shared_load`), admission owns the round trip that carries it (the limiter's `EVALSHA`,
`gateway/admission/limits_redis.py`). Neither imports the other: the root hands admission a
`LoadShare`, and the values travel in the types below.

Per request: before the admission's call, `LoadShare.ask(ctx)` gives a `ShareAsk` (this process's
in-flight counts, and the request's prefix group with this process's proposed placement); the limiter
sends it with the limits, and fills `ShareAsk.reply` when Redis answered (the other processes' counts
and the group's placement). After the call `LoadShare.told(ctx, ask)` takes the answer (or its
absence: Redis down, or the limiter of this process alone decided). When the request has ended, the
finish call carries the counts again (`LoadShare.counts()`) and reads nothing back (the request was
routed; the next admission reads the others'). The limiter's background report, made while a process
is quiet with something to report, also brings back the others' counts (`LoadShare.heard`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.core.context import RequestContext


@dataclass(frozen=True, slots=True)
class ShareReply:
    """What the store answered: the other live processes' in-flight counts per backend (summed),
    the placement of the request's group (None: no group asked, or none set), and whether this call
    set it (False: an earlier one did)."""

    others: Mapping[str, int]
    placed: str | None = None
    fresh: bool = False


class ShareAsk:
    """What one call carries to the store (see the module docstring); `reply` is set by the limiter
    when the store answered. A group without a placement is placed by the store on the one of
    `candidates` (`proposal` first; just `proposal` when empty) with the fewest placed blocks, and
    charged `blocks` there (`policies.shared_load`)."""

    __slots__ = ("blocks", "candidates", "counts", "group", "proposal", "reply")

    def __init__(
        self,
        counts: Mapping[str, int],
        group: str | None = None,
        proposal: str | None = None,
        candidates: tuple[str, ...] = (),
        blocks: int = 0,
    ) -> None:
        self.counts = counts
        self.group = group
        self.proposal = proposal
        self.candidates = candidates
        self.blocks = blocks
        self.reply: ShareReply | None = None


class LoadShare(Protocol):
    """The routing side of the shared state, as admission sees it."""

    #: this process's name in the store (unique per process)
    process: str
    #: a process's counts count for this long after its last call (a crashed process's expire)
    lease_s: float
    #: a group's placement lives this long after it was last read or set
    placement_ttl_s: float

    async def ask(self, ctx: RequestContext) -> ShareAsk:
        """What the admission's call carries for this request (it may tokenize the request first:
        a long encoding is awaited in a worker thread)."""
        ...

    def told(self, ctx: RequestContext, ask: ShareAsk) -> None:
        """The call is over; `ask.reply` is None when the store did not answer."""
        ...

    def counts(self) -> Mapping[str, int]:
        """What this process reports now: its in-flight counts, backends with none left out, and
        under names of their own its routing figures for the others (`policies.shared_load.SETS`:
        working sets). Finish calls and lease renewals carry them as they are."""
        ...

    def heard(self, others: Mapping[str, int]) -> None:
        """The other processes' counts, from a call that was not a request's admission (the
        limiter's background report)."""
        ...


__all__ = ["LoadShare", "ShareAsk", "ShareReply"]
