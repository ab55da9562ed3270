"""`/admin/routes/explain` (a dry run of routing) and `/admin/reload` (the config file, everywhere)."""

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from engines.errors import invalid_request
from gateway.control.admin.common import Admin, Ctx, json_response
from gateway.control.verbs import ConfigRefused

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
    headers = request.headers
    return json_response(
        200, ctx.explain(body, headers.get("x-gateway-pool"), headers.get("x-gateway-priority"))
    )


@router.post(
    "/admin/reload",
    summary="Re-read the config file on every replica: what changed, what applied, what needs a restart",
)
async def reload(who: Admin, ctx: Ctx) -> Response:
    try:
        return json_response(200, await ctx.control.reload_config(who))
    except ConfigRefused as refused:
        problems = refused.problems
        lines = "; ".join(_line(p) for p in problems[:5])
        error = {
            "message": f"The config file has {len(problems)} problem(s); nothing was changed: {lines}",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_config",
            "problems": problems,
        }
        return json_response(400, {"error": error})


def _line(problem: dict[str, Any]) -> str:
    where = (
        f"{problem.get('file')}:{problem['line']}" if problem.get("line") else str(problem.get("file") or "")
    )
    key = problem.get("key")
    return ": ".join(x for x in (where, key, problem.get("message")) if x)
