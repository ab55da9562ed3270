"""Telling this process's own stall from a peer's slowness.

A deadline (`asyncio.timeout`, `loop.call_later`) that fires well after its time measured this
process, not the peer: the host stopped it (a VM whose vCPUs were held, a paused container, a machine
loaded beyond its cores) or a long callback held the event loop. What the peer sent meanwhile may
still be unread: uvloop runs due timers before it polls the sockets, and on asyncio's own loop a task
whose read completed during the stall is cancelled by the due timeout before it runs. A loaded host
can hold a process for seconds. Such a deadline is no verdict on the peer: a health probe gives none
(gateway/upstream/health.py), an engine connect is tried again (gateway/upstream/h1.py), a request
head's deadline looks again once the socket has been read (gateway/edge/http_guard.py).
"""

from __future__ import annotations

#: a deadline firing this much after its time measured this process's own stall
HELD_S = 1.0


def held(deadline: float, now: float, after_s: float = HELD_S) -> bool:
    """The deadline fired at `now` measured this process's stall: more than `after_s` late (both on
    one clock)."""
    return now - deadline > after_s


__all__ = ["HELD_S", "held"]
