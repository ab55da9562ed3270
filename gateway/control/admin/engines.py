"""`/admin/engines/compare`: how the pools serving each model compare on the same traffic, over a
window (gateway/flow/compare.py records it; docs/operations.md, *Comparing engines*)."""

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from engines.errors import ApiError, invalid_request, model_not_found
from gateway.control.admin.common import Admin, Ctx, json_response

router = APIRouter()

#: the window a read may ask for, seconds: the figures are kept by the minute, for an hour
#: (gateway/flow/compare.py, `MIN_WINDOW_S`, `MAX_WINDOW_S`)
MIN_WINDOW_S = 60
MAX_WINDOW_S = 3600


@router.get(
    "/admin/engines/compare",
    summary="Per model × pool × traffic class: requests, TTFT and TPOT percentiles, error rate and "
    "output tokens/s over a window; which pool serves each class better; the rebalancing loop",
)
async def compare(
    who: Admin,
    ctx: Ctx,
    window_s: Annotated[str, Query(description=f"seconds, {MIN_WINDOW_S} to {MAX_WINDOW_S}")] = "900",
    model: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
) -> Response:
    window = int(window_s) if window_s.isdigit() else 0
    if not MIN_WINDOW_S <= window <= MAX_WINDOW_S:
        raise invalid_request(
            f"window_s must be a whole number of seconds from {MIN_WINDOW_S} to {MAX_WINDOW_S}, "
            f"not {window_s[:32]!r}.",
            param="window_s",
        )
    if model is not None and model not in ctx.served():
        raise model_not_found(model)
    if ctx.engines is None:
        raise ApiError(404, "The engine comparison is not recorded here.", code="not_recorded")
    return json_response(200, await ctx.engines(window, model))
