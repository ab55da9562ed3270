"""`/admin/routes/explain` (a dry run of routing) and `/admin/reload` (the config file, everywhere)."""

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from engines.errors import invalid_request
from gateway.control.admin.common import Admin, Ctx, json_response, written
from gateway.control.admin.pools import OkResponse

router = APIRouter()


@router.post("/admin/routes/explain", summary="Dry-run routing for a request body")
@router.get(
    "/admin/routes/explain",
    summary="Dry-run routing for a request body (sent as the body)",
    operation_id="explain_get",
)
async def explain(request: Request, who: Admin, ctx: Ctx) -> Response:
    raw = await request.body()
    if not raw:
        raise invalid_request("Send the chat or completions request to explain as the JSON body.")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise invalid_request("The body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise invalid_request("The body must be a JSON object.")
    return json_response(200, ctx.explain(body, request.headers.get("x-gateway-pool")))


@router.post(
    "/admin/reload",
    response_model=OkResponse,
    summary="Re-read the config file (pools and backends) on every replica",
)
async def reload(who: Admin, ctx: Ctx) -> Response:
    await ctx.control.reload_config(who)
    return json_response(200, written(ctx))
