"""`gateway demo`: the embedded default.

Starts two vLLM-dialect and two SGLang-dialect simulators on free loopback ports and a gateway in
front of them, with in-memory state (Redis when `REDIS_URL` is set) and a JWT secret from
`GATEWAY_JWT_SECRET` (generated when unset). Prints the base URL, a user token (tier `default`: 60
requests/min, 100k tokens/min, 8 concurrent — the `x-ratelimit-*` headers show them), a tight token
(tier `tight`: 3 requests/min, so a few quick requests get 429), an admin token, and ready-to-paste
curl and OpenAI SDK examples. Ctrl-C stops everything it started.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from engines.sim.launcher import SimProcess, free_port
from gateway.admission.tokens import mint_token, new_secret
from gateway.settings import Settings, parse_settings

MODEL = "demo-llama"
SERVED = {"vllm": "meta-llama/Llama-3.1-8B-Instruct", "sglang": "meta-llama/Llama-3.1-8B-Instruct"}
#: the demo user's tier: limits whose x-ratelimit-* headers show on every answer
USER_LIMITS = {"requests_per_minute": 60, "tokens_per_minute": 100_000, "concurrent_requests": 8}
#: the tight tier: a few quick requests hit 429
TIGHT_LIMITS = {"requests_per_minute": 3, "tokens_per_minute": 20_000, "concurrent_requests": 1}


def demo_config(backend_urls: dict[str, list[str]], port: int, host: str = "127.0.0.1") -> dict[str, Any]:
    """The demo's settings as a plain mapping (also used by tests): two pools of two backends."""
    return {
        "server": {"host": host, "port": port, "graceful_shutdown_s": 5},
        "models": [
            {
                "name": MODEL,
                "context_length": 8192,
                "owned_by": "demo",
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
            "tiers": {"default": dict(USER_LIMITS), "tight": dict(TIGHT_LIMITS)},
            # the admin token has no tier: the default tier's limits apply to it as well
        },
    }


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
        f"{limits['requests_per_minute']} requests/min, {limits['tokens_per_minute']:,} tokens/min, "
        f"{limits['concurrent_requests']} concurrent"
    )


def _banner(base: str, user_token: str, admin_token: str, with_auth: bool, tight_token: str = "") -> str:
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
"""
        if with_auth and tight_token
        else ""
    )
    return f"""
LLM gateway demo — 2 vLLM-dialect + 2 SGLang-dialect simulators behind one gateway

  base URL     {base}/v1
  model        {MODEL}
  user token   {user_token}
  admin token  {admin_token}
{limits}
curl:
  curl -s {base}/v1/chat/completions {auth}-H "Content-Type: application/json" \\
    -d '{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  curl -sN {base}/v1/chat/completions {auth}-H "Content-Type: application/json" \\
    -d '{{"model": "{MODEL}", "stream": true, "stream_options": {{"include_usage": true}}, "messages": [{{"role": "user", "content": "Hello!"}}]}}'

OpenAI SDK (Python):
  from openai import OpenAI
  client = OpenAI(base_url="{base}/v1", api_key="{key}")
  print(client.chat.completions.create(model="{MODEL}", messages=[{{"role": "user", "content": "Hello!"}}]).choices[0].message.content)
  for chunk in client.chat.completions.create(model="{MODEL}", messages=[{{"role": "user", "content": "Hi"}}], stream=True):
      print(chunk.choices[0].delta.content or "", end="", flush=True) if chunk.choices else None

Pin a pool (admin token only): add -H "x-gateway-pool: sglang" (or vllm); see x-gateway-route in the answer headers.
Ctrl-C stops everything.
"""


def run_demo(port: int = 8080, host: str = "127.0.0.1") -> None:
    from gateway.app import Gateway
    from gateway.server import configure_logging, run_single

    secret = os.environ.get("GATEWAY_JWT_SECRET") or new_secret()
    os.environ["GATEWAY_JWT_SECRET"] = secret
    with contextlib.ExitStack() as stack:
        urls: dict[str, list[str]] = {"vllm": [], "sglang": []}
        for engine in ("vllm", "vllm", "sglang", "sglang"):
            sim = stack.enter_context(SimProcess(engine, free_port(), sim_flags(engine)))
            urls[engine].append(sim.base_url)
        settings: Settings = parse_settings(demo_config(urls, port, host))
        configure_logging(settings.server.log_level)
        gateway = Gateway(settings)
        base = f"http://{host}:{port}"
        print(
            _banner(
                base,
                mint_token(secret, "demo-user", tier="default"),
                mint_token(secret, "demo-admin", roles=["admin"]),
                with_auth=getattr(gateway, "auth_enabled", False),
                tight_token=mint_token(secret, "demo-tight", tier="tight"),
            ),
            flush=True,
        )
        run_single(gateway, settings)
