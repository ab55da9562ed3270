"""`gateway demo`: the embedded default.

Starts two vLLM-dialect and two SGLang-dialect simulators on free loopback ports (plus one simulator
of each dialect for each side model: embeddings, a reranker, speech to text) and a gateway in front
of them, with in-memory state (Redis when `REDIS_URL` is set) and a JWT secret from
`GATEWAY_JWT_SECRET` (generated when unset). Prints the base URL, a user token (tier `default`: 60
requests/min, 100k tokens/min, 8 concurrent — the `x-ratelimit-*` headers show them), a tight token
(tier `tight`: 3 requests/min, so a few quick requests get 429), a batch token (tier `batch`, flow
class `batch`: room enough to saturate the fleet, whose requests then wait behind the user token's),
an admin token, and ready-to-paste curl and OpenAI SDK examples. Ctrl-C (or SIGTERM) stops everything it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from types import FrameType
from typing import Any

from engines.sim.launcher import SimProcess, free_port
from gateway.admission.tokens import mint_token, new_secret
from gateway.settings import Settings, parse_settings

MODEL = "demo-llama"
SERVED = {"vllm": "meta-llama/Llama-3.1-8B-Instruct", "sglang": "meta-llama/Llama-3.1-8B-Instruct"}
#: the demo's embedding model, served by one simulator of each dialect
EMBED_MODEL = "demo-embed"
EMBED_SERVED = "BAAI/bge-small-en-v1.5"
EMBED_DIM = 384
RERANK_MODEL = "demo-rerank"
AUDIO_MODEL = "demo-whisper"


@dataclass(frozen=True)
class SideModel:
    """A model beside the chat model, served by one simulator of each dialect."""

    name: str
    task: str
    served: str
    #: the pools' name after their dialect's (`vllm-embed`)
    pool: str
    #: what makes a simulator this model
    flags: tuple[str, ...]
    settings: tuple[tuple[str, int], ...] = ()


SIDE_MODELS = (
    SideModel(
        EMBED_MODEL,
        "embed",
        EMBED_SERVED,
        "embed",
        ("--embedding-dim", str(EMBED_DIM), "--max-model-len", "512"),
        (("context_length", 512),),
    ),
    SideModel(
        RERANK_MODEL,
        "score",
        "BAAI/bge-reranker-v2-m3",
        "rerank",
        ("--reranker", "--max-model-len", "512"),
        (("context_length", 512),),
    ),
    SideModel(
        AUDIO_MODEL,
        "transcribe",
        "openai/whisper-large-v3",
        "audio",
        ("--speech-to-text",),
        (("default_max_tokens", 448),),
    ),
)
#: the demo user's tier: limits whose x-ratelimit-* headers show on every answer
USER_LIMITS = {"requests_per_minute": 60, "tokens_per_minute": 100_000, "concurrent_requests": 8}
#: the tight tier: a few quick requests hit 429
TIGHT_LIMITS = {"requests_per_minute": 3, "tokens_per_minute": 20_000, "concurrent_requests": 1}
#: the batch tier: enough streams and requests a minute that a load generator saturates the fleet
#: before any limit answers 429; its requests are of the flow class `batch` (docs/flow-control.md)
BATCH_LIMITS = {"requests_per_minute": 100_000, "tokens_per_minute": 100_000_000, "concurrent_requests": 1024}


def demo_config(
    backend_urls: dict[str, list[str]],
    port: int,
    host: str = "127.0.0.1",
    side_urls: dict[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The demo's settings as a plain mapping (also used by tests): two pools of two backends, and
    for each side model in `side_urls` (its name → dialect → URL) one pool of each dialect."""
    config: dict[str, Any] = {
        "server": {"host": host, "port": port, "graceful_shutdown_s": 5},
        "models": [
            {
                "name": MODEL,
                "context_length": 8192,
                "price": {"prompt": 0.15, "cached_prompt": 0.075, "completion": 0.6},
            }
        ],
        "pools": [
            {
                "name": name,
                "dialect": name,
                "weight": 0.5,
                "models": {MODEL: SERVED[name]},
                "backends": [{"name": f"{name}-{i}", "url": url} for i, url in enumerate(urls)],
            }
            for name, urls in backend_urls.items()
        ],
        "routing": {
            "rules": [
                {"name": "long-prompt", "min_prompt_tokens": 2048, "pools": ["sglang"]},
                {"name": "tools", "has_tools": True, "pools": ["sglang"]},
            ],
            "scrape_interval_s": 2.0,
        },
        "upstream": {"health": {"interval_s": 2.0}},
        "limits": {
            "tiers": {
                "default": dict(USER_LIMITS),
                "tight": dict(TIGHT_LIMITS),
                "batch": {**BATCH_LIMITS, "priority_class": "batch"},
            },
            # the admin token has no tier: the default tier's limits apply to it as well
        },
    }
    for side in SIDE_MODELS:
        urls = (side_urls or {}).get(side.name)
        if not urls:
            continue
        config["models"].append({"name": side.name, "task": side.task, **dict(side.settings)})
        config["pools"].extend(
            {
                "name": f"{name}-{side.pool}",
                "dialect": name,
                "weight": 0.5,
                "models": {side.name: side.served},
                "backends": [{"name": f"{name}-{side.pool}-0", "url": url}],
            }
            for name, url in urls.items()
        )
    return config


def side_sim_flags(side: SideModel) -> list[str]:
    return ["--model", side.served, *side.flags]


def sim_flags(engine: str) -> list[str]:
    flags = ["--model", SERVED[engine], "--max-model-len", "8192"]
    if engine == "vllm":
        flags += [
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--enable-prompt-tokens-details",
        ]
    else:
        flags += ["--enable-metrics", "--tool-call-parser", "qwen25", "--enable-cache-report"]
    return flags


def _limits(limits: dict[str, int]) -> str:
    return (
        f"{limits['requests_per_minute']:,} requests/min, {limits['tokens_per_minute']:,} tokens/min, "
        f"{limits['concurrent_requests']} concurrent"
    )


def _banner(
    base: str,
    user_token: str,
    admin_token: str,
    with_auth: bool,
    tight_token: str = "",
    batch_token: str = "",
) -> str:
    auth = f'-H "Authorization: Bearer {user_token}" ' if with_auth else ""
    key = user_token if with_auth else "unused"
    limits = (
        f"""
Limits per user (every answer's x-ratelimit-* headers show them):
  user token   tier default: {_limits(USER_LIMITS)}
  tight token  tier tight:   {_limits(TIGHT_LIMITS)}: the 4th quick request gets 429
  {tight_token}
  for i in 1 2 3 4 5; do curl -s -o /dev/null -w "%{{http_code}} " {base}/v1/chat/completions \\
    -H "Authorization: Bearer {tight_token}" -H "Content-Type: application/json" \\
    -d '{{"model": "{MODEL}", "max_tokens": 5, "messages": [{{"role": "user", "content": "Hi"}}]}}'; done; echo
  Spend so far (admin): curl -s "{base}/admin/spend?user=demo-user" -H "Authorization: Bearer {admin_token}"
  batch token  tier batch:   {_limits(BATCH_LIMITS)}, class batch: at saturation its requests wait
  {batch_token}
  Flood with it (the user token stays fast; watch {base}/admin/flow or the console's Queues):
  for i in $(seq 400); do curl -s -o /dev/null {base}/v1/chat/completions -H "Authorization: Bearer {batch_token}" -H "Content-Type: application/json" -d "{{\\"model\\": \\"{MODEL}\\", \\"max_tokens\\": 300, \\"messages\\": [{{\\"role\\": \\"user\\", \\"content\\": \\"$(printf 'page %.0s' $(seq 1800))\\"}}]}}" & done; wait
"""
        if with_auth and tight_token
        else ""
    )
    return f"""
LLM gateway demo — 2 vLLM-dialect + 2 SGLang-dialect simulators (and one of each dialect for the
embedding, rerank and speech-to-text models) behind one gateway

  base URL     {base}/v1   (OpenAI: chat, completions, responses, embeddings, audio; Anthropic: /v1/messages)
  model        {MODEL}   embeddings: {EMBED_MODEL}
  also         rerank and score: {RERANK_MODEL}   speech to text: {AUDIO_MODEL}   (and /tokenize)
  user token   {user_token}
  admin token  {admin_token}
  console      {base}/admin/ui   (the admin console: sign in with the admin token)
{limits}
curl:
  curl -s {base}/v1/chat/completions {auth}-H "Content-Type: application/json" \\
    -d '{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  curl -sN {base}/v1/chat/completions {auth}-H "Content-Type: application/json" \\
    -d '{{"model": "{MODEL}", "stream": true, "stream_options": {{"include_usage": true}}, "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  curl -s {base}/v1/responses {auth}-H "Content-Type: application/json" \\
    -d '{{"model": "{MODEL}", "input": "Hello!"}}'

  curl -s {base}/v1/messages {auth.replace("Authorization: Bearer", "x-api-key:")}-H "Content-Type: application/json" \\
    -d '{{"model": "{MODEL}", "max_tokens": 100, "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  curl -s {base}/v1/embeddings {auth}-H "Content-Type: application/json" \\
    -d '{{"model": "{EMBED_MODEL}", "input": ["Hello!", "How are you?"]}}'

  curl -s {base}/v1/rerank {auth}-H "Content-Type: application/json" \\
    -d '{{"model": "{RERANK_MODEL}", "query": "Where is Paris?", "documents": ["Paris is in France.", "Bananas are yellow."]}}'

OpenAI SDK (Python):
  from openai import OpenAI
  client = OpenAI(base_url="{base}/v1", api_key="{key}")
  print(client.chat.completions.create(model="{MODEL}", messages=[{{"role": "user", "content": "Hello!"}}]).choices[0].message.content)
  for chunk in client.chat.completions.create(model="{MODEL}", messages=[{{"role": "user", "content": "Hi"}}], stream=True):
      print(chunk.choices[0].delta.content or "", end="", flush=True) if chunk.choices else None

Pin a pool (admin token only): add -H "x-gateway-pool: sglang" (or vllm); see x-gateway-route in the answer headers.
Ctrl-C stops everything.
"""


def _exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def run_demo(port: int = 8080, host: str = "127.0.0.1") -> None:
    from gateway.app import Gateway
    from gateway.server import configure_logging, run_single

    # uvicorn shuts down on SIGTERM and then re-raises the signal with the handler it found; with the
    # default one the process would die there, before the ExitStack stops the simulators.
    signal.signal(signal.SIGTERM, _exit)
    secret = os.environ.get("GATEWAY_JWT_SECRET") or new_secret()
    os.environ["GATEWAY_JWT_SECRET"] = secret
    with contextlib.ExitStack() as stack:
        urls: dict[str, list[str]] = {"vllm": [], "sglang": []}
        for engine in ("vllm", "vllm", "sglang", "sglang"):
            sim = stack.enter_context(SimProcess(engine, free_port(), sim_flags(engine)))
            urls[engine].append(sim.base_url)
        sides = {
            side.name: {
                e: stack.enter_context(SimProcess(e, free_port(), side_sim_flags(side))).base_url
                for e in urls
            }
            for side in SIDE_MODELS
        }
        settings: Settings = parse_settings(demo_config(urls, port, host, sides))
        configure_logging(settings.server.log_level)
        banner = _banner(
            f"http://{host}:{port}",
            mint_token(secret, "demo-user", tier="default"),
            mint_token(secret, "demo-admin", roles=["admin"]),
            with_auth=settings.auth.active,
            tight_token=mint_token(secret, "demo-tight", tier="tight"),
            batch_token=mint_token(secret, "demo-batch", tier="batch"),
        )
        # The banner goes out once the gateway serves, so what it offers works when it is read.
        gateway = Gateway(settings, on_ready=lambda: print(banner, flush=True))
        run_single(gateway, settings)
