"""The request path: one explicit, ordered list of stages over one `RequestContext`.

Each stage is `async (ctx) -> Response | None`: `None` continues with the next stage, a `Response`
ends the pipeline (an error, or the proxied answer). A stage may raise `ApiError`, which becomes the
response in the shape of the request's API (`ctx.render_error`: OpenAI's, or Anthropic's). The list
is assembled once at start-up (`gateway.app.build_pipeline`, one list per API), so the order of
the request path is visible in one place:

    parse → authenticate → validate → admit → route → proxy (adapt request, upstream, adapt response)

After the response has been sent (or abandoned by the client), the context's finalizers run: that is
where accounting (usage reconciliation, metrics, the access log, releasing slots) happens.
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
