"""`/admin/api-keys`: create, read, change, list and revoke API keys; each change is audited."""

from collections.abc import Collection, Sequence
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from engines.errors import ApiError, invalid_request
from gateway.admission import ApiKeyRecord, ApiKeys, ApiKeySpec, BudgetSettings
from gateway.control.admin.common import Admin, Ctx, json_response
from gateway.control.admin.pools import OkResponse
from policies.budgets import Budget

router = APIRouter()

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
    tier: str | None = Field(
        None, max_length=64, description="a configured limits tier (default: the tier named default)"
    )
    name: str = Field("", max_length=128, description="a label for operators")
    allow_models: list[str] | None = Field(None, max_length=1024, description=_MODELS_DOC)
    deny_models: list[str] = Field(default_factory=list, max_length=1024, description=_DENY_DOC)
    budgets: list[BudgetSettings] = Field(default_factory=list, max_length=16, description=_BUDGETS_DOC)
    priority_class: str | None = Field(
        None,
        max_length=64,
        description="the key's flow-control class (flow.classes; default: its tier's, else its tenant's)",
    )


class ApiKeyChange(BaseModel):
    """The grants of an existing key; fields left out keep their value."""

    model_config = ConfigDict(extra="forbid")

    allow_models: list[str] | None = Field(None, max_length=1024, description=_MODELS_DOC)
    deny_models: list[str] | None = Field(None, max_length=1024, description=_DENY_DOC)
    budgets: list[BudgetSettings] | None = Field(None, max_length=16, description=_BUDGETS_DOC)


@router.post("/admin/api-keys", status_code=201, summary="Create an API key (the plaintext is shown once)")
async def create_api_key(body: ApiKeyBody, who: Admin, ctx: Ctx) -> Response:
    api_keys = _enabled(ctx.keys)
    known = ctx.served()
    _check_models(body.allow_models, known, "allow_models")
    _check_models(body.deny_models, known, "deny_models")
    tiers, default_tier = ctx.tiers()
    tier = body.tier or default_tier
    if tier not in tiers:
        raise invalid_request(
            f"Unknown tier {tier!r}: the configured tiers (limits.tiers) are {', '.join(tiers)}.",
            param="tier",
        )
    classes = ctx.flow_classes()
    if body.priority_class is not None and body.priority_class not in classes:
        raise invalid_request(
            f"Unknown priority class {body.priority_class!r}: the configured classes (flow.classes) are "
            f"{', '.join(classes)}.",
            param="priority_class",
        )
    spec = ApiKeySpec(
        user=body.user,
        tenant=body.tenant,
        roles=tuple(body.roles),
        tier=tier,
        name=body.name,
        allow_models=None if body.allow_models is None else tuple(body.allow_models),
        deny_models=tuple(body.deny_models),
        budgets=_budgets(body.budgets),
        priority_class=body.priority_class,
    )
    record, plaintext = await api_keys.create(spec)
    await ctx.control.audit_only(who, "create_api_key", record.id, None, _public(record))
    return json_response(201, {"key": plaintext, **_public(record), "shared": api_keys.shared})


@router.get("/admin/api-keys/{key_id}", summary="One API key (its id, hint, principal and grants)")
async def get_api_key(key_id: str, who: Admin, ctx: Ctx) -> Response:
    record = await _enabled(ctx.keys).get(key_id)
    if record is None:
        raise _no_key(key_id)
    return json_response(200, _public(record))


@router.put(
    "/admin/api-keys/{key_id}",
    summary="Change what an API key may use (its model lists); the change is audited",
)
async def change_api_key(key_id: str, body: ApiKeyChange, who: Admin, ctx: Ctx) -> Response:
    api_keys = _enabled(ctx.keys)
    changes: dict[str, Any] = {}
    known = ctx.served()
    if "allow_models" in body.model_fields_set:
        _check_models(body.allow_models, known, "allow_models")
        changes["allow_models"] = None if body.allow_models is None else tuple(body.allow_models)
    if body.deny_models is not None:
        _check_models(body.deny_models, known, "deny_models")
        changes["deny_models"] = tuple(body.deny_models)
    if body.budgets is not None:
        changes["budgets"] = _budgets(body.budgets)
    found = await api_keys.update(key_id, **changes)
    if found is None:
        raise _no_key(key_id)
    before, after = found
    await ctx.control.audit_only(who, "change_api_key", key_id, _grants(before), _grants(after))
    return json_response(200, {**_public(after), "shared": api_keys.shared})


@router.get("/admin/api-keys", summary="API keys (ids, hints and principals; never the keys)")
async def list_api_keys(who: Admin, ctx: Ctx) -> Response:
    keys = [_public(r) for r in await _enabled(ctx.keys).list()]
    tiers, default_tier = ctx.tiers()
    return json_response(200, {"keys": keys, "tiers": tiers, "default_tier": default_tier})


@router.delete("/admin/api-keys/{key_id}", response_model=OkResponse, summary="Revoke an API key")
async def revoke_api_key(key_id: str, who: Admin, ctx: Ctx) -> Response:
    api_keys = _enabled(ctx.keys)
    if not await api_keys.revoke(key_id):
        raise _no_key(key_id)
    await ctx.control.audit_only(who, "revoke_api_key", key_id, "active", "revoked")
    return json_response(200, {"ok": True, "shared": api_keys.shared})


def _enabled(keys: ApiKeys | None) -> ApiKeys:
    if keys is None:
        raise ApiError(404, "API keys are not enabled (auth.api_keys.enabled).", code="api_keys_disabled")
    return keys


def _no_key(key_id: str) -> ApiError:
    return ApiError(404, f"No API key with id {key_id!r}.", code="api_key_not_found")


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
        "priority_class": record.priority_class,
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
