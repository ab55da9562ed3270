"""Warm-ups: a background prefill of a hot prefix group's preamble on the backend routing opens for it.

A group that brings its pool more than a backend's worth of requests is kept warm on several backends
(`policies.group_demand`). Without warm-ups the next holder was opened by sending it a user's request,
whose whole preamble that engine then prefilled cold: that user's first token came last (bench.replay,
agents at 80 %: every one of the slowest first tokens). With the engines' KV events and the request's
tokens, prefix affinity instead names the backend to warm (`Decision.warm`, `warm_spread`) and keeps the
request on a holder; this module sends that backend the preamble's token ids as a one-token completion
(`POST /v1/completions`, `prompt` a list of token ids, which vLLM and SGLang take as they are), off the
request path. Once the engine's events announce the blocks, the backend is a holder like the others.

A warm-up is best effort: at most `max_in_flight` per process at a time (more are skipped), bounded by
`timeout_s`, counted in the backend's in-flight requests while it runs, and its outcome is a metric
(`gateway_kv_warmups_total`); it never fails or delays a request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import orjson

from gateway.core.fleet import Backend
from gateway.core.tasks import cancel_and_wait

log = logging.getLogger("gateway.routing")

#: outcome observer: (pool, backend, outcome) with outcome `ok`, `error` or `skipped`
WarmupHook = Callable[[str, str, str], None]
#: POSTs a JSON body to a URL and answers the response's status, its body read and dropped (the
#: root's, over the upstream transport; raises on a transport failure)
PostJson = Callable[[str, bytes], Awaitable[int]]


class Warmups:
    """Sends warm-ups and keeps their tasks (`stop` cancels those still running)."""

    def __init__(
        self,
        post: PostJson,
        *,
        max_in_flight: int = 4,
        timeout_s: float = 30.0,
        on_outcome: WarmupHook | None = None,
    ) -> None:
        self._post = post
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self._on_outcome = on_outcome
        self._tasks: set[asyncio.Task[None]] = set()

    def send(self, backend: Backend, model: str, token_ids: list[int]) -> bool:
        """Start warming `backend` with `token_ids` under its served model name `model`; False when
        skipped (nothing to send, or `max_in_flight` warm-ups are running)."""
        if not token_ids or len(self._tasks) >= self.max_in_flight:
            self._outcome(backend, "skipped")
            return False
        body = orjson.dumps({"model": model, "prompt": token_ids, "max_tokens": 1, "temperature": 0.0})
        task = asyncio.get_running_loop().create_task(
            self._warm(backend, body, len(token_ids)), name=f"warm-up {backend.name}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def wait(self) -> None:
        """Until the warm-ups running now have ended."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self) -> None:
        """Cancel the warm-ups still running (bounded: `core.tasks.cancel_and_wait`)."""
        await cancel_and_wait(self._tasks, 5.0, "warm-ups")

    async def _warm(self, backend: Backend, body: bytes, tokens: int) -> None:
        backend.in_flight += 1
        backend.prefill += tokens  # queued prefill there until it answers (`Backend.prefill`)
        outcome = "error"
        try:
            async with asyncio.timeout(self.timeout_s):
                status = await self._post(backend.url + "/v1/completions", body)
            if status == 200:
                outcome = "ok"
            else:
                log.info("warm-up of %s answered %d", backend.name, status)
        except Exception as exc:  # best effort: a transport failure or a timeout, logged
            log.info("warm-up of %s failed: %s", backend.name, str(exc) or type(exc).__name__)
        finally:
            backend.in_flight -= 1
            backend.prefill -= tokens
            self._outcome(backend, outcome)

    def _outcome(self, backend: Backend, outcome: str) -> None:
        if self._on_outcome is not None:
            self._on_outcome(backend.pool, backend.name, outcome)
