"""`RequestTrace`: what the stages record into when a request is traced (docs/tracing.md).

`RequestContext.trace` is None when tracing is off (`tracing.enabled: false`): then every stage pays
one attribute check and nothing else. With tracing on, the root hands each request a trace from the
observability wing (gateway/observability/tracing.py); an unsampled request gets one too, with
`recording` False, so the engine still receives a `traceparent` (flag `00`) and does not start a
sampled trace of its own.

The upstream wing records its attempts and the stream relay through this protocol only; it never
imports the observability wing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class RequestTrace(Protocol):
    #: False for an unsampled request: nothing is recorded, only `traceparent` is propagated
    recording: bool

    def attempt_start(self, pool: str, backend: str, dialect: str) -> Mapping[str, str]:
        """An attempt to one backend begins (the `gateway.upstream` span); returns the request
        headers to send the engine, `traceparent` naming this attempt's span among them."""
        ...

    def attempt_end(self, error_kind: str | None) -> None:
        """The open attempt ended: None when the engine answered, else why not (a metrics kind such as
        `connect`, `timeout`, `status_503`, `engine_400`). Does nothing when no attempt is open."""
        ...

    def relay_span(self, start_ns: int, end_ns: int, error_kind: str | None) -> None:
        """A stream was relayed from the engine's first event to its end (`time.time_ns()` bounds)."""
        ...

    def finished(self, reasons: Sequence[str]) -> None:
        """The answer's finish reasons, once known (`gen_ai.response.finish_reasons`)."""
        ...
