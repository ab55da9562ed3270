"""The raw-ASGI skeleton both dialects share: routing, fault gates, the generation pipeline, sim endpoints.

A dialect subclass supplies the wire shapes: `prepare` (validate + plan a request), `respond`
(non-streaming body), `stream` (the SSE events), `error_body`, and its own extra routes. The pipeline
for `/v1/chat/completions` and `/v1/completions`:

    read body → record it → start-up 503 / stall / injected error → prepare (400s) → admit
    → prefill → decode → body or stream → [DONE]

A stream that fails after its 200 sends one `data: {"error": ...}` event and `[DONE]`.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import parse_qs

import orjson

from engines.sim import asgi, tokenizer
from engines.sim.asgi import Disconnect, Receive, Scope, Send
from engines.sim.config import FaultKind, SimConfig
from engines.sim.engine import Engine, Run
from engines.sim.faults import FaultUpdateError
from engines.sim.generator import Output
from engines.sim.prefix_cache import LoraRequest
from engines.sim.request import Kind, PromptIn, RequestError, max_tokens_of, parse_body

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]
_NOT_FOUND = b'{"detail":"Not Found"}'


class StreamCut(Exception):
    """The simulator cut its own connection mid-stream (fault injection)."""


@dataclass(slots=True)
class Prepared:
    """A validated request with its planned outputs; built by a dialect's `prepare`.

    `prompts` holds one entry for a chat request or a single completions prompt, one per element of a
    completions batch (a list of strings or of token-id lists). The engines run each prompt as a request
    of its own; `outputs` lists every choice, prompt-major: prompt k's `per_prompt` choices are
    `outputs[k * per_prompt : (k + 1) * per_prompt]`, and a choice's position is its `index` on the wire.
    """

    kind: Kind
    body: dict[str, Any]
    request_id: str
    model: str
    created: int
    prompts: list[PromptIn]
    outputs: list[Output]
    per_prompt: int = 1
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: the LoRA adapter the request names (vLLM `--lora-modules`), or None for the base model
    lora: str | None = None
    _head: bytes = field(default=b"", init=False, repr=False)

    def stream_head(self) -> bytes:
        """A stream chunk's bytes up to its choices' list: the same in every chunk of the response,
        made once."""
        if not self._head:
            obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
            head = {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}
            self._head = orjson.dumps(head)[:-1] + b',"choices":['
        return self._head

    @property
    def prompt_ids(self) -> list[int]:
        """The first (for chat: the only) prompt's token ids."""
        return self.prompts[0].ids

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens over all prompts (each counted once, whatever `n`)."""
        return sum(len(q.ids) for q in self.prompts)

    def prompt_of(self, index: int) -> PromptIn:
        """The prompt that choice `index` answers."""
        return self.prompts[index // self.per_prompt]

    def choices_of(self, k: int) -> range:
        """The choice indexes of prompt `k`."""
        return range(k * self.per_prompt, min((k + 1) * self.per_prompt, len(self.outputs)))

    @property
    def completion_tokens(self) -> int:
        """Output tokens over all choices."""
        return sum(o.completion_tokens for o in self.outputs)

    def completion_tokens_of(self, k: int) -> int:
        """Output tokens of prompt `k`'s choices."""
        return sum(self.outputs[i].completion_tokens for i in self.choices_of(k))

    def longest_of(self, k: int) -> int:
        """Most output tokens of any one choice of prompt `k` (its decode steps)."""
        return max((self.outputs[i].completion_tokens for i in self.choices_of(k)), default=0)

    def finish_of(self, k: int) -> str:
        """Prompt `k`'s first choice's finish reason (what the engine's metrics count)."""
        rng = self.choices_of(k)
        return self.outputs[rng.start].finish_reason if rng else "stop"

    def engine_args(self, cfg: SimConfig, session_id: str | None, k: int = 0) -> dict[str, object]:
        """What the batching engine needs beyond prompt `k`: the output's token ids (the blocks it
        fills are cached and hashed), the engine's `max_new_tokens` (SGLang's memory reserve), the
        request's `cache_salt`, its LoRA adapter (name, id, path: its own cache namespace) and session."""
        rng = self.choices_of(k)
        first = self.outputs[rng.start] if rng else None
        out_ids = tokenizer.encode(first.reasoning_text + first.text + first.tool_text) if first else []
        max_tokens = max_tokens_of(self.body)
        salt = self.body.get("cache_salt")
        return {
            "output_ids": out_ids,
            "max_new": max_tokens
            if max_tokens is not None
            else max(1, cfg.max_model_len - len(self.prompts[k].ids)),
            "cache_salt": salt if isinstance(salt, str) and salt else None,
            "lora": lora_request(cfg, self.lora),
            "session_id": session_id,
        }


def lora_request(cfg: SimConfig, name: str | None) -> LoraRequest | None:
    """vLLM's `LoRARequest` for adapter `name`: its name, its id (1, 2, ... in `--lora-modules`
    order) and its path."""
    if name is None or name not in cfg.lora_modules:
        return None
    return LoraRequest(name, list(cfg.lora_modules).index(name) + 1, cfg.lora_modules[name])


Emit = Callable[[bytes], Awaitable[None]]


class Emitter:
    """Sends stream chunks, applying the crash-after-K-chunks fault."""

    __slots__ = ("_app", "_receive", "_scope", "_send", "_watcher", "sent")

    def __init__(self, app: SimApp, scope: Scope, receive: Receive, send: Send, watcher: Disconnect) -> None:
        self._app, self._scope, self._receive, self._send = app, scope, receive, send
        self._watcher = watcher
        self.sent = 0

    async def __call__(self, data: bytes) -> None:
        faults = self._app.engine.faults
        if faults.crash_after is not None and self.sent >= faults.crash_after:
            await self._crash()
        await self._send({"type": "http.response.body", "body": data, "more_body": True})
        self.sent += 1

    async def _crash(self) -> None:
        self._app.engine.stats.faults_injected_total += 1
        mode = self._app.engine.faults.crash_mode
        if mode == "exit":
            os._exit(3)
        if mode == "error":
            raise RuntimeError("simulated engine failure mid-stream")
        self._watcher.stop()
        await asgi.cut_connection(self._scope, self._receive)
        raise StreamCut


def body_streams(raw: bytes) -> bool:
    """The request body asks for a stream (read again only on an error path)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return isinstance(body, dict) and body.get("stream") is True


async def _each_prompt(p: Prepared, work: Callable[[int], Coroutine[Any, Any, None]]) -> None:
    """`work(k)` for every prompt of `p`, at once (the engines batch a request's prompts); one prompt
    runs in the caller's task."""
    if len(p.prompts) == 1:
        await work(0)
        return
    async with asyncio.TaskGroup() as group:
        for k in range(len(p.prompts)):
            group.create_task(work(k))


def _serialised(emit: Emit) -> Emit:
    """`emit` for several tasks: one chunk on the wire at a time."""
    lock = asyncio.Lock()

    async def locked(data: bytes) -> None:
        async with lock:
            await emit(data)

    return locked


class SimApp(ABC):
    """Base ASGI application of one simulated engine."""

    def __init__(self, cfg: SimConfig, clock: Callable[[], float] = time.perf_counter) -> None:
        self.cfg = cfg
        self.engine = Engine(cfg, clock)
        self.zero_latency = (
            cfg.ttft_s == 0
            and cfg.prefill_s_per_token == 0
            and cfg.itl_s == 0
            and (cfg.scheduler == "serial" or (cfg.decode_s_per_seq == 0 and cfg.context_s_per_token == 0))
        )
        self.routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/chat/completions"): partial(self._generate, "chat"),
            ("POST", "/v1/completions"): partial(self._generate, "completion"),
            ("GET", "/sim/stats"): self._sim_stats,
            ("GET", "/sim/requests"): self._sim_requests,
            ("GET", "/sim/faults"): self._sim_faults,
            ("POST", "/sim/faults"): self._sim_faults,
            ("POST", "/sim/reset"): self._sim_reset,
        }
        self.engine.start_events()

    # ---- dialect hooks -------------------------------------------------------------------------
    @abstractmethod
    def error_body(
        self, status: int, message: str, param: str | None = None, err_type: str | None = None
    ) -> bytes:
        """The engine's JSON error body."""

    @abstractmethod
    def stream_error_event(self, message: str, err_type: str, code: int) -> bytes:
        """The `data: {"error": ...}` event sent when a stream fails after its 200."""

    @abstractmethod
    def context_error(self, prompt_tokens: int, max_tokens: int | None) -> RequestError:
        """The engine's context-length 400."""

    @abstractmethod
    def prepare(self, kind: Kind, body: dict[str, Any]) -> Prepared:
        """Validate and plan a request (raise `RequestError`)."""

    def session_id(self, body: dict[str, Any], scope: Scope) -> str | None:
        """The request's session for KV events (vLLM: `session_id` or `X-Session-ID`); None here."""
        return None

    @abstractmethod
    def respond(self, p: Prepared, cached: list[int]) -> bytes:
        """The non-streaming response body; `cached[k]`: prompt k's cached prompt tokens."""

    @abstractmethod
    async def stream_prompt(self, p: Prepared, k: int, run: Run, emit: Emit) -> None:
        """Emit the SSE events of prompt `k`'s choices (prefill and decode steps on `run`). A batch's
        prompts stream at once, each from its own task: their chunks interleave as they are made."""

    @abstractmethod
    async def stream_end(self, p: Prepared, cached: list[int], first: int, emit: Emit) -> None:
        """Emit what follows every prompt's chunks except `[DONE]` (the usage chunk); `first`: the
        prompt whose first output came first."""

    # ---- ASGI entry ----------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self._lifespan(receive, send)
            return
        key = self.cfg.api_key
        if key is not None and self.guarded(scope["path"]) and not _bearer_is(scope, key):
            await asgi.send_bytes(send, 401, b'{"error":"Unauthorized"}')
            return
        handler = self.routes.get((scope["method"], scope["path"])) or self.fallback(scope)
        if handler is None:
            await asgi.send_bytes(send, 404, _NOT_FOUND)
            return
        await handler(scope, receive, send)

    def guarded(self, path: str) -> bool:
        """Does `--api-key` guard `path`? (the simulator's own `/sim/*` controls never)"""
        return not path.startswith("/sim/")

    def fallback(self, scope: Scope) -> Handler | None:
        """Handler for paths not in `routes` (e.g. with path parameters); None → 404."""
        return None

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def send_error(
        self, send: Send, status: int, message: str, param: str | None = None, err_type: str | None = None
    ) -> None:
        """Send the engine's error response."""
        await asgi.send_bytes(send, status, self.error_body(status, message, param, err_type))

    # ---- generation ----------------------------------------------------------------------------
    async def _generate(self, kind: Kind, scope: Scope, receive: Receive, send: Send) -> None:
        raw = await asgi.read_body(receive)
        eng = self.engine
        stats = eng.stats
        stats.requests_total += 1
        stats.record(scope["method"], scope["path"], scope["headers"], raw)
        faults = eng.faults
        if faults.starting():
            stats.errors_total += 1
            await self.send_error(send, 503, "The server is starting up. Please retry later.")
            return
        if faults.stall:
            await self._stall(receive)
            return
        fault = faults.draw_error()
        if fault is not None:
            stats.faults_injected_total += 1
            await self._send_fault(send, fault)
            return
        try:
            p = self.prepare(kind, parse_body(raw))
        except RequestError as err:
            stats.errors_total += 1
            if err.in_stream and body_streams(raw):
                await asgi.start_sse(send)
                event = self.stream_error_event(err.message, err.err_type or "BadRequestError", err.status)
                await asgi.send_chunk(send, event)
                await asgi.send_chunk(send, asgi.DONE)
                await asgi.end_stream(send)
                return
            await self.send_error(send, err.status, err.message, err.param, err.err_type)
            return
        watch = p.stream or not self.zero_latency or faults.drip_s > 0
        watcher = Disconnect(receive) if watch else None
        session = self.session_id(p.body, scope)
        try:
            if p.stream:
                assert watcher is not None
                await self._stream(p, scope, receive, send, watcher, session)
            else:
                cached = [0] * len(p.prompts)
                await _each_prompt(p, partial(self._whole, p, session, cached))
                body = self.respond(p, cached)
                if watcher is not None:
                    watcher.stop()
                await asgi.send_bytes(send, 200, body)
        except asyncio.CancelledError:
            if watcher is None or not watcher.disconnected:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        finally:
            if watcher is not None:
                watcher.stop()

    async def _whole(self, p: Prepared, session: str | None, cached: list[int], k: int) -> None:
        """Prompt `k`'s engine request, not streamed."""
        longest = p.longest_of(k)
        args = p.engine_args(self.cfg, session, k)
        async with self.engine.run(p.prompts[k].ids, longest, extra=args) as run:
            await run.prefill()
            await run.decode(longest)
            run.finish(p.completion_tokens_of(k), p.finish_of(k))
        cached[k] = run.cached_tokens

    async def _stream(
        self,
        p: Prepared,
        scope: Scope,
        receive: Receive,
        send: Send,
        watcher: Disconnect,
        session: str | None,
    ) -> None:
        await asgi.start_sse(send)
        emitter = Emitter(self, scope, receive, send, watcher)
        emit: Emit = emitter
        if len(p.prompts) > 1:  # the prompts' tasks take turns on the one connection
            emit = _serialised(emitter)
        cached = [0] * len(p.prompts)
        order: list[int] = []  # prompts in the order their first chunk went out

        async def one(k: int) -> None:
            args = p.engine_args(self.cfg, session, k)
            async with self.engine.run(p.prompts[k].ids, p.longest_of(k), extra=args) as run:

                async def noting(data: bytes) -> None:
                    if k not in order:
                        order.append(k)
                    await emit(data)

                await self.stream_prompt(p, k, run, noting if len(p.prompts) > 1 else emit)
                run.finish(p.completion_tokens_of(k), p.finish_of(k))
            cached[k] = run.cached_tokens

        cut = False
        failure: BaseException | None = None
        try:
            await _each_prompt(p, one)
            await self.stream_end(p, cached, order[0] if order else 0, emit)
        except* StreamCut:
            cut = True
        except* Exception as group:
            failure = group.exceptions[0]
        if cut:
            return
        if failure is not None:
            await asgi.send_chunk(send, self.stream_error_event(str(failure), "InternalServerError", 500))
        await asgi.send_chunk(send, asgi.DONE)
        watcher.stop()
        await asgi.end_stream(send)

    async def _stall(self, receive: Receive) -> None:
        """Never answer; return when the client goes away."""
        watcher = Disconnect(receive)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if not watcher.disconnected:
                raise
            self.engine.stats.cancelled_total += 1
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        finally:
            watcher.stop()

    async def _send_fault(self, send: Send, kind: FaultKind) -> None:
        if kind == "context":
            err = self.context_error(self.cfg.max_model_len + 1, None)
            await self.send_error(send, err.status, err.message, err.param, err.err_type)
        elif kind == "429":
            await self.send_error(send, 429, "Too many requests (simulated fault).")
        elif kind == "503":
            await self.send_error(send, 503, "Service unavailable (simulated fault).")
        else:
            await self.send_error(send, 500, "Internal server error (simulated fault).")

    # ---- sim-only endpoints --------------------------------------------------------------------
    async def _sim_stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        await asgi.send_json(send, 200, self.engine.sim_stats())

    async def _sim_requests(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = parse_qs(scope.get("query_string", b"").decode())
        log = list(self.engine.stats.log)
        if "limit" in query:
            log = log[-max(0, int(query["limit"][0])) :]
        await asgi.send_json(send, 200, {"requests": [r.to_json() for r in log]})

    async def _sim_faults(self, scope: Scope, receive: Receive, send: Send) -> None:
        faults = self.engine.faults
        if scope["method"] == "POST":
            raw = await asgi.read_body(receive)
            try:
                body = orjson.loads(raw) if raw else {}
                if not isinstance(body, dict):
                    raise FaultUpdateError("body must be a JSON object")
                runner = self.engine.runner
                if "freeze" in body and runner is None:
                    raise FaultUpdateError("freeze needs the batching scheduler")
                faults.update(body)
                if runner is not None:
                    runner.wake()  # thawed: the steps go on
            except (orjson.JSONDecodeError, FaultUpdateError) as exc:
                await asgi.send_json(send, 400, {"error": str(exc)})
                return
        await asgi.send_json(send, 200, faults.snapshot())

    async def _sim_reset(self, scope: Scope, receive: Receive, send: Send) -> None:
        await asgi.read_body(receive)
        self.engine.stats.reset()
        self.engine.reset_cache(when_busy=True)
        await asgi.send_json(send, 200, {"ok": True})


def _bearer_is(scope: Scope, key: str) -> bool:
    """The request's `Authorization` is `Bearer <key>` (compared in constant time)."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), key.encode())
    return False
