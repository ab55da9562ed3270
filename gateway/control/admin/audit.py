"""`/admin/audit`: recent admin changes, newest first."""

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from gateway.control.admin.common import Admin, Ctx, json_response

router = APIRouter()


@router.get("/admin/audit", summary="Recent admin changes, newest first")
async def audit(who: Admin, ctx: Ctx, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Response:
    return json_response(200, {"entries": await ctx.control.store.audit(limit)})
