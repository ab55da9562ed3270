"""The route stage: features of the request + a snapshot of the fleet → pool, backend and a reason.
`explain` is the same decision as a dry run, for the admin API.

The decision itself is pure (`policies.router.Router`); this stage only gathers its inputs (the
fleet snapshot, a random draw, an admin's pin) and applies its output to the context and the
response headers (`x-gateway-pool`, `x-gateway-route` — never a backend address).
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from engines.base import Endpoint
from engines.errors import ApiError, invalid_request, model_not_found
from engines.registry import DIALECTS
from gateway.core.context import Principal, RequestContext, session_header
from gateway.core.fleet import Fleet, Pool
from gateway.core.responses import Response, safe_header_value
from gateway.core.settings import ModelSettings
from gateway.routing.shared_load import SharedLoad
from gateway.routing.tokens import PromptTokens
from gateway.routing.warmup import Warmups
from policies.features import FeatureConfig, extract_features
from policies.pools import candidate_pools
from policies.router import Router
from policies.types import Decision, FleetSnapshot, RequestFeatures, RoutingError, decision

PIN_HEADER = b"x-gateway-pool"
#: an admin's pin to one backend (`gateway check` reaches every engine through the gateway)
BACKEND_PIN_HEADER = b"x-gateway-backend"
#: the endpoints every dialect serves (the others are routed only to the pools whose engine does)
_EVERYWHERE = frozenset.intersection(*(frozenset(d.paths) for d in DIALECTS.values()))

#: observer of every decision (metrics); pool, reason, affinity
DecisionHook = Callable[[Decision], None]


class RouteStage:
    name = "route"

    def __init__(
        self,
        fleet: Fleet,
        router: Router,
        features: FeatureConfig,
        on_decision: DecisionHook | None = None,
        tokens: PromptTokens | None = None,
    ) -> None:
        self._fleet = fleet
        self.router = router
        self.features = features
        #: the request's token blocks for KV-event routing (models with a tokenizer), or None
        self.tokens = tokens if tokens else None
        self._random = random.Random()
        self._on_decision = on_decision
        self._header_values: dict[str, bytes] = {}
        #: the state shared with the other routing processes (set by the root with Redis), or None
        self.shared: SharedLoad | None = None
        #: background prefills of a hot group's next holder (`Decision.warm`; set by the root), or None
        self.warmups: Warmups | None = None
        #: the models a fallback may switch to, and who may use which (set by the root)
        self.models: Mapping[str, ModelSettings] = {}
        self.permits: Callable[[Principal, str], bool] = lambda principal, model: True

    async def prepare(self, ctx: RequestContext) -> RequestFeatures:
        """The request's features, with its token blocks when the engines' events are consumed
        (computed once per request: the shared state may ask before admission). A long encoding
        runs in the tokenizer's worker thread (`PromptTokens.blocks_async`), so other streams of
        this process go on meanwhile."""
        extras = ctx.extras
        # the sanitise stage computed them already (same config, same session key): reuse
        features: RequestFeatures = extras.get("features") or extract_features(
            ctx.body, self.features, session_key=session_header(ctx)
        )
        kv = self.router.kv_index
        if (
            kv is not None
            and kv.streams
            and self.tokens is not None
            and features.prompt is None
            and "tokenized" not in extras
        ):
            extras["tokenized"] = True
            kv.tick(time.monotonic())
            lora = self._adapter(ctx.body.get("model"), kv.adapters)
            prompt = await self.tokens.blocks_async(ctx.body, features.anchor_hash, lora)
            if prompt is not None:
                features = dataclasses.replace(features, prompt=prompt)
        extras["features"] = features
        return features

    def _adapter(self, model: Any, adapters: set[str]) -> str | None:
        """The LoRA adapter the engines serve `model` as: the first of its served names (per pool)
        that the engines' events named as one (vLLM keeps an adapter's blocks in a namespace of its
        own, `lora_name` in its events); None for a base model, or before any adapter was heard of."""
        if not adapters or not isinstance(model, str):
            return None
        for pool in self._fleet.pools.values():
            served = pool.models.get(model)
            if served is not None and served in adapters:
                return served
        return None

    def snapshot(self, now: float) -> FleetSnapshot:
        """The fleet as routing sees it: with the other processes' in-flight counts when shared."""
        shared = self.shared
        return shared.snapshot(now) if shared is not None else self._fleet.snapshot(now)

    async def __call__(self, ctx: RequestContext) -> Response | None:
        features = await self.prepare(ctx)
        now = time.monotonic()
        kv = self.router.kv_index
        if kv is not None and kv.streams:
            kv.tick(now)
        if self.shared is not None:
            ctx.extras["features"] = self.shared.features(ctx, features)
        pin: str | None = None
        if ctx.principal.is_admin:
            raw = ctx.headers.get(PIN_HEADER)
            if raw:
                pin = ctx.extras["pin"] = raw.decode("latin-1")
            backend = ctx.headers.get(BACKEND_PIN_HEADER)
            if backend:
                ctx.extras["backend_pin"] = True  # no retry elsewhere, no fallback: that engine answers
                self._apply(ctx, self._pinned_backend(ctx, backend.decode("latin-1")))
                return None
        try:
            decision = self._decide_flow(self.snapshot(now), ctx, pin)
        except ApiError as err:
            if err.status != 503 or not self.fallback(ctx):
                raise
            return None
        self._apply(ctx, decision)
        return None

    def flow_pools(self, ctx: RequestContext) -> frozenset[str] | None:
        """The pools this request may be routed to as things stand (an admin's pinned pool, else the
        pools the rules leave it), for the flow stage's view of saturation; None: every pool serving
        its model (no features yet, or the rules leave none)."""
        if ctx.principal.is_admin:
            raw = ctx.headers.get(PIN_HEADER)
            if raw:
                return frozenset((raw.decode("latin-1"),))
        features: RequestFeatures | None = ctx.extras.get("features")
        if features is None:
            return None
        pools = candidate_pools(self.snapshot(time.monotonic()), features, self.router.rules)
        return frozenset(p.name for p in pools) if pools else None

    def _decide_flow(self, snapshot: FleetSnapshot, ctx: RequestContext, pin: str | None) -> Decision:
        """`decide`, leaving out the backends the flow stage named (saturated ones, and those predicted
        to miss the class's TTFT target), unless that leaves none routing may use."""
        exclude: frozenset[str] | None = ctx.extras.get("flow_exclude")
        if exclude:
            kind = ctx.error_kind
            try:
                return self.decide(snapshot, ctx, pin, exclude)
            except ApiError as err:
                if err.status != 503:
                    raise
                ctx.error_kind = kind
        return self.decide(snapshot, ctx, pin)

    def _pinned_backend(self, ctx: RequestContext, name: str) -> Decision:
        """An admin's `x-gateway-backend`: that backend, whatever routing would choose (a deploy
        check, `gateway check`, tests every backend through the gateway); 400 when it does not serve
        the model. Health, drain and circuits do not stop it: the point is to reach that engine."""
        backend = self._fleet.backends.get(name)
        model = ctx.model.name if ctx.model is not None else ""
        if backend is None or model not in self._fleet.pools[backend.pool].models:
            raise ApiError(400, f"No backend named {name!r} serves the model `{model}`.", param=None)
        return decision(backend.pool, name, "pin:backend", "none")

    def fallback(self, ctx: RequestContext) -> bool:
        """Switch the request to the next of its model's fallbacks (`models[].fallbacks`) that the
        caller may use, that fits its prompt and that has a backend to take it; False when none is
        left. The answer names the model that served (`model`, `x-gateway-model`), and limits and
        budgets charge it."""
        assert ctx.model is not None
        if "backend_pin" in ctx.extras:
            return False
        left: list[str] = ctx.extras.setdefault("fallbacks", list(ctx.model.fallbacks))
        features: RequestFeatures = ctx.extras["features"]
        snapshot = self.snapshot(time.monotonic())
        while left:
            model = self.models.get(left.pop(0))
            if model is None or not self.permits(ctx.principal, model.name):
                continue
            if features.longest_prompt_tokens >= model.context_length:
                continue
            if model.task != ctx.model.task:  # a model of another task cannot answer this API
                continue
            unserved: set[str] = set()
            if ctx.endpoint not in _EVERYWHERE:
                found = self._unserved(model.name, ctx.endpoint)
                if found is None:
                    continue
                unserved = found
            candidate = dataclasses.replace(features, model=model.name, prompt=None)
            try:
                decision = self.router.decide(
                    snapshot, candidate, self._random.random(), pin=ctx.extras.get("pin"), exclude=unserved
                )
            except RoutingError:
                continue
            ctx.model = model
            ctx.extras["features"] = candidate
            headers = ctx.response_headers
            headers[:] = [h for h in headers if h[0] != b"x-gateway-model"]
            headers.append((b"x-gateway-model", self._header_value(model.name)))
            self._apply(
                ctx,
                decision._replace(reason="fallback+" + decision.reason, warm=None, warm_tokens=0),
                retry=True,
            )
            return True
        return False

    def decide(
        self,
        snapshot: FleetSnapshot,
        ctx: RequestContext,
        pin: str | None,
        exclude: Collection[str] = (),
        prefer: str | None = None,
    ) -> Decision:
        if ctx.endpoint not in _EVERYWHERE:
            assert ctx.model is not None
            unserved = self._unserved(ctx.model.name, ctx.endpoint)
            if unserved is None:
                raise invalid_request(
                    f"The model `{ctx.model.name}` has no engine that serves this endpoint.", param="model"
                )
            exclude = {*exclude, *unserved}
        try:
            return self.router.decide(
                snapshot,
                ctx.extras["features"],
                self._random.random(),
                pin=pin,
                exclude=exclude,
                prefer=prefer,
            )
        except RoutingError as exc:
            raise _routing_error(exc, ctx, self._fleet) from None

    def _unserved(self, model: str, endpoint: Endpoint) -> set[str] | None:
        """The backends of `model`'s pools whose engine has no path for `endpoint` (SGLang serves
        no translations); None when that is every pool serving the model."""
        out: set[str] = set()
        served = False
        for pool in self._fleet.pools.values():
            if model in pool.models:
                if endpoint in pool.dialect.paths:
                    served = True
                else:
                    out.update(pool.backends)
        return out if served else None

    def explain(self, body: dict[str, Any], pin: str | None) -> dict[str, Any]:
        """Where `body` would be routed now, and why (a dry run: no routing state changes)."""
        features = extract_features(body, self.features)
        held: dict[str, int] | None = None
        kv = self.router.kv_index
        if kv is not None and kv.streams and self.tokens is not None:
            # what the engines' events say each backend holds of this prompt (tokens), as routing sees
            # it (no conversation: a dry run leaves the tokenizer's reuse cache alone)
            prompt = self.tokens.blocks(body, lora=self._adapter(body.get("model"), kv.adapters))
            if prompt is not None:
                features = dataclasses.replace(features, prompt=prompt)
                held = kv.match(prompt, kv.names)
        shared = self.shared.describe() if self.shared is not None else None
        try:
            decision = self.router.decide(
                self.snapshot(time.monotonic()), features, 0.5, pin=pin, dry_run=True
            )
        except RoutingError as exc:
            out: dict[str, Any] = {
                "routable": False,
                "error": exc.kind,
                "reason": exc.reason,
                "features": _features_dict(features),
            }
        else:
            out = {
                "routable": True,
                "pool": decision.pool,
                "backend": decision.backend,
                "reason": decision.reason,
                "affinity": decision.affinity,
                "features": _features_dict(features),
            }
            if decision.warm is not None:  # a hot group's next holder would be warmed
                out["warm"] = {"backend": decision.warm, "tokens": decision.warm_tokens}
        if held is not None:
            out["kv_held_tokens"] = held
        if self.tokens is not None:
            # this process's requests tokenized in the worker thread, and routed without their
            # tokens because it was full (`PromptTokens.max_pending`)
            out["tokenize"] = {"offloaded": self.tokens.offloaded, "overflowed": self.tokens.overflowed}
        if shared is not None:
            out["shared"] = shared
        return out

    def reroute(self, ctx: RequestContext, exclude: set[str]) -> None:
        """Choose another backend for a retry, never one already tried: in the same pool while it has
        a routable backend left, then in the next eligible pool serving the model (rules are
        preferences unless `strict`; an admin's pin keeps the retry in the pinned pool). ApiError
        when none is left. Reasons: `retry+<backend policy>` in the pool, `failover+<pool choice>` to
        another pool."""
        assert ctx.pool is not None
        if "backend_pin" in ctx.extras:
            raise ApiError(503, "The pinned backend failed.", type="server_error")
        snapshot = self.snapshot(time.monotonic())
        came_from = ctx.pool.name
        decision = self.decide(snapshot, ctx, ctx.extras.get("pin"), exclude, prefer=came_from)
        if decision.pool == came_from:
            reason = "retry+" + decision.reason.rpartition("+")[2]
        else:
            reason = "failover+" + decision.reason
        self._apply(ctx, decision._replace(reason=reason, warm=None, warm_tokens=0), retry=True)

    def _header_value(self, text: str) -> bytes:
        """`safe_header_value`, remembered: pool names and reasons come from a small set."""
        value = self._header_values.get(text)
        if value is None:
            if len(self._header_values) >= 4096:
                self._header_values.clear()
            value = self._header_values[text] = safe_header_value(text)
        return value

    def _apply(self, ctx: RequestContext, decision: Decision, retry: bool = False) -> None:
        pool = self._fleet.pools[decision.pool]
        ctx.pool = pool
        ctx.backend = pool.backends[decision.backend]
        ctx.route_reason = decision.reason
        ctx.affinity = decision.affinity
        ctx.prefill = decision.prefill
        headers = ctx.response_headers
        if retry:  # a retry replaces the headers of the first decision
            headers[:] = [h for h in headers if h[0] not in (b"x-gateway-pool", b"x-gateway-route")]
        headers.append((b"x-gateway-pool", self._header_value(pool.name)))
        headers.append((b"x-gateway-route", self._header_value(decision.reason)))
        if self._on_decision is not None:
            self._on_decision(decision)
        if decision.warm is not None and not retry:
            self._warm(ctx, pool, decision.warm, decision.warm_tokens)

    def _warm(self, ctx: RequestContext, pool: Pool, backend_name: str, tokens: int) -> None:
        """Send the warm-up a decision asks for: the request's first `tokens` token ids to backend
        `backend_name` of `pool`, under the model's name there."""
        features: RequestFeatures | None = ctx.extras.get("features")
        if features is None:
            return
        prompt = features.prompt
        backend = pool.backends.get(backend_name)
        served = pool.models.get(ctx.model.name) if ctx.model is not None else None
        if (
            self.warmups is None
            or prompt is None
            or backend is None
            or served is None
            or not self.warmups.send(backend, served, prompt.token_ids(tokens))
        ):
            # not sent (the process's warm-ups at their cap, the backend or model gone): the group
            # may ask for one again
            self.router.policy.warm_skipped(features)


def _routing_error(exc: RoutingError, ctx: RequestContext, fleet: Fleet) -> ApiError:
    model = str(ctx.body.get("model", ""))
    if exc.kind == "unknown_model":
        return model_not_found(model)
    if exc.kind == "unknown_pool":
        return ApiError(400, "The pool named in x-gateway-pool does not serve this model.", param=None)
    ctx.error_kind = "no_backend"
    if exc.reason.endswith("no-capable-pool"):
        return ApiError(
            503,
            f"No pool serving the model `{model}` can take this request (tool calls or structured output "
            "are not enabled on any).",
            type="server_error",
            code="no_capable_pool",
        )
    found = fleet.unavailable(model, time.monotonic())
    cause, retry_s = found if found is not None else ("the routing rule's pools have none routable", 1.0)
    return ApiError(
        503,
        f"No backend can serve the model `{model}` now ({cause}). You can retry your request.",
        type="server_error",
        code="no_backend",
        headers={"retry-after": str(max(1, math.ceil(retry_s)))},
    )


def _features_dict(f: RequestFeatures) -> dict[str, Any]:
    return {
        "prompt_tokens": f.prompt_tokens,
        "blocks": len(f.block_hashes),
        "anchor": f"{f.anchor_hash:016x}",
        "has_tools": f.has_tools,
        "tool_choice": f.tool_choice,
        "structured_output": f.structured_output,
        "max_tokens": f.max_tokens,
    }
