"""The admin REST API (`/admin/*`, admin role only), OpenAPI-documented at `/docs` and `/openapi.json`.

One router per resource: `pools` (the fleet, weights, backends added to a pool), `backends` (remove,
drain), `routes` (explain, reload), `api_keys`, `spend`, `audit`, `engines` (the engine comparison),
`flow` (the queues); `errors` maps every failure to OpenAI's error shape; `common` holds what they
share. Every fleet change goes through `FleetControl.change_fleet` (gateway/control/verbs.py), which
persists it (Redis when configured), records an audit entry (who, what, when, before → after) and
reaches every replica within a second. Reads show this replica's view. Answers here may name backend URLs: they are for operators, behind
the admin role; client-facing answers never do.
"""

from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

from fastapi import FastAPI

from gateway.admission import ApiKeys, SpendQuery
from gateway.control.admin import api_keys, audit, backends, errors, flow, pools, routes
from gateway.control.admin import engines as engine_routes
from gateway.control.admin import spend as spend_routes
from gateway.control.admin.common import AdminContext, Authorize, EngineReport, Explain
from gateway.control.console import Console
from gateway.control.openapi import document_public_api
from gateway.control.verbs import FleetControl

__all__ = ["AdminContext", "Authorize", "EngineReport", "Explain", "build_admin_app"]


def build_admin_app(
    control: FleetControl,
    authorize: Authorize,
    keys: ApiKeys | None,
    explain_route: Explain,
    models: Sequence[str],
    known_models: Callable[[], Collection[str]] | None = None,
    spend: SpendQuery | None = None,
    tiers: Callable[[], tuple[list[str], str]] = lambda: (["default"], "default"),
    api_docs: bool = False,
    engines: EngineReport | None = None,
    flow_classes: Callable[[], list[str]] = lambda: ["interactive", "standard", "batch"],
    flow_report: Callable[[], Awaitable[dict[str, Any]]] | None = None,
) -> FastAPI:
    """The admin app over the operator's verbs; `keys` is None when API keys are off, `models` the
    public model names the OpenAPI document lists, `known_models` the names served now (API keys'
    model lists are checked against them; `models` when not given), `spend` the spend report
    (`GET /admin/spend`; admission's `spend_report`), `tiers` the configured limits tiers and the
    default one; `api_docs` serves the OpenAPI document and its page (`/openapi.json`, `/docs`);
    `engines` the engine comparison (`GET /admin/engines/compare`; 404 without it); `flow_classes`
    the configured flow-control classes and `flow_report` the queues' report (`GET /admin/flow`)."""
    app = FastAPI(
        title="LLM gateway admin API",
        version="1",
        description=(
            "Pools, weights, backends, drain, route explain, audit. Every endpoint needs the admin "
            "role. The browser console at /admin/ui uses these endpoints with the operator's token."
        ),
        openapi_url="/openapi.json" if api_docs else None,
        docs_url="/docs" if api_docs else None,
        redoc_url=None,
        # No slash redirects: their Location would be built from the client's Host header.
        redirect_slashes=False,
    )
    served = known_models or (lambda: models)
    app.state.admin = AdminContext(
        control,
        authorize,
        keys,
        explain_route,
        served,
        spend,
        tiers,
        flow_classes,
        flow_report or _no_flow,
        engines,
    )
    errors.install(app)
    for module in (pools, backends, routes, api_keys, spend_routes, audit, engine_routes, flow):
        app.include_router(module.router)
    # the browser console (/admin/ui): static files that call the endpoints above with the operator's token
    Console.from_package().install(app)
    if api_docs:
        document_public_api(app, list(models))
    return app


async def _no_flow() -> dict[str, Any]:
    return {"enabled": False, "classes": {}, "replica": None, "replicas": []}
