"""`/admin/pools`: the fleet as this replica sees it, pool weights, and backends added to a pool."""

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel, Field

from engines.errors import ApiError
from gateway.control.admin.common import Admin, Ctx, json_response, not_found, written

router = APIRouter()


class WeightBody(BaseModel):
    weight: float = Field(
        ge=0, le=1_000_000, description="the pool's new routing weight; 0 takes it out of rotation"
    )


class BackendBody(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    url: str = Field(pattern=r"^https?://[^\s/]+(:\d+)?/?$", description="http://host:port of the engine")


class OkResponse(BaseModel):
    ok: bool = True
    shared: bool = Field(description="true when the change is persisted in Redis and shared by every replica")
    persisted: bool = Field(
        description="false when Redis was unreachable: applied on this replica only, written when Redis is back"
    )


@router.get("/admin/pools", summary="Pools with weights, backends, health, in-flight and recent load")
async def pools(who: Admin, ctx: Ctx) -> Response:
    control = ctx.control
    pending = [
        {"action": p.entry.action, "target": p.entry.target, "after": p.entry.after, "ts": p.entry.ts}
        for p in control.pending
    ]
    body = {
        "pools": control.describe_fleet(),
        "removed_backends": control.removed_backends(),
        "shared_state": control.store.shared,
        "not_persisted": pending,
    }
    return json_response(200, body)


@router.put("/admin/pools/{pool}/weight", response_model=OkResponse, summary="Set a pool's routing weight")
async def set_weight(pool: str, body: WeightBody, who: Admin, ctx: Ctx) -> Response:
    control = ctx.control
    current = control.fleet.pools.get(pool)
    if current is None:
        raise not_found("pool", pool, "pool_not_found")
    persisted = await control.change_fleet(
        who, "set_weight", pool, current.weight, body.weight, updates={f"weight:{pool}": body.weight}
    )
    return json_response(200, {**written(ctx, persisted), "pool": control.describe_pool(pool)})


@router.delete(
    "/admin/pools/{pool}/weight",
    response_model=OkResponse,
    summary="Return a pool's weight to the config file's (the rebalancing loop's, when it set one)",
)
async def reset_weight(pool: str, who: Admin, ctx: Ctx) -> Response:
    control = ctx.control
    current = control.fleet.pools.get(pool)
    if current is None:
        raise not_found("pool", pool, "pool_not_found")
    back_to = "rebalance" if pool in control.overrides.rebalanced else "file"
    persisted = await control.change_fleet(
        who, "reset_weight", pool, current.weight, back_to, deletes=[f"weight:{pool}"]
    )
    return json_response(200, {**written(ctx, persisted), "pool": control.describe_pool(pool)})


@router.post(
    "/admin/pools/{pool}/backends",
    status_code=201,
    response_model=OkResponse,
    summary="Add a backend to a pool",
)
async def add_backend(pool: str, body: BackendBody, who: Admin, ctx: Ctx) -> Response:
    control = ctx.control
    if pool not in control.fleet.pools:
        raise not_found("pool", pool, "pool_not_found")
    if body.name in control.fleet.backends:
        raise ApiError(409, f"A backend named {body.name!r} exists.", code="backend_exists")
    url = body.url.rstrip("/")
    persisted = await control.change_fleet(
        who,
        "add_backend",
        body.name,
        None,
        {"pool": pool, "url": url},
        updates={f"add:{body.name}": {"pool": pool, "url": url}},
        deletes=[f"remove:{body.name}"],
    )
    return json_response(201, {**written(ctx, persisted), "backend": control.describe_backend(body.name)})
