"""`gateway check`: after a deploy, does every engine do what the gateway needs of it?

For each pool and each backend, through the gateway (admin requests pinned to the backend with
`x-gateway-backend`, so nothing fails over and the engine itself answers):

1. chat       a plain chat answers, with usage;
2. stream     a streamed chat sends content, the usage chunk and `[DONE]`;
3. reasoning  a chat with thinking on returns reasoning (a warning only: not every model reasons);
4. tools      `tool_choice: required` returns a tool call (pools with `tool_calling`);
5. json       a `json_schema` answer parses as JSON (pools with `structured_output`);
6. cache      the same long prompt twice: the second reports cached tokens;
7. kv         the gateway hears the engine's KV-cache events (`gateway_kv_stream_usable`), where
              they are configured.

The table names each pool, its engine and backend; each failure says what to fix. Exit status: 0 all
passed (warnings allowed), 1 a check failed, 2 the gateway could not be asked. `--url` checks a
running gateway with an admin token; `--config` starts one from the file in this process (no port,
an admin key of its own) and checks through it.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import httpx

State = Literal["ok", "fail", "warn", "off"]
CHECKS = ("chat", "stream", "reasoning", "tools", "json", "cache", "kv")
MARK = {"ok": "ok", "fail": "FAIL", "warn": "warn", "off": "-"}
#: a prompt long enough to fill several KV blocks, so a repeat finds it cached
LONG_PROMPT = " ".join(f"Fact {i}: the gateway keeps engine caches warm." for i in range(120))
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


@dataclass(frozen=True, slots=True)
class Outcome:
    state: State
    note: str = ""


@dataclass(slots=True)
class Row:
    pool: str
    engine: str
    backend: str
    model: str
    results: dict[str, Outcome]


class Unreachable(Exception):
    """The gateway or its admin API could not be asked (exit status 2)."""


async def run_checks(http: httpx.AsyncClient, metrics: Callable[[], Awaitable[str]]) -> list[Row]:
    """Every backend of every pool, checked through the gateway `http` speaks to (admin headers set)."""
    try:
        r = await http.get("/admin/pools")
    except httpx.HTTPError as exc:
        raise Unreachable(f"the gateway does not answer ({type(exc).__name__}: {exc})") from None
    if r.status_code != 200:
        raise Unreachable(
            f"GET /admin/pools answered {r.status_code}: {_message(r)} (is the token an admin's?)"
        )
    rows = []
    for pool in r.json()["pools"]:
        for backend in pool["backends"]:
            rows.append(await _check_backend(http, pool, backend["name"]))
    text = await metrics()
    for row in rows:
        row.results["kv"] = _kv(text, row.backend)
    return rows


async def _check_backend(http: httpx.AsyncClient, pool: dict[str, Any], backend: str) -> Row:
    headers = {"x-gateway-backend": backend}
    results: dict[str, Outcome] = {}
    model = ""
    for candidate in pool["models"]:  # the first model that chats (one of another task does not)
        r = await _chat(http, headers, candidate, {"messages": _ask("Say hello."), "max_tokens": 16})
        if r.status_code == 400 and _param(r) == "model":
            continue
        model = candidate
        results["chat"] = _chat_outcome(r)
        break
    row = Row(pool["name"], pool["dialect"], backend, model, results)
    if not model:
        results["chat"] = Outcome("off", "no model of this pool chats")
        return row
    if results["chat"].state == "fail":  # the engine cannot answer: the rest would say the same
        for name in CHECKS[1:-1]:
            results[name] = Outcome("fail", "not tried: chat failed")
        return row
    results["stream"] = await _stream(http, headers, model)
    results["reasoning"] = await _reasoning(http, headers, model)
    results["tools"] = await _tools(http, headers, model) if pool["tool_calling"] else Outcome("off")
    results["json"] = await _json(http, headers, model) if pool["structured_output"] else Outcome("off")
    results["cache"] = await _cache(http, headers, model, pool["dialect"])
    return row


def _ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def _chat(
    http: httpx.AsyncClient, headers: dict[str, str], model: str, body: dict[str, Any]
) -> httpx.Response:
    return await http.post("/v1/chat/completions", json={"model": model, **body}, headers=headers)


def _param(r: httpx.Response) -> object:
    try:
        return r.json()["error"]["param"]
    except (ValueError, KeyError, TypeError):
        return None


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text[:200]


def _failed(r: httpx.Response) -> Outcome:
    text = _message(r)
    if "credentials" in text:
        fix = "the engine refuses the gateway's key: set pools[].api_key_env / api_key_file to its --api-key"
    elif "misconfigured" in text:
        fix = (
            "the engine does not serve the configured name: check pools[].models against --served-model-name"
        )
    elif r.status_code in (502, 503, 504):
        fix = "the engine is unreachable, down or too slow: check its URL, its health and the gateway's log"
    else:
        fix = text
    return Outcome("fail", f"{r.status_code}: {fix}")


def _chat_outcome(r: httpx.Response) -> Outcome:
    if r.status_code != 200:
        return _failed(r)
    usage = r.json().get("usage") or {}
    return (
        Outcome("ok") if usage.get("completion_tokens", 0) > 0 else Outcome("fail", "no usage in the answer")
    )


async def _stream(http: httpx.AsyncClient, headers: dict[str, str], model: str) -> Outcome:
    body = {"model": model, "messages": _ask("Count to five."), "max_tokens": 16, "stream": True}
    body["stream_options"] = {"include_usage": True}
    r = await http.post("/v1/chat/completions", json=body, headers=headers)
    if r.status_code != 200:
        return _failed(r)
    events = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return Outcome("fail", "the stream did not end with [DONE]")
    chunks = [json.loads(e) for e in events[:-1]]
    if any("error" in c for c in chunks):
        return Outcome("fail", "the stream ended with an error event")
    if not any((c.get("usage") or {}).get("completion_tokens") for c in chunks):
        return Outcome("fail", "no usage chunk")
    return Outcome("ok")


async def _reasoning(http: httpx.AsyncClient, headers: dict[str, str], model: str) -> Outcome:
    body = {
        "messages": _ask("Think, then say yes."),
        "max_tokens": 64,
        "chat_template_kwargs": {"enable_thinking": True},
    }
    r = await _chat(http, headers, model, body)
    if r.status_code != 200:
        return _failed(r)
    message = r.json()["choices"][0]["message"]
    if message.get("reasoning_content"):
        return Outcome("ok")
    return Outcome(
        "warn", "no reasoning returned: a model that does not reason, or an engine without --reasoning-parser"
    )


async def _tools(http: httpx.AsyncClient, headers: dict[str, str], model: str) -> Outcome:
    body = {
        "messages": _ask("What is the weather in Paris?"),
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",
    }
    r = await _chat(http, headers, model, {**body, "max_tokens": 64})
    if r.status_code != 200:
        return _failed(r)
    message = r.json()["choices"][0]["message"]
    if message.get("tool_calls"):
        return Outcome("ok")
    text = message.get("content") or ""
    if "<tool_call>" in text or '"name"' in text:
        return Outcome(
            "fail",
            "the tool call stayed in the text: start vLLM with --enable-auto-tool-choice --tool-call-parser "
            "<parser>, SGLang with --tool-call-parser <parser>, matching the model (or tool_calling: false)",
        )
    return Outcome(
        "fail", "no tool call within 64 tokens: does the model call tools (a parser that fits it)?"
    )


async def _json(http: httpx.AsyncClient, headers: dict[str, str], model: str) -> Outcome:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    r = await _chat(
        http,
        headers,
        model,
        {"messages": _ask("Is the sky blue? Answer in JSON."), "max_tokens": 64, "response_format": fmt},
    )
    if r.status_code != 200:
        return _failed(r)
    content = r.json()["choices"][0]["message"].get("content") or ""
    try:
        parsed = json.loads(content)
    except ValueError:
        return Outcome(
            "fail", f"the answer is not JSON ({content[:60]!r}): is the engine's structured output on?"
        )
    return (
        Outcome("ok") if isinstance(parsed, dict) else Outcome("fail", "the answer is JSON but not an object")
    )


async def _cache(http: httpx.AsyncClient, headers: dict[str, str], model: str, engine: str) -> Outcome:
    body = {"messages": _ask(LONG_PROMPT + f" Nonce {secrets.token_hex(4)}."), "max_tokens": 1}
    cached = 0
    for _ in range(2):
        r = await _chat(http, headers, model, body)
        if r.status_code != 200:
            return _failed(r)
        details = (r.json().get("usage") or {}).get("prompt_tokens_details") or {}
        cached = int(details.get("cached_tokens") or 0)
    if cached > 0:
        return Outcome("ok")
    flag = (
        "--enable-prompt-tokens-details (and prefix caching on)"
        if engine == "vllm"
        else "--enable-cache-report"
    )
    return Outcome("fail", f"no cached tokens on a repeated prompt: start the engine with {flag}")


def _kv(metrics: str, backend: str) -> Outcome:
    """From the gateway's own metrics: is this backend's KV-event stream connected and usable?"""

    def sample(name: str) -> float | None:
        m = re.search(
            rf'^{name}\{{[^}}]*backend="{re.escape(backend)}"[^}}]*\}} (\S+)$', metrics, re.MULTILINE
        )
        return float(m.group(1)) if m else None

    usable = sample("gateway_kv_stream_usable")
    if usable is None:
        return Outcome("off", "KV events not configured for this backend")
    if usable >= 1:
        return Outcome("ok")
    connected = sample("gateway_kv_stream_connected")
    if not connected:
        return Outcome(
            "fail", "the gateway cannot connect to the engine's KV-event publisher: check --kv-events-config"
        )
    return Outcome(
        "fail", "events arrive but are not usable yet (no tokenizer for the model, or a gap being filled)"
    )


def table(rows: list[Row]) -> str:
    """The results, a line a backend, then a line per failure or warning with what to do."""
    head = ["pool", "engine", "backend", "model", *CHECKS]
    lines = [head] + [
        [
            r.pool,
            r.engine,
            r.backend,
            r.model,
            *(MARK[r.results.get(c, Outcome("off")).state] for c in CHECKS),
        ]
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines]
    notes = [
        f"{MARK[o.state]}  {r.pool}/{r.backend} {name}: {o.note}"
        for r in rows
        for name, o in r.results.items()
        if o.state in ("fail", "warn") and o.note
    ]
    return "\n".join(out + (["", *notes] if notes else []))


def failed(rows: list[Row]) -> bool:
    return any(o.state == "fail" for r in rows for o in r.results.values())


async def check_url(url: str, admin_token: str, metrics_token: str | None) -> list[Row]:
    headers = {"authorization": f"Bearer {admin_token}"}
    async with httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=60) as http:

        async def metrics() -> str:
            auth = {"authorization": f"Bearer {metrics_token}"} if metrics_token else {}
            r = await http.get("/metrics", headers=auth)
            return r.text if r.status_code == 200 else ""

        return await run_checks(http, metrics)


async def check_config(path: str) -> list[Row]:
    """Start a gateway from `path` in this process (an admin key of its own, no port) and check
    through it; it stops when done."""
    from gateway.admission.settings import AuthSettings, JwtSettings
    from gateway.admission.tokens import mint_token
    from gateway.app import Gateway
    from gateway.settings import load_settings

    secret = secrets.token_urlsafe(32)
    settings = load_settings(path)
    metrics = settings.metrics.model_copy(update={"enabled": True, "bearer_token": None})
    settings = settings.model_copy(
        update={"auth": AuthSettings(jwt=JwtSettings(secret=secret)), "metrics": metrics}
    )
    gateway = Gateway(settings)
    await gateway.startup()
    try:
        transport = httpx.ASGITransport(app=gateway)  # type: ignore[arg-type]
        headers = {"authorization": "Bearer " + mint_token(secret, "gateway-check", roles=["admin"])}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway", headers=headers, timeout=60
        ) as http:
            for _ in range(100):  # the first health probes (bounded: 10 s)
                if (await http.get("/readyz")).status_code == 200:
                    break
                await asyncio.sleep(0.1)

            async def scrape() -> str:
                return (await http.get("/metrics")).text

            return await run_checks(http, scrape)
    finally:
        await gateway.shutdown()
