"""Injected faults: what is wrong with this simulator right now.

Seeded from the command line, changed at run time with `POST /sim/faults` (JSON, any subset of the
keys of `FaultState.snapshot()`, or `{"reset": true}`). The error rate is deterministic: an accumulator
adds `fault_rate` per request and a request fails each time it crosses 1, so `0.5` fails exactly every
second request and `1.0` every request. Keys: `fault_rate`, `fault_kind` ("429" | "500" | "503" |
"context"), `crash_after` (chunks, or null), `crash_mode` ("cut" | "exit" | "error"), `stall`, `drip_ms`,
`refuse` (until turned off, over a connection opened before; new ones are closed at once), `refuse_s`
(refuse new connections for that many seconds), `startup_delay` (503 for that many seconds from now),
`freeze` (batching scheduler: no step runs, so running requests stop and new ones wait: a hung GPU).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, cast

from engines.sim.config import CrashMode, FaultKind, SimConfig

FAULT_KINDS: tuple[FaultKind, ...] = ("429", "500", "503", "context")
CRASH_MODES: tuple[CrashMode, ...] = ("cut", "exit", "error")


class FaultUpdateError(ValueError):
    """A `POST /sim/faults` body that cannot be applied."""


@dataclass(slots=True)
class FaultState:
    """Mutable fault settings; one per process, read on every request."""

    fault_rate: float = 0.0
    fault_kind: FaultKind = "500"
    crash_after: int | None = None
    crash_mode: CrashMode = "cut"
    stall: bool = False
    freeze: bool = False
    drip_s: float = 0.0
    refuse: bool = False
    refuse_until: float = 0.0
    ready_at: float = field(default_factory=time.monotonic)
    _acc: float = 0.0

    @classmethod
    def from_config(cls, cfg: SimConfig) -> FaultState:
        """Initial faults from the flags; the start-up period runs from now."""
        return cls(
            fault_rate=cfg.fault_rate,
            fault_kind=cfg.fault_kind,
            crash_after=cfg.crash_after,
            crash_mode=cfg.crash_mode,
            stall=cfg.stall,
            drip_s=cfg.drip_s,
            refuse=cfg.refuse,
            ready_at=time.monotonic() + cfg.startup_delay_s,
        )

    def starting(self) -> bool:
        """True during the start-up period (health and requests answer 503)."""
        return time.monotonic() < self.ready_at

    def refusing(self) -> bool:
        """True when new connections are to be closed at once."""
        return self.refuse or (self.refuse_until > 0.0 and time.monotonic() < self.refuse_until)

    def draw_error(self) -> FaultKind | None:
        """Whether this request fails, and how (advances the deterministic accumulator)."""
        if self.fault_rate <= 0.0:
            return None
        self._acc += self.fault_rate
        if self._acc >= 1.0:
            self._acc -= 1.0
            return self.fault_kind
        return None

    def snapshot(self) -> dict[str, Any]:
        """Current settings as JSON-able values."""
        return {
            "fault_rate": self.fault_rate,
            "fault_kind": self.fault_kind,
            "crash_after": self.crash_after,
            "crash_mode": self.crash_mode,
            "stall": self.stall,
            "freeze": self.freeze,
            "drip_ms": self.drip_s * 1000,
            "refuse": self.refuse,
            "refuse_remaining_s": max(0.0, self.refuse_until - time.monotonic()),
            "startup_remaining_s": max(0.0, self.ready_at - time.monotonic()),
        }

    def update(self, body: dict[str, Any]) -> None:
        """Apply a `POST /sim/faults` body; raises `FaultUpdateError` on a bad key or value."""
        if body.get("reset"):
            self.fault_rate, self.fault_kind, self.crash_after = 0.0, "500", None
            self.crash_mode, self.stall, self.drip_s, self.refuse = "cut", False, 0.0, False
            self.freeze = False
            self.ready_at, self.refuse_until, self._acc = time.monotonic(), 0.0, 0.0
        for key, value in body.items():
            if key == "reset":
                continue
            try:
                self._set(key, value)
            except (TypeError, ValueError) as exc:
                raise FaultUpdateError(f"bad value for {key!r}: {value!r}") from exc

    def _set(self, key: str, value: Any) -> None:
        if key == "fault_rate":
            self.fault_rate, self._acc = float(value), 0.0
        elif key == "fault_kind":
            if str(value) not in FAULT_KINDS:
                raise ValueError(value)
            self.fault_kind = cast(FaultKind, str(value))
        elif key == "crash_after":
            self.crash_after = None if value is None else int(value)
        elif key == "crash_mode":
            if value not in CRASH_MODES:
                raise ValueError(value)
            self.crash_mode = cast(CrashMode, value)
        elif key == "stall":
            self.stall = bool(value)
        elif key == "freeze":
            self.freeze = bool(value)
        elif key == "drip_ms":
            self.drip_s = float(value) / 1000
        elif key == "refuse":
            self.refuse = bool(value)
        elif key == "refuse_s":
            self.refuse_until = time.monotonic() + float(value)
        elif key == "startup_delay":
            self.ready_at = time.monotonic() + float(value)
        else:
            raise FaultUpdateError(f"unknown fault setting {key!r}")
