"""What every admin router shares: the context the app carries, the admin-role dependency, and the
JSON answer (never cached: a new API key's plaintext is in one).

The routers are module-level FastAPI `APIRouter`s; what they act on is not captured in closures but
read from `request.app.state.admin` (an `AdminContext`, set once by `build_admin_app`).
"""

from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Annotated, Any

import orjson
from fastapi import Depends, Request
from fastapi.responses import Response

from engines.errors import ApiError
from gateway.admission import ApiKeys, SpendQuery
from gateway.control.verbs import FleetControl
from gateway.core.context import Principal

#: the caller's principal if it may use the admin API (request headers, lower-case names); raises
#: ApiError 401/403 otherwise (gateway/admission/assembly.py `Admission.authorize_admin`)
Authorize = Callable[[dict[bytes, bytes]], Awaitable[Principal]]
#: a dry run of routing for a request body, an optional pinned pool and an optional flow-control
#: class (`x-gateway-priority`; gateway/app.py)
Explain = Callable[[dict[str, Any], str | None, str | None], dict[str, Any]]
#: the engine comparison over a window of seconds, of one model or all (gateway/flow/compare.py)
EngineReport = Callable[[int, str | None], Awaitable[dict[str, Any]]]

#: admin answers are never stored by a browser or a proxy
NO_STORE = {"cache-control": "no-store"}


@dataclass(frozen=True, slots=True)
class AdminContext:
    """What the admin API acts on: the operator's verbs, the admin guard, API keys (None when off),
    routing's dry run, the models served now (API keys' model lists are checked against them), the
    spend report (None without an admission stage), the configured tiers and flow classes, the flow
    queues' report and the engine comparison (None when the gateway records none)."""

    control: FleetControl
    authorize: Authorize
    keys: ApiKeys | None
    explain: Explain
    served: Callable[[], Collection[str]]
    spend: SpendQuery | None
    #: the configured limits tiers and the default one (what a new API key may name)
    tiers: Callable[[], tuple[list[str], str]]
    #: the configured flow-control classes (what a new API key may name)
    flow_classes: Callable[[], list[str]]
    #: `GET /admin/flow`: the queues of this replica and the others' (gateway/flow/)
    flow: Callable[[], Awaitable[dict[str, Any]]]
    engines: EngineReport | None = None


def context(request: Request) -> AdminContext:
    ctx: AdminContext = request.app.state.admin
    return ctx


async def admin(request: Request) -> Principal:
    """The caller, who must hold the admin role (401/403 otherwise)."""
    headers = {k.lower(): v for k, v in request.headers.raw}
    return await context(request).authorize(headers)


Admin = Annotated[Principal, Depends(admin)]
Ctx = Annotated[AdminContext, Depends(context)]


def json_response(status: int, payload: Any) -> Response:
    return Response(
        orjson.dumps(payload), status_code=status, media_type="application/json", headers=NO_STORE
    )


def not_found(what: str, name: str, code: str) -> ApiError:
    return ApiError(404, f"No {what} named {name!r}.", code=code)


def written(ctx: AdminContext, persisted: bool = True) -> dict[str, Any]:
    """The answer to a fleet change: whether it is in the shared store (and so on every replica)."""
    shared = ctx.control.store.shared
    out: dict[str, Any] = {"ok": True, "shared": shared and persisted, "persisted": persisted}
    if not persisted:
        out["note"] = (
            "Shared state (Redis) is unreachable: the change applies on this replica only, and is "
            "written to Redis, for every replica, when it answers again."
        )
    return out
