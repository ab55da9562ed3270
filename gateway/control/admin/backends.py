"""`/admin/backends/{name}`: remove a backend, drain or undrain it."""

from typing import Annotated

from fastapi import APIRouter, Body
from fastapi.responses import Response
from pydantic import BaseModel

from gateway.control.admin.common import Admin, Ctx, json_response, not_found, written
from gateway.control.admin.pools import OkResponse

router = APIRouter()


class DrainBody(BaseModel):
    draining: bool = True


@router.delete(
    "/admin/backends/{name}",
    response_model=OkResponse,
    summary="Remove a backend (in-flight requests finish)",
)
async def remove_backend(name: str, who: Admin, ctx: Ctx) -> Response:
    control = ctx.control
    backend = control.fleet.backends.get(name)
    if backend is None:
        raise not_found("backend", name, "backend_not_found")
    before = {"pool": backend.pool, "url": backend.url}
    persisted = await control.change_fleet(
        who,
        "remove_backend",
        name,
        before,
        None,
        updates={f"remove:{name}": True},
        deletes=[f"add:{name}", f"drain:{name}"],
    )
    return json_response(200, {**written(ctx, persisted), "removed": name})


@router.put(
    "/admin/backends/{name}/drain",
    response_model=OkResponse,
    summary="Drain (no new requests) or undrain a backend",
)
async def drain(
    name: str, who: Admin, ctx: Ctx, body: Annotated[DrainBody | None, Body()] = None
) -> Response:
    control = ctx.control
    draining = (body or DrainBody()).draining
    backend = control.fleet.backends.get(name)
    if backend is None:
        raise not_found("backend", name, "backend_not_found")
    if draining:
        persisted = await control.change_fleet(
            who, "drain", name, backend.draining, True, updates={f"drain:{name}": True}
        )
    else:
        persisted = await control.change_fleet(
            who, "undrain", name, backend.draining, False, deletes=[f"drain:{name}"]
        )
    return json_response(200, {**written(ctx, persisted), "backend": control.describe_backend(name)})


@router.post("/admin/backends/{name}/drain", response_model=OkResponse, summary="Drain a backend")
async def drain_post(name: str, who: Admin, ctx: Ctx) -> Response:
    return await drain(name, who, ctx, DrainBody(draining=True))
