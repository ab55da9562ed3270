"""The flow stage, between admit and route: the request's class, then a check that a backend it may
use is free; at saturation it waits in the process's queue (gateway/flow/gate.py).

    resolve the class and the deadline (gateway/flow/classes.py)      every request
    pass when nothing as urgent waits and a backend is free           one check of the backends
    else wait in the queue until released, shed or the client leaves  only at saturation

With `flow.enabled: false` the class is still resolved (access log, metrics) and everything passes.
An admin's request pinned to one backend (`x-gateway-backend`) passes too: its point is to reach that
engine. A request that passes or is released carries to the route stage the backends it must not go
to (`ctx.extras["flow_exclude"]`: saturated ones, and for a class with a TTFT target those predicted
to miss it) and, for such a class, the predicted time to first token per backend
(`flow_predicted`), observed against the real one when the request ends (`finished`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from gateway.core.context import Principal, RequestContext
from gateway.core.replica import REPLICA
from gateway.core.responses import Response
from gateway.flow.classes import PRIORITY_HEADER, Classes
from gateway.flow.gate import FlowObserver, Gate
from gateway.flow.pressure import FREE, FULL, HOLD, NONE, Pressure
from gateway.flow.settings import FlowSettings
from policies.features import extract_features
from policies.shared_load import flow_waiting

BACKEND_PIN_HEADER = b"x-gateway-backend"
_STATES = {FREE: "free", FULL: "saturated", HOLD: "hold", NONE: "no_backend"}

#: every routing process's shared figures by process (`Admission.shared_figures`; None: not shared)
Figures = Callable[[], Awaitable[dict[str, dict[str, int]] | None]]


class TtftObserver(FlowObserver, Protocol):
    def flow_ttft(self, klass: str, predicted: float | None, observed: float | None) -> None: ...


class FlowStage:
    name = "flow"

    def __init__(
        self,
        settings: FlowSettings,
        classes: Classes,
        pressure: Pressure,
        gate: Gate,
        observer: TtftObserver,
    ) -> None:
        self.enabled = settings.enabled
        self.classes = classes
        self.pressure = pressure
        self.gate = gate
        self._observer = observer
        #: this process's name (its key among the shared figures when they are shared: set by the root)
        self.process = REPLICA
        self.figures: Figures | None = None
        #: the pools routing may send a request to (the route stage's `flow_pools`; set by the root)
        self.pools_for: Callable[[RequestContext], frozenset[str] | None] | None = None

    async def __call__(self, ctx: RequestContext) -> Response | None:
        klass, wait_s = self.classes.resolve(ctx)
        ctx.flow_class = klass.name
        model = ctx.model
        if not self.enabled or model is None:
            return None
        if BACKEND_PIN_HEADER in ctx.headers and ctx.principal.is_admin:
            return None
        features = ctx.extras.get("features")
        tokens = features.total_prompt_tokens if features is not None else 0
        pools: frozenset[str] | None = None
        if self.gate.clear_for(klass):
            now = time.monotonic()
            state, exclude, predicted = self.pressure.check(model.name, tokens, klass, now)
            if state == FREE and exclude is None and klass.ttft_target_s is None:
                return None  # no backend of the model is saturated: whichever pools the rules leave
            # the pools the rules leave cost a fleet snapshot: asked only once some backend is full
            pools = self._pools(ctx)
            if pools is not None:
                state, exclude, predicted = self.pressure.check(model.name, tokens, klass, now, pools)
            if state not in (FULL, HOLD):
                if exclude is not None:
                    ctx.extras["flow_exclude"] = exclude
                if predicted is not None:
                    ctx.extras["flow_predicted"] = predicted
                return None
        else:
            pools = self._pools(ctx)
        await self.gate.wait(ctx, klass, wait_s, tokens, pools)
        return None

    def _pools(self, ctx: RequestContext) -> frozenset[str] | None:
        return self.pools_for(ctx) if self.pools_for is not None else None

    def finished(self, ctx: RequestContext) -> None:
        """The request has ended: its predicted and observed time to first token, for a class with
        a TTFT target (observed: streamed requests, from arrival; predicted: its wait plus the
        prediction for the backend that served it)."""
        if self.ttft_target(ctx) is None or ctx.backend is None:
            return
        extras = ctx.extras
        predicted: Mapping[str, float] | None = extras.get("flow_predicted")
        guess = predicted.get(ctx.backend.name) if predicted is not None else None
        if guess is not None:
            guess += extras.get("flow_waited", 0.0)
        first = ctx.first_token_at
        self._observer.flow_ttft(ctx.flow_class, guess, first - ctx.started if first is not None else None)

    def ttft_target(self, ctx: RequestContext) -> float | None:
        """The TTFT target of the request's class, seconds (None: its class has none)."""
        klass = self.classes.by_name.get(ctx.flow_class) if ctx.flow_class else None
        return klass.ttft_target_s if klass is not None else None

    # -- for operators ----------------------------------------------------------------------------
    def explain(self, body: dict[str, Any], priority: str | None) -> dict[str, Any]:
        """The flow part of the route dry run: the class a request of `body` from a principal of the
        default tier would have (`priority`: as if sent with `x-gateway-priority` by an admin) and
        what the flow stage would do with it now."""
        headers = {PRIORITY_HEADER: priority.encode("latin-1")} if priority else {}
        ctx = RequestContext(
            request_id="explain",
            endpoint="chat",
            started=0.0,
            headers=headers,
            receive=_no_body,
            body=body,
            principal=Principal(user="explain", roles=frozenset({"admin"})),
        )
        klass, wait_s = self.classes.resolve(ctx)
        out: dict[str, Any] = {
            "class": klass.name,
            "priority": klass.priority,
            "max_queue_s": wait_s,
            "ttft_target_s": klass.ttft_target_s,
            "enabled": self.enabled,
        }
        model = body.get("model")
        if isinstance(model, str):
            tokens = extract_features(body).total_prompt_tokens
            state, exclude, predicted = self.pressure.check(model, tokens, klass, time.monotonic())
            if state == FREE and not self.gate.clear_for(klass):
                state = FULL  # as urgent a request waits: this one would queue behind it
            out["state"] = _STATES[state]
            out["exclude"] = sorted(exclude) if exclude else []
            if predicted is not None:
                out["predicted_ttft_s"] = {b: round(s, 4) for b, s in predicted.items()}
        out["queued_here"] = self.gate.queued()
        return out

    async def report(self) -> dict[str, Any]:
        """`GET /admin/flow`: the classes, this replica's queues and every replica's waiting requests."""
        gate = self.gate
        loop_now = asyncio.get_running_loop().time()
        queued: dict[str, int] = {}
        oldest: dict[str, float] = {}
        for name in self.classes.by_name:
            items = gate.queue.items(name)
            queued[name] = len(items)
            if items:
                oldest[name] = round(loop_now - min(w.since for w in items), 3)
        shed: dict[str, dict[str, int]] = {}
        for (name, reason), n in sorted(gate.shed.items()):
            shed.setdefault(name, {})[reason] = n
        now = time.monotonic()
        rates = {
            b: round(spt, 9)
            for b in self.pressure.backend_names()
            if (spt := self.pressure.ttft.seconds_per_token(b)) is not None
        }
        replica = {
            "process": self.process,
            "queued": queued,
            "oldest_wait_s": oldest,
            "shed": shed,
            "saturated_backends": sorted(self.pressure.saturated_backends(now)),
            "seconds_per_prefill_token": rates,
        }
        figures = await self.figures() if self.figures is not None else None
        replicas: list[dict[str, Any]] | None = None
        if figures is not None:
            replicas = [{"process": proc, "queued": flow_waiting(f)} for proc, f in sorted(figures.items())]
        return {
            "enabled": self.enabled,
            "classes": {
                k.name: {
                    "priority": k.priority,
                    "max_queue_s": k.max_queue_s,
                    "max_queued": k.max_depth,
                    "ttft_target_s": k.ttft_target_s,
                    "max_kv_use": k.max_kv_use,
                }
                for k in sorted(self.classes.by_name.values(), key=lambda c: c.priority)
            },
            "replica": replica,
            "replicas": replicas,
            "shared": replicas is not None,
        }

    async def aclose(self) -> None:
        await self.gate.aclose()


async def _no_body() -> dict[str, Any]:
    return {"type": "http.disconnect"}
