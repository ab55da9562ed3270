"""Admission: who may call (JWT, JWKS, API keys), with what (intake, validation, the sanitiser) and how
much (limits in this process or in Redis), as pipeline stages that `Admission` assembles from settings.

The interface other wings may use (docs/architecture.md): `Admission` for the root, and what the
control wing's admin API manages: the API-key registry, the budget settings keys are created with,
and the spend report's signature (`SpendQuery`).
"""

from collections.abc import Awaitable
from typing import Any, Protocol

from gateway.admission.api_keys import ApiKeyRecord, ApiKeys, ApiKeySpec
from gateway.admission.assembly import Admission
from gateway.admission.settings import BudgetSettings
from policies.budgets import Period


class SpendQuery(Protocol):
    """`Admission.spend_report`: one scope's spend (ApiError 400/404/503)."""

    def __call__(
        self,
        *,
        user: str | None = ...,
        tenant: str | None = ...,
        key_id: str | None = ...,
        tier: str | None = ...,
        periods: tuple[Period, ...] = ...,
        date: str | None = ...,
        model: str | None = ...,
        limit: int = ...,
        offset: int = ...,
    ) -> Awaitable[dict[str, Any]]: ...


__all__ = ["Admission", "ApiKeyRecord", "ApiKeySpec", "ApiKeys", "BudgetSettings", "SpendQuery"]
