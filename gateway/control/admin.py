"""The admin REST API (`/admin/*`, admin role only), OpenAPI-documented at `/docs` and `/openapi.json`.

Every change goes through `FleetControl.change_fleet` (gateway/control/verbs.py), which persists it (Redis when configured), records
an audit entry (who, what, when, before → after) and reaches every replica within a second. Reads
show this replica's view. Responses here may name backend URLs: they are for operators, behind the
admin role; client-facing responses never do.

(No `from __future__ import annotations` here: FastAPI reads the endpoint annotations at run time,
including the local `Admin` dependency alias.)
"""

from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Annotated, Any, Literal

import orjson
from fastapi import Body, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response as FastAPIResponse
from pydantic import BaseModel, ConfigDict, Field
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from engines.errors import ApiError, invalid_request
from gateway.admission import ApiKeyRecord, ApiKeys, ApiKeySpec, BudgetSettings, SpendQuery
from gateway.control.console import Console
from gateway.control.openapi import document_public_api
from gateway.control.verbs import FleetControl
from gateway.core.context import Principal
from policies.budgets import Budget

#: the caller's principal if it may use the admin API (request headers, lower-case names); raises
#: ApiError 401/403 otherwise (gateway/admission/assembly.py `Admission.authorize_admin`)
Authorize = Callable[[dict[bytes, bytes]], Awaitable[Principal]]
#: a dry run of routing for a request body and an optional pinned pool (gateway/app.py)
Explain = Callable[[dict[str, Any], str | None], dict[str, Any]]


class WeightBody(BaseModel):
    weight: float = Field(
        ge=0, le=1_000_000, description="the pool's new routing weight; 0 takes it out of rotation"
    )


class BackendBody(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    url: str = Field(pattern=r"^https?://[^\s/]+(:\d+)?/?$", description="http://host:port of the engine")


class DrainBody(BaseModel):
    draining: bool = True


_MODELS_DOC = "public model names the key may use (null: whatever the key's tier and tenant allow)"
_DENY_DOC = "public model names the key may never use"
_BUDGETS_DOC = (
    "the key's own budgets, on top of its user's and tenant's: {period: day|month|rolling, window_s "
    "(rolling only), usd and/or tokens}"
)


class ApiKeyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user: str = Field(min_length=1, max_length=256, description="the principal the key speaks for")
    tenant: str | None = Field(None, max_length=256)
    roles: list[str] = Field(default_factory=list, max_length=32)
    tier: str = Field("default", max_length=64, description="the limits tier (limits.tiers)")
    name: str = Field("", max_length=128, description="a label for operators")
    allow_models: list[str] | None = Field(None, max_length=1024, description=_MODELS_DOC)
    deny_models: list[str] = Field(default_factory=list, max_length=1024, description=_DENY_DOC)
    budgets: list[BudgetSettings] = Field(default_factory=list, max_length=16, description=_BUDGETS_DOC)


class ApiKeyChange(BaseModel):
    """The grants of an existing key; fields left out keep their value."""

    model_config = ConfigDict(extra="forbid")

    allow_models: list[str] | None = Field(None, max_length=1024, description=_MODELS_DOC)
    deny_models: list[str] | None = Field(None, max_length=1024, description=_DENY_DOC)
    budgets: list[BudgetSettings] | None = Field(None, max_length=16, description=_BUDGETS_DOC)


class OkResponse(BaseModel):
    ok: bool = True
    shared: bool = Field(description="true when the change is persisted in Redis and shared by every replica")


#: admin answers are never stored by a browser or a proxy (a new API key's plaintext is in one)
_NO_STORE = {"cache-control": "no-store"}


def _json(status: int, payload: Any) -> FastAPIResponse:
    return FastAPIResponse(
        orjson.dumps(payload), status_code=status, media_type="application/json", headers=_NO_STORE
    )


def _enabled(keys: ApiKeys | None) -> ApiKeys:
    if keys is None:
        raise ApiError(404, "API keys are not enabled (auth.api_keys.enabled).", code="api_keys_disabled")
    return keys


def _public(record: ApiKeyRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "hint": record.hint,
        "user": record.user,
        "tenant": record.tenant,
        "roles": list(record.roles),
        "tier": record.tier,
        "name": record.name,
        "created": record.created,
        **_grants(record),
    }


def _grants(record: ApiKeyRecord) -> dict[str, Any]:
    """What the key itself narrows (what the audit log records of a change)."""
    return {
        "allow_models": None if record.allow_models is None else list(record.allow_models),
        "deny_models": list(record.deny_models),
        "budgets": [b.as_dict() for b in record.budgets],
    }


def _budgets(settings: list[BudgetSettings]) -> tuple[Budget, ...]:
    return tuple(b for s in settings for b in s.budgets())


def _check_models(names: Sequence[str] | None, known: Collection[str], param: str) -> None:
    """400 naming the first model no pool serves (a typo must not silently grant or deny nothing)."""
    for name in names or ():
        if name not in known:
            raise invalid_request(f"Unknown model {name!r} in {param}: no pool serves it.", param=param)


def _unreachable() -> ApiError:
    return ApiError(503, "Shared state (Redis) is unreachable; nothing was changed.", type="server_error")


def build_admin_app(
    control: FleetControl,
    authorize: Authorize,
    keys: ApiKeys | None,
    explain_route: Explain,
    models: Sequence[str],
    known_models: Callable[[], Collection[str]] | None = None,
    spend: SpendQuery | None = None,
) -> FastAPI:
    """The admin app over the operator's verbs; `keys` is None when API keys are off, `models` the
    public model names the OpenAPI document lists, `known_models` the names served now (API keys'
    model lists are checked against them; `models` when not given), `spend` the spend report
    (`GET /admin/spend`; admission's `spend_report`)."""
    fleet = control.fleet
    served: Callable[[], Collection[str]] = known_models or (lambda: models)
    app = FastAPI(
        title="LLM gateway admin API",
        version="1",
        description=(
            "Pools, weights, backends, drain, route explain, audit. Every endpoint needs the admin "
            "role. The browser console at /admin/ui uses these endpoints with the operator's token."
        ),
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,
        # No slash redirects: their Location would be built from the client's Host header.
        redirect_slashes=False,
    )

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> FastAPIResponse:
        return FastAPIResponse(
            exc.body(), status_code=exc.status, media_type="application/json", headers=exc.headers
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> FastAPIResponse:
        if exc.status_code == 404:
            err = ApiError(404, f"Invalid URL ({request.method} {request.url.path})")
        else:
            err = ApiError(exc.status_code, str(exc.detail))
        return FastAPIResponse(err.body(), status_code=err.status, media_type="application/json")

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> FastAPIResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        err = invalid_request(
            f"Invalid request: {first.get('msg', 'bad input')}", param=".".join(loc) or None
        )
        return FastAPIResponse(err.body(), status_code=400, media_type="application/json")

    async def admin(request: Request) -> Principal:
        headers = {k.lower(): v for k, v in request.headers.raw}
        return await authorize(headers)

    Admin = Annotated[Principal, Depends(admin)]

    @app.get("/admin/pools", summary="Pools with weights, backends, health, in-flight and recent load")
    async def pools(who: Admin) -> FastAPIResponse:
        return _json(200, {"pools": control.describe_fleet(), "shared_state": control.store.shared})

    @app.put("/admin/pools/{pool}/weight", response_model=OkResponse, summary="Set a pool's routing weight")
    async def set_weight(pool: str, body: WeightBody, who: Admin) -> FastAPIResponse:
        current = fleet.pools.get(pool)
        if current is None:
            raise ApiError(404, f"No pool named {pool!r}.", code="pool_not_found")
        await control.change_fleet(
            who, "set_weight", pool, current.weight, body.weight, updates={f"weight:{pool}": body.weight}
        )
        return _json(200, {"ok": True, "shared": control.store.shared})

    @app.post(
        "/admin/pools/{pool}/backends",
        status_code=201,
        response_model=OkResponse,
        summary="Add a backend to a pool",
    )
    async def add_backend(pool: str, body: BackendBody, who: Admin) -> FastAPIResponse:
        if pool not in fleet.pools:
            raise ApiError(404, f"No pool named {pool!r}.", code="pool_not_found")
        if body.name in fleet.backends:
            raise ApiError(409, f"A backend named {body.name!r} exists.", code="backend_exists")
        url = body.url.rstrip("/")
        await control.change_fleet(
            who,
            "add_backend",
            body.name,
            None,
            {"pool": pool, "url": url},
            updates={f"add:{body.name}": {"pool": pool, "url": url}},
            deletes=[f"remove:{body.name}"],
        )
        return _json(201, {"ok": True, "shared": control.store.shared})

    @app.delete(
        "/admin/backends/{name}",
        response_model=OkResponse,
        summary="Remove a backend (in-flight requests finish)",
    )
    async def remove_backend(name: str, who: Admin) -> FastAPIResponse:
        backend = fleet.backends.get(name)
        if backend is None:
            raise ApiError(404, f"No backend named {name!r}.", code="backend_not_found")
        before = {"pool": backend.pool, "url": backend.url}
        await control.change_fleet(
            who,
            "remove_backend",
            name,
            before,
            None,
            updates={f"remove:{name}": True},
            deletes=[f"add:{name}", f"drain:{name}"],
        )
        return _json(200, {"ok": True, "shared": control.store.shared})

    @app.put(
        "/admin/backends/{name}/drain",
        response_model=OkResponse,
        summary="Drain (no new requests) or undrain a backend",
    )
    async def drain(
        name: str, who: Admin, body: Annotated[DrainBody | None, Body()] = None
    ) -> FastAPIResponse:
        body = body or DrainBody()
        backend = fleet.backends.get(name)
        if backend is None:
            raise ApiError(404, f"No backend named {name!r}.", code="backend_not_found")
        if body.draining:
            await control.change_fleet(
                who, "drain", name, backend.draining, True, updates={f"drain:{name}": True}
            )
        else:
            await control.change_fleet(
                who, "undrain", name, backend.draining, False, deletes=[f"drain:{name}"]
            )
        return _json(200, {"ok": True, "shared": control.store.shared})

    @app.post("/admin/backends/{name}/drain", response_model=OkResponse, summary="Drain a backend")
    async def drain_post(name: str, who: Admin) -> FastAPIResponse:
        return await drain(name, who, DrainBody(draining=True))

    @app.post("/admin/routes/explain", summary="Dry-run routing for a request body")
    @app.get(
        "/admin/routes/explain",
        summary="Dry-run routing for a request body (sent as the body)",
        operation_id="explain_get",
    )
    async def explain(request: Request, who: Admin) -> FastAPIResponse:
        raw = await request.body()
        if not raw:
            raise invalid_request("Send the chat or completions request to explain as the JSON body.")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise invalid_request("The body is not valid JSON.") from None
        if not isinstance(body, dict):
            raise invalid_request("The body must be a JSON object.")
        pin = request.headers.get("x-gateway-pool")
        return _json(200, explain_route(body, pin))

    @app.post(
        "/admin/reload",
        response_model=OkResponse,
        summary="Re-read the config file (pools and backends) on every replica",
    )
    async def reload(who: Admin) -> FastAPIResponse:
        await control.reload_config(who)
        return _json(200, {"ok": True, "shared": control.store.shared})

    @app.post("/admin/api-keys", status_code=201, summary="Create an API key (the plaintext is shown once)")
    async def create_api_key(body: ApiKeyBody, who: Admin) -> FastAPIResponse:
        api_keys = _enabled(keys)
        known = served()
        _check_models(body.allow_models, known, "allow_models")
        _check_models(body.deny_models, known, "deny_models")
        spec = ApiKeySpec(
            user=body.user,
            tenant=body.tenant,
            roles=tuple(body.roles),
            tier=body.tier,
            name=body.name,
            allow_models=None if body.allow_models is None else tuple(body.allow_models),
            deny_models=tuple(body.deny_models),
            budgets=_budgets(body.budgets),
        )
        try:
            record, plaintext = await api_keys.create(spec)
        except RedisError:
            raise ApiError(
                503, "Shared state (Redis) is unreachable; no key was created.", type="server_error"
            ) from None
        await control.audit_only(who, "create_api_key", record.id, None, _public(record))
        return _json(201, {"key": plaintext, **_public(record), "shared": api_keys.shared})

    @app.get("/admin/api-keys/{key_id}", summary="One API key (its id, hint, principal and grants)")
    async def get_api_key(key_id: str, who: Admin) -> FastAPIResponse:
        try:
            record = await _enabled(keys).get(key_id)
        except RedisError:
            raise _unreachable() from None
        if record is None:
            raise ApiError(404, f"No API key with id {key_id!r}.", code="api_key_not_found")
        return _json(200, _public(record))

    @app.put(
        "/admin/api-keys/{key_id}",
        summary="Change what an API key may use (its model lists); the change is audited",
    )
    async def change_api_key(key_id: str, body: ApiKeyChange, who: Admin) -> FastAPIResponse:
        api_keys = _enabled(keys)
        changes: dict[str, Any] = {}
        known = served()
        if "allow_models" in body.model_fields_set:
            _check_models(body.allow_models, known, "allow_models")
            changes["allow_models"] = None if body.allow_models is None else tuple(body.allow_models)
        if body.deny_models is not None:
            _check_models(body.deny_models, known, "deny_models")
            changes["deny_models"] = tuple(body.deny_models)
        if body.budgets is not None:
            changes["budgets"] = _budgets(body.budgets)
        try:
            found = await api_keys.update(key_id, **changes)
        except RedisError:
            raise _unreachable() from None
        if found is None:
            raise ApiError(404, f"No API key with id {key_id!r}.", code="api_key_not_found")
        before, after = found
        await control.audit_only(who, "change_api_key", key_id, _grants(before), _grants(after))
        return _json(200, {**_public(after), "shared": api_keys.shared})

    @app.get("/admin/api-keys", summary="API keys (ids, hints and principals; never the keys)")
    async def list_api_keys(who: Admin) -> FastAPIResponse:
        return _json(200, {"keys": [_public(r) for r in await _enabled(keys).list()]})

    @app.delete("/admin/api-keys/{key_id}", response_model=OkResponse, summary="Revoke an API key")
    async def revoke_api_key(key_id: str, who: Admin) -> FastAPIResponse:
        api_keys = _enabled(keys)
        if not await api_keys.revoke(key_id):
            raise ApiError(404, f"No API key with id {key_id!r}.", code="api_key_not_found")
        await control.audit_only(who, "revoke_api_key", key_id, "active", "revoked")
        return _json(200, {"ok": True, "shared": api_keys.shared})

    @app.get(
        "/admin/spend",
        summary="Spend of one user, tenant or API key per UTC day and month, by model, with its budgets",
    )
    async def spend_report(
        who: Admin,
        user: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
        tenant: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
        key: Annotated[
            str | None, Query(min_length=1, max_length=64, description="an API key id (key_…)")
        ] = None,
        tier: Annotated[
            str | None, Query(min_length=1, max_length=64, description="the user's tier (its budgets)")
        ] = None,
        period: Annotated[Literal["day", "month"] | None, Query(description="default: both")] = None,
        date: Annotated[
            str | None, Query(min_length=7, max_length=10, description="YYYY-MM-DD or YYYY-MM (default: now)")
        ] = None,
        model: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
    ) -> FastAPIResponse:
        if spend is None:
            raise ApiError(404, "Spend is not recorded (no admission stage).", code="spend_disabled")
        report = await spend(
            user=user,
            tenant=tenant,
            key_id=key,
            tier=tier,
            periods=("day", "month") if period is None else (period,),
            date=date,
            model=model,
        )
        return _json(200, report)

    @app.get("/admin/audit", summary="Recent admin changes, newest first")
    async def audit(who: Admin, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> FastAPIResponse:
        return _json(200, {"entries": await control.store.audit(limit)})

    # the browser console (/admin/ui): static files that call the endpoints above with the operator's token
    Console.from_package().install(app)
    document_public_api(app, list(models))
    return app
