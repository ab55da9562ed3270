"""`GET /admin/flow`: the flow-control queues (docs/flow-control.md): the classes as configured, this
replica's queues (waiting by class, oldest wait, shed counts, saturated backends) and every replica's
waiting requests by class as the shared store last heard them (without Redis: this replica's only)."""

from fastapi import APIRouter
from fastapi.responses import Response

from gateway.control.admin.common import Admin, Ctx, json_response

router = APIRouter()


@router.get("/admin/flow", summary="Flow control: classes, queues by class, shed counts, saturated backends")
async def flow(who: Admin, ctx: Ctx) -> Response:
    return json_response(200, await ctx.flow())
