"""`/admin/spend`: what a user, tenant or API key spent per UTC day and month, by model, with budgets."""

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response

from engines.errors import ApiError
from gateway.control.admin.common import Admin, Ctx, json_response

router = APIRouter()

KeyId = Annotated[str | None, Query(min_length=1, max_length=64, description="an API key id (key_…)")]
Tier = Annotated[str | None, Query(min_length=1, max_length=64, description="the user's tier (its budgets)")]
Day = Annotated[
    str | None, Query(min_length=7, max_length=10, description="YYYY-MM-DD or YYYY-MM (default: now)")
]
Name = Annotated[str | None, Query(min_length=1, max_length=256)]


@router.get(
    "/admin/spend",
    summary="One user's, tenant's or API key's spend per UTC day and month, by model, with budgets; "
    "no scope: every user's, largest first",
)
async def spend_report(
    who: Admin,
    ctx: Ctx,
    user: Name = None,
    tenant: Name = None,
    key: KeyId = None,
    tier: Tier = None,
    period: Annotated[Literal["day", "month"] | None, Query(description="default: both")] = None,
    date: Day = None,
    model: Name = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="without a scope: users per page")] = 50,
    offset: Annotated[int, Query(ge=0, description="without a scope: users to skip")] = 0,
) -> Response:
    if ctx.spend is None:
        raise ApiError(404, "Spend is not recorded (no admission stage).", code="spend_disabled")
    report = await ctx.spend(
        user=user,
        tenant=tenant,
        key_id=key,
        tier=tier,
        periods=("day", "month") if period is None else (period,),
        date=date,
        model=model,
        limit=limit,
        offset=offset,
    )
    return json_response(200, report)
