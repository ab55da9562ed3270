"""SGLang's non-OpenAI endpoints: health (with its 1-token generation), server/model info, load,
models, tokenize/detokenize, `/flush_cache` and a minimal native `/generate`."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from engines.sim import asgi, tokenizer
from engines.sim.asgi import Receive, Scope, Send
from engines.sim.config import SimConfig
from engines.sim.engine import Engine
from engines.sim.generator import GenSpec, generate
from engines.sim.plan import hex_id
from engines.sim.prompt import render_chat
from engines.sim.request import seed_of


class SglangEndpoints:
    """Handlers bound to one simulator's config and engine."""

    def __init__(self, cfg: SimConfig, engine: Engine) -> None:
        self.cfg = cfg
        self.engine = engine

    async def health(self, scope: Scope, receive: Receive, send: Send) -> None:
        """503 while starting or stalled; else a 1-token generation through the scheduler, and 200 as
        soon as it is done *or the engine has produced output since the probe began* (looked at once a
        second, like SGLang's `health_generate`: "any response from the detokenizer/scheduler => server
        is healthy"); 503 after 20 s. A busy engine therefore answers within ~1 s instead of after
        its whole queue (which failed a gateway's 3 s probe under load and took the backend out)."""
        eng = self.engine
        if eng.faults.starting() or eng.faults.stall:
            await asgi.send_bytes(send, 503, b"", [])
            return
        tic = eng.clock()
        probe = asyncio.ensure_future(self._generate_one())
        try:
            async with asyncio.timeout(20):
                while not probe.done():
                    await asyncio.wait({probe}, timeout=1.0)
                    if eng.last_output > tic:
                        break
        except TimeoutError:
            await asgi.send_bytes(send, 503, b"", [])
            return
        finally:
            if not probe.done():
                probe.cancel()  # a probe still queued leaves the queue cleanly
        if probe.done() and not probe.cancelled():
            probe.result()  # re-raise what broke the probe's generation
        await asgi.send_bytes(send, 200, b"", [])

    async def _generate_one(self) -> None:
        async with self.engine.run([self.cfg.eos_token_id], 1, account=False) as run:
            await run.prefill()
            run.finish(1, "length")

    def info(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "version": cfg.engine_version,
            "model_path": cfg.model,
            "tokenizer_path": cfg.model,
            "served_model_name": cfg.served_model_name,
            "context_length": cfg.max_model_len,
            "page_size": cfg.block_size,
            "max_running_requests": cfg.max_num_seqs,
            "max_total_num_tokens": cfg.block_size * cfg.num_cache_blocks,
            "tool_call_parser": cfg.tool_call_parser,
            "reasoning_parser": cfg.reasoning_parser,
            "enable_metrics": cfg.enable_metrics,
            "enable_cache_report": cfg.enable_cache_report,
            "disable_radix_cache": not cfg.prefix_caching,
            "chunked_prefill_size": cfg.chunked_prefill_size,
            "max_prefill_tokens": cfg.max_prefill_tokens,
            "schedule_policy": cfg.schedule_policy,
            "kv_events_config": self._kv_events_config(),
            "kv_events": self._kv_events(),
            "dp_size": 1,
            "host": cfg.host,
            "port": cfg.port,
        }

    def _kv_events_config(self) -> str | None:
        pub = self.engine.publisher
        if pub is None:
            return None
        c = pub.cfg
        return json.dumps(
            {
                "publisher": "zmq",
                "endpoint": pub.endpoint,
                "topic": c.topic,
                "replay_endpoint": pub.replay_endpoint,
            }
        )

    def _kv_events(self) -> dict[str, Any] | None:
        """SGLang 0.5.23's descriptor of its publisher (`describe_kv_events_publisher`): what a router
        subscribes to, rank r on `endpoint_port_base + r` (one rank here); None without events."""
        pub = self.engine.publisher
        if pub is None or not pub.endpoint.startswith("tcp://"):
            return None
        host, _, port = pub.endpoint.removeprefix("tcp://").rpartition(":")
        described: dict[str, Any] = {
            "publisher": "zmq",
            "endpoint_host": host.strip("[]"),
            "endpoint_port_base": int(port),
            "topic": pub.cfg.topic,
            "block_size": self.cfg.block_size,
            "dp_size": 1,
        }
        if pub.replay_endpoint is not None and pub.replay_endpoint.startswith("tcp://"):
            described["replay_endpoint_port_base"] = int(pub.replay_endpoint.rpartition(":")[2])
        return described

    async def server_info(self, scope: Scope, receive: Receive, send: Send) -> None:
        await asgi.send_json(send, 200, self.info())

    async def model_info(self, scope: Scope, receive: Receive, send: Send) -> None:
        await asgi.send_json(
            send,
            200,
            {
                "model_path": self.cfg.model,
                "tokenizer_path": self.cfg.model,
                "is_generation": True,
                "weight_version": "default",
            },
        )

    async def load(self, scope: Scope, receive: Receive, send: Send) -> None:
        eng = self.engine
        await asgi.send_json(
            send,
            200,
            [
                {
                    "dp_rank": 0,
                    "num_reqs": eng.running + eng.waiting,
                    "num_waiting_reqs": eng.waiting,
                    "num_tokens": eng.running_tokens,
                }
            ],
        )

    async def metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        await asgi.send_bytes(send, 200, self.engine.metrics.render(), asgi.TEXT_HEADERS)

    def card(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "id": cfg.served_model_name,
            "object": "model",
            "created": int(self.engine.started),
            "owned_by": "sglang",
            "root": cfg.model,
            "parent": None,
            "max_model_len": cfg.max_model_len,
        }

    async def models(self, scope: Scope, receive: Receive, send: Send) -> None:
        await asgi.send_json(send, 200, {"object": "list", "data": [self.card()]})

    async def model(self, scope: Scope, receive: Receive, send: Send) -> None:
        wanted = scope["path"][len("/v1/models/") :]
        if wanted != self.cfg.served_model_name:
            await asgi.send_json(
                send,
                404,
                {
                    "error": {
                        "message": f"The model '{wanted}' does not exist",
                        "type": "invalid_request_error",
                        "param": "model",
                        "code": "model_not_found",
                    }
                },
            )
            return
        await asgi.send_json(send, 200, self.card())

    async def tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        """`prompt` (a string or a list of them) or `messages`, rendered as for a chat completion
        unless `add_generation_prompt` is false."""
        body = await asgi.read_json(receive)
        prompt = body.get("prompt", "")
        if isinstance(body.get("messages"), list):
            text = render_chat(
                body["messages"], body.get("tools"), body.get("add_generation_prompt") is not False
            )
            result: Any = tokenizer.encode(text)
            count: Any = len(result)
        elif isinstance(prompt, list):
            result = [tokenizer.encode(str(x)) for x in prompt]
            count = [len(r) for r in result]
        else:
            result = tokenizer.encode(str(prompt))
            count = len(result)
        await asgi.send_json(
            send, 200, {"tokens": result, "count": count, "max_model_len": self.cfg.max_model_len}
        )

    async def detokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await asgi.read_json(receive)
        tokens = body.get("tokens")
        ids = [t for t in tokens if isinstance(t, int)] if isinstance(tokens, list) else []
        await asgi.send_json(send, 200, {"text": tokenizer.decode(ids)})

    async def flush_cache(self, scope: Scope, receive: Receive, send: Send) -> None:
        """SGLang flushes only when no request runs or waits; the answer is the same text either way."""
        await asgi.read_body(receive)
        self.engine.reset_cache(when_busy=False)
        await asgi.send_bytes(
            send,
            200,
            b"Cache flushed.\nPlease check backend logs for more details. "
            b"(When there are running or waiting requests, the operation will not be performed.)\n",
            [(b"content-type", b"text/plain; charset=utf-8")],
        )

    async def native_generate(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Minimal `/generate`: `text` + `sampling_params` → `{text, output_ids, meta_info}`."""
        body = await asgi.read_json(receive)
        self.engine.stats.requests_total += 1
        text = body.get("text", "")
        raw_params = body.get("sampling_params")
        params: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
        raw_ids = body.get("input_ids")
        ids: list[int] = raw_ids if isinstance(raw_ids, list) else tokenizer.encode(str(text))
        max_new = params.get("max_new_tokens", 128)
        out = generate(
            GenSpec(
                seed=seed_of(body),
                min_len=self.cfg.min_output_tokens,
                max_len=self.cfg.max_output_tokens,
                max_tokens=max_new if isinstance(max_new, int) else 128,
                ignore_eos=params.get("ignore_eos") is True,
            )
        )
        rid = hex_id()
        async with self.engine.run(ids, out.completion_tokens) as run:
            await run.prefill()
            await run.decode(out.completion_tokens)
            run.finish(out.completion_tokens, out.finish_reason)
        finish = (
            {"type": "stop", "matched": self.cfg.eos_token_id}
            if out.finish_reason == "stop"
            else {"type": "length", "length": out.completion_tokens}
        )
        result = {
            "text": out.text,
            "output_ids": tokenizer.encode(out.text),
            "meta_info": {
                "id": rid,
                "finish_reason": finish,
                "prompt_tokens": len(ids),
                "completion_tokens": out.completion_tokens,
                "cached_tokens": run.cached_tokens,
                "weight_version": "default",
            },
        }
        if body.get("stream") is True:
            await asgi.start_sse(send)
            await asgi.send_chunk(send, asgi.sse(result))
            await asgi.send_chunk(send, asgi.DONE)
            await asgi.end_stream(send)
            return
        await asgi.send_json(send, 200, result)
