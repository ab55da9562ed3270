"""`Answer`: how one request's answer is written in its client's API.

Chat and legacy completions are written by the proxy stage with `engines.openai` (then
`ctx.answer` is None). Every other API's intake stage (gateway/apis/) sets `ctx.answer` to an
object of this shape; the proxy stage and the SSE relay call it and never learn which API it is:

    non-streamed   engine 200 bytes ─► Answer.body(dialect, data) ─► client bytes (+ usage)
    streamed       engine events    ─► Answer.stream() (a StreamWriter) ─► client bytes
    both           the answer is whole ─► await Answer.complete() ─► its last bytes go out
"""

from __future__ import annotations

from typing import Protocol

from engines.base import Dialect, StreamWriter, Usage


class Answer(Protocol):
    #: the engine's finish reasons of the non-streamed answer once `body` has read it (for traces;
    #: empty before, and for answers without any, e.g. embeddings). Streams: `StreamWriter`'s own.
    finish_reasons: tuple[str, ...]
    #: the content type of the non-streamed body (`gateway.core.responses.JSON` but for plain text)
    content_type: bytes

    def body(self, dialect: Dialect, data: bytes) -> tuple[bytes, Usage]:
        """The client's body for the engine's non-streamed 200 body `data`, and the usage to bill;
        raises `ApiError` for an engine answer it cannot read."""
        ...

    def stream(self) -> StreamWriter:
        """A fresh writer for the streamed answer."""
        ...

    async def complete(self) -> None:
        """Runs once the answer is whole, before its last bytes are sent (e.g. stores it, so a
        client that asks for it right after cannot miss it). Must not raise."""
        ...
