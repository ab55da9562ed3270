"""One structured JSON line per request on the `gateway.access` logger.

Fields (docs/metrics.md lists them with their types): time, request id, principal and tenant,
endpoint (the client's API: chat, completions, responses, embeddings, messages, …), model, stream, pool, backend name (an operator's name, never shown to clients), status,
prompt/completion/cached/total tokens, TTFT and duration in milliseconds, route reason, affinity
outcome, attempts, error kind. No prompt text is logged unless `access_log.include_text` is set
(then the request body, as received); the gateway relays completions without keeping their text,
so completion text is never logged.
"""

from __future__ import annotations

import logging
import time

import orjson

from gateway.core.context import RequestContext
from gateway.observability.settings import AccessLogSettings

log = logging.getLogger("gateway.access")


class AccessLog:
    def __init__(self, settings: AccessLogSettings) -> None:
        self.enabled = settings.enabled
        self.include_text = settings.include_text

    def write(self, ctx: RequestContext, now: float) -> None:
        if not self.enabled or not log.isEnabledFor(logging.INFO):
            return
        usage = ctx.usage
        line: dict[str, object] = {
            "ts": round(time.time(), 3),
            "request_id": ctx.request_id,
            "principal": ctx.principal.user,
            "tenant": ctx.principal.tenant,
            "class": ctx.flow_class or None,
            "endpoint": ctx.api,
            "model": ctx.model.name if ctx.model else None,
            "stream": ctx.stream,
            "pool": ctx.pool.name if ctx.pool else None,
            "backend": ctx.backend.name if ctx.backend else None,
            "status": ctx.status,
            "prompt_tokens": usage.prompt_tokens if usage else None,
            "completion_tokens": usage.completion_tokens if usage else None,
            "cached_tokens": usage.cached_tokens if usage else None,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens if usage else None,
            "ttft_ms": round((ctx.first_token_at - ctx.started) * 1000, 2) if ctx.first_token_at else None,
            "duration_ms": round((now - ctx.started) * 1000, 2),
            "route": ctx.route_reason or None,
            "affinity": ctx.affinity if ctx.pool else None,
            "attempts": ctx.attempts,
            "error": ctx.error_kind,
        }
        if self.include_text:
            line["request_body"] = ctx.raw_body.decode("utf-8", "replace")
        log.info(orjson.dumps(line).decode())
