"""vLLM's non-OpenAI endpoints: `/health`, `/version`, `/load`, `/metrics`, `/v1/models`, tokenizer,
`/kv_event_sources` and (vLLM serves it with `VLLM_SERVER_DEV_MODE=1`) `/reset_prefix_cache`."""

from __future__ import annotations

from typing import Any

from engines.sim import asgi, tokenizer
from engines.sim.asgi import Receive, Scope, Send
from engines.sim.config import SimConfig
from engines.sim.engine import Engine
from engines.sim.plan import hex_id
from engines.sim.prompt import render_chat


class VllmEndpoints:
    """Handlers bound to one simulator's config and engine."""

    def __init__(self, cfg: SimConfig, engine: Engine) -> None:
        self.cfg = cfg
        self.engine = engine

    async def health(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 503 if self.engine.faults.starting() else 200
        await asgi.send_bytes(send, status, b"", [])

    async def version(self, scope: Scope, receive: Receive, send: Send) -> None:
        await asgi.send_json(send, 200, {"version": self.cfg.engine_version})

    async def load(self, scope: Scope, receive: Receive, send: Send) -> None:
        eng = self.engine  # vLLM counts the requests its API server is handling, streaming ones included
        await asgi.send_json(send, 200, {"server_load": eng.in_flight + eng.waiting})

    async def kv_event_sources(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The KV-event publisher's config per data-parallel rank (`{}` without events), as vLLM's
        `GET /kv_event_sources` serves its `KVEventsConfig` with the bound endpoint."""
        pub = self.engine.publisher
        body = (
            {}
            if pub is None
            else {"0": pub.cfg.source(pub.endpoint) | {"replay_endpoint": pub.replay_endpoint}}
        )
        await asgi.send_json(send, 200, body)

    async def reset_prefix_cache(self, scope: Scope, receive: Receive, send: Send) -> None:
        """`{"success": bool}`: false while requests hold blocks, as vLLM answers."""
        await asgi.read_body(receive)
        await asgi.send_json(send, 200, {"success": self.engine.reset_cache(when_busy=False)})

    async def metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        await asgi.send_bytes(send, 200, self.engine.metrics.render(), asgi.TEXT_HEADERS)

    async def models(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The served model, then each LoRA adapter (vLLM's card: `root` its path, `parent` the
        served model, no `max_model_len`)."""
        cfg = self.cfg
        cards = [self._card(cfg.served_model_name, cfg.model, None, cfg.max_model_len)]
        cards += [
            self._card(name, path, cfg.served_model_name, None) for name, path in cfg.lora_modules.items()
        ]
        await asgi.send_json(send, 200, {"object": "list", "data": cards})

    def _card(self, name: str, root: str, parent: str | None, max_len: int | None) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": int(self.engine.started),
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": max_len,
            "permission": [
                {
                    "id": f"modelperm-{hex_id()}",
                    "object": "model_permission",
                    "created": int(self.engine.started),
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }

    async def tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await asgi.read_json(receive)
        if isinstance(body.get("messages"), list):
            text = render_chat(
                body["messages"], body.get("tools"), body.get("add_generation_prompt") is not False
            )
        else:
            text = str(body.get("prompt", ""))
        ids = tokenizer.encode(text)
        strs = tokenizer.split(text) if body.get("return_token_strs") else None
        await asgi.send_json(
            send,
            200,
            {"count": len(ids), "max_model_len": self.cfg.max_model_len, "tokens": ids, "token_strs": strs},
        )

    async def detokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await asgi.read_json(receive)
        tokens = body.get("tokens")
        ids = [t for t in tokens if isinstance(t, int)] if isinstance(tokens, list) else []
        await asgi.send_json(send, 200, {"prompt": tokenizer.decode(ids)})
