"""Sim-only bookkeeping: counters for `GET /sim/stats` and the recent-request log for `GET /sim/requests`.

Bodies are stored raw and parsed only when the log is read, so recording costs little on the hot path.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass(slots=True)
class RecordedRequest:
    """One request as it reached the simulator."""

    method: str
    path: str
    headers: list[tuple[bytes, bytes]]
    body: bytes
    arrival: float

    def to_json(self) -> dict[str, Any]:
        """JSON view: the body parsed when it is JSON, else as text."""
        parsed: Any
        try:
            parsed = orjson.loads(self.body) if self.body else None
        except orjson.JSONDecodeError:
            parsed = self.body.decode("utf-8", "replace")
        return {
            "method": self.method,
            "path": self.path,
            "headers": {k.decode("latin-1"): v.decode("latin-1") for k, v in self.headers},
            "body": parsed,
            "arrival": self.arrival,
        }


@dataclass(slots=True)
class SimStats:
    """Counters of one simulator; `running`/`waiting` are read from the scheduler when reported."""

    requests_total: int = 0
    completed_total: int = 0
    cancelled_total: int = 0
    errors_total: int = 0
    faults_injected_total: int = 0
    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0
    generation_tokens_total: int = 0
    log: deque[RecordedRequest] = field(default_factory=lambda: deque(maxlen=256))

    def record(self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Remember one generation request (bounded: the oldest falls out)."""
        self.log.append(RecordedRequest(method, path, list(headers), body, time.time()))

    def reset(self) -> None:
        """Zero every counter and forget the log."""
        maxlen = self.log.maxlen
        for name in (
            "requests_total",
            "completed_total",
            "cancelled_total",
            "errors_total",
            "faults_injected_total",
            "prompt_tokens_total",
            "cached_tokens_total",
            "generation_tokens_total",
        ):
            setattr(self, name, 0)
        self.log = deque(maxlen=maxlen)

    def counters(self) -> dict[str, int]:
        """The counters as a JSON-able dict."""
        return {
            "requests_total": self.requests_total,
            "completed_total": self.completed_total,
            "cancelled_total": self.cancelled_total,
            "errors_total": self.errors_total,
            "faults_injected_total": self.faults_injected_total,
            "prompt_tokens_total": self.prompt_tokens_total,
            "cached_tokens_total": self.cached_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
        }
