"""The request path: one explicit, ordered list of stages over one `RequestContext`.

Each stage is `async (ctx) -> Response | None`: `None` continues with the next stage, a `Response`
ends the pipeline (an error, or the proxied answer). A stage may raise `ApiError`, which becomes the
response in the shape of the request's API (`ctx.render_error`: OpenAI's, or Anthropic's). The lists
are assembled once at start-up (`Gateway.build_pipelines` in gateway/app.py, one per API), so the
order of each request path is visible in one place. Chat and completions run

    authenticate → parse → validate → sanitise → admit → route → proxy
                                                          (adapt request, upstream, adapt response)

`authenticate` is left out when auth is off and `admit` when no limit or budget can apply. The
Responses and Messages APIs add their intake stage (gateway/apis/) after `parse`; Messages'
`count_tokens` answers in place of route and proxy; embeddings run authenticate → parse → embeddings
intake → admit → route → proxy; a stored response's lookups run authenticate → lookup.

The backend's share of a request (in flight, queued prefill, the circuit's verdict) is settled when
the engine's part ends, by the attempt's lease (gateway/upstream/lease.py). Once the response has been
sent, or abandoned by the client, the gateway ends the request in this order (`Gateway._proxy`):

1. the context's finalizers, newest first (`run_finalizers`): admission reconciles the tokens and
   spend it reserved with the usage and releases the caller's concurrency slot;
2. the request's metrics;
3. the access log line;
4. the request's trace, when tracing is on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from engines.errors import ApiError, server_error
from gateway.core.context import RequestContext
from gateway.core.responses import Response, error_response

log = logging.getLogger("gateway.pipeline")


class Stage(Protocol):
    name: str

    async def __call__(self, ctx: RequestContext) -> Response | None: ...


class Pipeline:
    __slots__ = ("stages",)

    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = tuple(stages)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    async def run(self, ctx: RequestContext) -> Response:
        try:
            for stage in self.stages:
                response = await stage(ctx)
                if response is not None:
                    return response
        except ApiError as err:
            ctx.error_kind = ctx.error_kind or f"status_{err.status}"
            return error_response(err, ctx.response_headers, ctx.render_error)
        except Exception:
            log.exception("request %s failed inside the gateway", ctx.request_id)
            ctx.error_kind = "internal"
            return error_response(server_error(), ctx.response_headers, ctx.render_error)
        ctx.error_kind = "internal"
        log.error("pipeline ended without a response (stages: %s)", ", ".join(self.names))
        return error_response(server_error(), ctx.response_headers, ctx.render_error)


async def run_finalizers(ctx: RequestContext) -> None:
    """Run the context's finalizers newest first; one failing never stops the others."""
    while ctx.finalizers:
        fin = ctx.finalizers.pop()
        try:
            result = fin(ctx)
            if result is not None:
                await result
        except Exception:
            log.exception("finalizer failed for request %s", ctx.request_id)
