"""One log line when a repeated background operation starts failing, with its reason, and one when
it works again; none for each failure in between, so an outage does not flood the log."""

from __future__ import annotations

import logging
import time


class OutageLog:
    __slots__ = ("_log", "_since", "_what")

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log = log
        self._what = what
        self._since: float | None = None

    @property
    def failing(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException) -> None:
        if self._since is None:
            self._since = time.monotonic()
            self._log.warning(
                "%s failed (%s: %s); retrying quietly until it works", self._what, type(exc).__name__, exc
            )

    def worked(self) -> None:
        if self._since is not None:
            self._log.warning("%s works again after %.0f s", self._what, time.monotonic() - self._since)
            self._since = None
