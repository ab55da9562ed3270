"""gateway/flow/classes.py: a request's class from its principal, lowered (never raised without the
role) by `x-gateway-priority` or `service_tier`, and its deadline from `x-gateway-max-queue-ms`."""

from __future__ import annotations

from typing import Any

import pytest

from engines.errors import ApiError
from gateway.core.context import Principal, RequestContext
from gateway.flow.classes import Classes
from gateway.flow.settings import FlowSettings
from gateway.settings import Settings


async def _no_body() -> dict[str, Any]:
    return {"type": "http.disconnect"}


def ctx(principal: Principal, headers: dict[bytes, bytes] | None = None, **body: Any) -> RequestContext:
    return RequestContext(
        request_id="r",
        endpoint="chat",
        started=0.0,
        headers=headers or {},
        receive=_no_body,
        body=body,
        principal=principal,
    )


def classes(by_tier: dict[str, str] | None = None) -> Classes:
    tiers = by_tier or {}
    return Classes(FlowSettings(), lambda p: tiers.get(p.tier))


def test_the_keys_class_comes_first_then_the_tiers_else_standard() -> None:
    c = classes({"bulk": "batch"})
    assert c.resolve(ctx(Principal("u")))[0].name == "standard"
    assert c.resolve(ctx(Principal("u", tier="bulk")))[0].name == "batch"
    keyed = Principal("u", tier="bulk", key_class="interactive")
    klass, wait = c.resolve(ctx(keyed))
    assert klass.name == "interactive" and wait == 5.0


def test_a_request_may_lower_its_class_but_not_raise_it_without_the_role() -> None:
    c = classes()
    lowered = c.resolve(ctx(Principal("u"), {b"x-gateway-priority": b"batch"}))[0]
    assert lowered.name == "batch"
    with pytest.raises(ApiError) as raised:
        c.resolve(ctx(Principal("u"), {b"x-gateway-priority": b"interactive"}))
    assert raised.value.status == 403 and raised.value.code == "permission_denied"
    allowed = Principal("u", roles=frozenset({"priority"}))
    assert c.resolve(ctx(allowed, {b"x-gateway-priority": b"interactive"}))[0].name == "interactive"
    with pytest.raises(ApiError) as unknown:
        c.resolve(ctx(Principal("u"), {b"x-gateway-priority": b"urgent"}))
    assert unknown.value.status == 400 and unknown.value.type == "invalid_request_error"


def test_service_tier_maps_flex_to_batch_and_priority_only_with_the_role() -> None:
    c = classes()
    assert c.resolve(ctx(Principal("u"), service_tier="flex"))[0].name == "batch"
    assert c.resolve(ctx(Principal("u"), service_tier="priority"))[0].name == "standard"
    assert c.resolve(ctx(Principal("u"), service_tier="auto"))[0].name == "standard"
    admin = Principal("ops", roles=frozenset({"admin"}))
    assert c.resolve(ctx(admin, service_tier="priority"))[0].name == "interactive"


def test_a_request_may_shorten_its_deadline_never_lengthen_it() -> None:
    c = classes()
    assert c.resolve(ctx(Principal("u"), {b"x-gateway-max-queue-ms": b"250"}))[1] == 0.25
    assert c.resolve(ctx(Principal("u"), {b"x-gateway-max-queue-ms": b"999999"}))[1] == 20.0
    assert c.resolve(ctx(Principal("u"), {b"x-gateway-max-queue-ms": b"0"}))[1] == 0.0
    with pytest.raises(ApiError) as raised:
        c.resolve(ctx(Principal("u"), {b"x-gateway-max-queue-ms": b"-5"}))
    assert raised.value.status == 400


def test_a_tier_must_name_a_defined_class_and_standard_must_exist() -> None:
    base: dict[str, Any] = {
        "models": [{"name": "m"}],
        "pools": [
            {
                "name": "p",
                "dialect": "vllm",
                "models": {"m": "m"},
                "backends": [{"name": "b", "url": "http://127.0.0.1:1"}],
            }
        ],
    }
    Settings.model_validate(
        {**base, "limits": {"tiers": {"default": {}, "bulk": {"priority_class": "batch"}}}}
    )
    with pytest.raises(ValueError, match="does not define"):
        Settings.model_validate(
            {**base, "limits": {"tiers": {"default": {}, "bulk": {"priority_class": "urgent"}}}}
        )
    with pytest.raises(ValueError, match="standard"):
        FlowSettings.model_validate({"classes": {"fast": {"priority": 0, "max_queue_s": 1, "max_queued": 1}}})
