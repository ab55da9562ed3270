"""A request's priority class and how long it may wait: resolved once, after authentication.

    own class      the API key's own class, else its tier's `priority_class`, else its tenant's,
                   else `standard`
    lowered by     `x-gateway-priority: <class>` (any class; a more urgent one needs the role
                   `priority` or `admin`: 403 otherwise), or OpenAI's `service_tier` when no header
                   names one: `flex` -> `batch`, `priority` -> `interactive` with that role (else its
                   own), `auto` / `default` -> its own
    deadline       the class's `max_queue_s`, shortened by `x-gateway-max-queue-ms: <ms>` (0: never wait)

An unknown class in the header, or a malformed deadline, is a 400 `invalid_request_error`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from engines.errors import ApiError, invalid_request
from gateway.core.context import Principal, RequestContext
from gateway.flow.settings import DEFAULT_CLASS, FlowSettings
from policies.flow import FlowClass

PRIORITY_HEADER = b"x-gateway-priority"
MAX_QUEUE_HEADER = b"x-gateway-max-queue-ms"
#: the roles that may put a request in a more urgent class than its own
RAISING_ROLES = frozenset({"priority", "admin"})
#: OpenAI's `service_tier` values that name a class (the others leave the request in its own)
SERVICE_TIERS = {"flex": "batch", "priority": "interactive"}

#: the class a principal's tier or tenant names (None: neither names one; admission knows the tiers)
ScopeClass = Callable[[Principal], "str | None"]


def flow_classes(settings: FlowSettings) -> dict[str, FlowClass]:
    """The configured classes as the queue's policy takes them, by name."""
    return {
        name: FlowClass(name, c.priority, c.max_queue_s, c.max_queued, c.ttft_target_s, c.max_kv_use)
        for name, c in settings.classes.items()
    }


class Classes:
    """Resolves each request's class and queue deadline (see the module docstring)."""

    def __init__(self, settings: FlowSettings, scope_class: ScopeClass) -> None:
        self.by_name: Mapping[str, FlowClass] = flow_classes(settings)
        self.default = self.by_name[DEFAULT_CLASS]
        self._scope_class = scope_class

    def own(self, principal: Principal) -> FlowClass:
        """The principal's own class (a class no longer configured counts as the default)."""
        name = principal.key_class or self._scope_class(principal)
        return self.by_name.get(name, self.default) if name else self.default

    def resolve(self, ctx: RequestContext) -> tuple[FlowClass, float]:
        """The request's class and the seconds it may wait in the queue; ApiError 400 or 403."""
        principal = ctx.principal
        own = klass = self.own(principal)
        headers = ctx.headers
        raw = headers.get(PRIORITY_HEADER)
        if raw is not None:
            klass = self._asked(raw.decode("latin-1").strip(), own, principal)
        else:
            tier = ctx.body.get("service_tier")
            if type(tier) is str and tier in SERVICE_TIERS:
                klass = self._service_tier(tier, own, principal)
        wait = klass.max_queue_s
        raw = headers.get(MAX_QUEUE_HEADER)
        if raw is not None:
            wait = min(wait, _deadline_ms(raw) / 1000)
        return klass, wait

    def _asked(self, name: str, own: FlowClass, principal: Principal) -> FlowClass:
        asked = self.by_name.get(name)
        if asked is None:
            raise invalid_request(
                f"Unknown priority class {name!r} in x-gateway-priority (classes: {', '.join(self.by_name)})."
            )
        if asked.priority < own.priority and not RAISING_ROLES & principal.roles:
            raise ApiError(
                403,
                f"Your requests are in the class {own.name!r}; a more urgent class ({name!r}) needs the "
                "role priority or admin.",
                type="invalid_request_error",
                code="permission_denied",
            )
        return asked

    def _service_tier(self, tier: str, own: FlowClass, principal: Principal) -> FlowClass:
        named = self.by_name.get(SERVICE_TIERS[tier])
        if named is None:
            return own
        if named.priority >= own.priority:
            return named  # as urgent or less: anyone may
        return named if RAISING_ROLES & principal.roles else own


def _deadline_ms(raw: bytes) -> int:
    text = raw.strip()
    if not text.isdigit() or len(text) > 9:
        raise invalid_request(
            "x-gateway-max-queue-ms must be a whole number of milliseconds, 0 or more (0: never wait)."
        )
    return int(text)
