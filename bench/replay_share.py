"""What the replay's routing processes learn from outside themselves: the engines' KV-cache events and
the shared store (Redis), modelled in virtual time for `bench/replay.py`.

**Events** (`EventFeed`). The batching engines record their `BlockStored` / `BlockRemoved` /
`AllBlocksCleared` as each step completes (`engines.sim.step_model`, as the simulators publish them);
every routing process's own `KvIndex` receives every batch `delay_s` later, as the gateway's ZMQ
subscriber feeds it. With `loss`, each process independently misses a batch with that probability and,
as the gateway does for a sequence gap it cannot replay, forgets that backend's blocks and distrusts
its stream for `KvIndexConfig.relearn_s` (`KvIndex.gap`).

**Shared store** (`SharedStore`): what the admission's one EVALSHA carries in the gateway
(gateway/admission/limits_redis.py, gateway/routing/shared_load.py). Each process reports its own
in-flight counts when it calls the store - on every request's admission (before that request is routed,
so the request itself is not in it) and on every request's finish - and reads the other processes'
counts as they last reported them: the staleness the gateway has. The counts carry the process's
working sets and tails too (`SharedRouting.report`, `policies.shared_load.split`), which a new
group's proposal adds to its own. A new prefix group is placed at
admission, once: on the one of the asking process's candidates with the fewest placed blocks
(`policies.shared_load.PlacedBlocks`, the gateway script's rule), and that placement is read by every
later request of the group.
The store answers instantly (no round-trip time is modelled: on a LAN it is ~0.1-0.3 ms, against steps
of 40 ms and more).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.routing.shared_load import PLACEMENT_TTL_S
from policies.shared_load import Ask, PlacedBlocks


@dataclass(frozen=True)
class EventFeed:
    """How the engines' events reach the routing processes."""

    delay_s: float = 0.002  # from the end of the engine's step to every process's index
    loss: float = 0.0  # probability that one process misses one batch (a gap, not replayed)


class SharedStore:
    """The shared routing state of the replay's processes (see the module docstring)."""

    __slots__ = ("_placed", "_reported", "calls", "placements")

    def __init__(self, processes: int, placement_ttl_s: float = PLACEMENT_TTL_S) -> None:
        self._reported: list[dict[str, int]] = [{} for _ in range(processes)]
        self.placements: dict[int, str] = {}
        self._placed = PlacedBlocks(placement_ttl_s * 1000)
        self.calls = 0

    def call(self, process: int, own: Mapping[str, int]) -> dict[str, int]:
        """`process` reports its in-flight counts and reads the others' (as last reported)."""
        self.calls += 1
        self._reported[process] = {b: n for b, n in own.items() if n}
        others: dict[str, int] = {}
        for q, counts in enumerate(self._reported):
            if q == process:
                continue
            for b, n in counts.items():
                others[b] = others.get(b, 0) + n
        return others

    def place(self, ask: Ask, now: float) -> tuple[str | None, bool]:
        """A group's placement, set when it has none and `ask` proposes one: to the candidate with
        the fewest placed blocks (`PlacedBlocks`, as the gateway's Redis script); then its value,
        and whether this call set it."""
        fresh = ask.proposal is not None and ask.key not in self.placements
        if fresh:
            chosen = (
                self._placed.place(ask.candidates, ask.blocks, now * 1000) if ask.candidates else ask.proposal
            )
            self.placements[ask.key] = chosen
        return self.placements.get(ask.key), fresh
