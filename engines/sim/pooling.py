"""What the simulator's endpoints that generate no text share (embeddings, rerank and score,
speech to text): each request is recorded, the fault flags apply as on chat — `--startup-delay`
(503), `--stall` (no answer until the client goes away), `--fault-rate` / `--fault-kind` (an error
answer) — and its work is one prefill of its tokens through the engine, dropped when the client
goes away."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from engines.sim import asgi
from engines.sim.asgi import Disconnect, Receive, Scope, Send
from engines.sim.config import SimConfig
from engines.sim.engine import Engine
from engines.sim.request import RequestError

ErrorBody = Callable[[int, str, str | None, str | None], bytes]
NOT_FOUND = b'{"detail":"Not Found"}'


class PoolingEndpoint:
    """Base of one such endpoint of a simulator app (`cfg.engine` is "vllm" or "sglang")."""

    def __init__(self, cfg: SimConfig, engine: Engine, error_body: ErrorBody) -> None:
        self.cfg = cfg
        self._engine = engine
        self._error_body = error_body

    async def begin(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The request's body, recorded; None when a fault has answered it."""
        raw = await asgi.read_body(receive)
        eng = self._engine
        eng.stats.requests_total += 1
        eng.stats.record(scope["method"], scope["path"], scope["headers"], raw)
        return None if await self._fault(receive, send) else raw

    async def prefill(self, receive: Receive, tokens: list[int], decode: int = 0) -> bool:
        """Run `tokens` through the engine as one prefill (and `decode` steps after it); False when
        the client left meanwhile."""
        watcher = Disconnect(receive)
        try:
            async with self._engine.run(tokens, decode) as run:
                await run.prefill()
                if decode:
                    await run.decode(decode)
                run.finish(decode, "stop")
        except asyncio.CancelledError:
            if not watcher.disconnected:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return False
        finally:
            watcher.stop()
        return True

    async def refuse(self, send: Send, err: RequestError) -> None:
        """Answer the engine's error for `err` (counted)."""
        self._engine.stats.errors_total += 1
        await asgi.send_bytes(
            send, err.status, self._error_body(err.status, err.message, err.param, err.err_type)
        )

    async def not_found(self, send: Send) -> None:
        """vLLM's answer on a route its model does not serve: the web framework's 404."""
        self._engine.stats.errors_total += 1
        await asgi.send_bytes(send, 404, NOT_FOUND)

    async def _fault(self, receive: Receive, send: Send) -> bool:
        eng = self._engine
        faults = eng.faults
        if faults.starting():
            await self.refuse(
                send, RequestError("The server is starting up. Please retry later.", status=503)
            )
            return True
        if faults.stall:
            watcher = Disconnect(receive)
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if not watcher.disconnected:
                    raise
                eng.stats.cancelled_total += 1
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
            finally:
                watcher.stop()
            return True
        kind = faults.draw_error()
        if kind is None:
            return False
        eng.stats.faults_injected_total += 1
        status = {"429": 429, "503": 503, "context": 400}.get(kind, 500)
        await asgi.send_bytes(
            send, status, self._error_body(status, f"Simulated fault ({kind}).", None, None)
        )
        return True
