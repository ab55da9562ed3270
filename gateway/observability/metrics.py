"""The gateway's Prometheus metrics (prefix `gateway_`, no per-user labels). Reference: docs/metrics.md.

One `Metrics` object per process owns its families on a private registry, so tests can build several
gateways in one process. Who feeds what:

    observe_request(ctx, now)   gateway/app.py, once per proxied request after the response ended
    observe_decision(decision)  the route stage's decision hook (pool, reason, affinity outcome)
    upstream_error(pool, kind)  the proxy stage's hook, once per failed attempt
    reject(stage, reason, ctx)  a stage that refuses a request (admission: limits, sanitiser, auth)
    flow_*(...)                 the flow queue (gateway/flow/): depth, waits, shed, engaged, TTFT by class
    observe_redis(op, seconds) / redis_failure(op) / set_redis_up(up)   whoever talks to Redis
    fleet gauges                gateway/observability/metrics_sampler.py, sampled from the fleet in every worker

The hot path is `observe_request`: it looks up one cached bundle of label children per (pool, model)
and one counter child per (pool, model, status), so a request costs a handful of increments and no
label resolution (measured in tests/gateway/observability/test_metrics.py; docs/metrics.md has the figure).

With several worker processes the families write to prometheus-client's multiprocess files
(gateway/observability/metrics_export.py); the gauges declare how workers' values combine (`multiprocess_mode`).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.core.context import Api, RequestContext

if TYPE_CHECKING:
    from policies.types import Decision

try:  # `_created` series double the output and no dashboard uses them; multiprocess mode has none.
    from prometheus_client import disable_created_metrics

    disable_created_metrics()  # type: ignore[no-untyped-call]
except ImportError:  # pragma: no cover - very old prometheus_client
    pass

#: request duration and TTFT, seconds: milliseconds to two minutes (LLM latencies span four decades)
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
)
#: time per output token, seconds: 1 ms to 1 s
PER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)
#: one Redis round trip, seconds: 100 µs to 1 s
REDIS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
#: share of a rate-limit budget left after admission, 0–1
BUDGET_BUCKETS = (0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)

#: rejection reasons of the limiter stage, created at zero so "no rejections" is a series, not a gap
LIMIT_REASONS = ("requests", "tokens", "concurrency", "too_large", "budget", "unavailable")
#: the scopes and periods of budgets (gateway_budget_rejections), created at zero
BUDGET_SCOPES = ("user", "tenant", "key")
BUDGET_PERIODS = ("day", "month", "rolling")
#: the pre-routing refusals of the gateway's own intake stages (parse, validate), by HTTP status
_INTAKE_REASONS = {
    400: "invalid_request",
    404: "model_not_found",
    413: "body_too_large",
    422: "invalid_request",
}
#: the rate-limit budget headers (OpenAI's), read back from a response to observe the budget left
_BUDGET_HEADERS = {
    b"x-ratelimit-limit-requests": ("requests", 0),
    b"x-ratelimit-remaining-requests": ("requests", 1),
    b"x-ratelimit-limit-tokens": ("tokens", 0),
    b"x-ratelimit-remaining-tokens": ("tokens", 1),
}
REJECTED_MARK = "metrics.rejected"
#: the client APIs that read the Responses store and never reach routing
_LOOKUPS = frozenset(
    {"responses.get", "responses.delete", "responses.input_items"}
)  # ctx.extras key: this refusal was already counted by `reject`


class _Value(Protocol):
    def inc(self, amount: float) -> None: ...


def _value(child: Counter) -> _Value:
    """The value cell of a counter child. Incrementing it directly skips the per-call checks of
    `Counter.inc` (amount sign, exemplars), about half of its cost; the amounts here are never
    negative. It is prometheus-client's one- or multi-process value alike."""
    cell: _Value = child._value
    return cell


class _Hist:
    """A histogram child's sum and bucket cells: `observe` is a bisect and two increments."""

    __slots__ = ("_bounds", "_buckets", "_sum")

    def __init__(self, child: Histogram) -> None:
        self._bounds: list[float] = list(child._upper_bounds)
        self._buckets: list[_Value] = list(child._buckets)
        self._sum: _Value = child._sum

    def observe(self, amount: float) -> None:
        self._sum.inc(amount)
        self._buckets[bisect_left(self._bounds, amount)].inc(1)


class _Series:
    """The value cells of one (pool, model), resolved once."""

    __slots__ = ("cached", "completion", "duration", "prompt", "spend", "status", "tpot", "ttft")

    def __init__(self, m: Metrics, pool: str, model: str) -> None:
        self.duration = _Hist(m.duration.labels(pool, model))
        self.ttft = _Hist(m.ttft.labels(pool, model))
        self.tpot = _Hist(m.tpot.labels(pool, model))
        self.prompt = _value(m.prompt_tokens.labels(pool, model))
        self.completion = _value(m.completion_tokens.labels(pool, model))
        self.cached = _value(m.cached_tokens.labels(pool, model))
        self.spend = _value(m.spend.labels(pool, model))
        self.status: dict[tuple[Api, int], _Value] = {}


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        pm = ["pool", "model"]
        pb = ["pool", "backend"]
        self.requests = Counter(
            "gateway_requests",
            "Requests answered, by pool, model, client API endpoint and HTTP status.",
            [*pm, "endpoint", "status"],
            registry=r,
        )
        self.duration = Histogram(
            "gateway_request_duration_seconds",
            "Time from request arrival to the end of the response.",
            pm,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time from request arrival to the first streamed token (streamed requests).",
            pm,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "gateway_time_per_output_token_seconds",
            "Streamed decode time per output token after the first.",
            pm,
            buckets=PER_TOKEN_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "gateway_prompt_tokens", "Prompt tokens, as the engines counted them.", pm, registry=r
        )
        self.completion_tokens = Counter(
            "gateway_completion_tokens", "Completion tokens, as the engines counted them.", pm, registry=r
        )
        self.cached_tokens = Counter(
            "gateway_cached_tokens",
            "Prompt tokens served from an engine's prefix cache (where the engine reports it).",
            pm,
            registry=r,
        )
        self.spend = Counter(
            "gateway_spend_usd",
            "Money spent, in USD at the models' configured prices, from the engines' usage.",
            pm,
            registry=r,
        )
        self.budget_rejections = Counter(
            "gateway_budget_rejections",
            "Requests refused because a budget was spent (429 insufficient_quota), by scope and period.",
            ["scope", "period"],
            registry=r,
        )
        self.backend_requests = Counter(
            "gateway_backend_requests",
            "Requests answered by each backend (the last one tried).",
            pb,
            registry=r,
        )
        self.rejections = Counter(
            "gateway_rejections",
            "Requests refused before routing, by stage and reason.",
            ["stage", "reason"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "gateway_upstream_errors",
            "Failed attempts to reach or read an engine, by pool and kind.",
            ["pool", "kind"],
            registry=r,
        )
        self.misconfigured = Counter(
            "gateway_upstream_misconfigured",
            "Engine answers of 404 for the backend's configured served-model name (the operator's "
            "config is wrong; the client got 502), by pool and backend.",
            pb,
            registry=r,
        )
        self.route_decisions = Counter(
            "gateway_route_decisions",
            "Routing decisions, by pool and reason.",
            ["pool", "reason"],
            registry=r,
        )
        self.affinity = Counter(
            "gateway_prefix_affinity",
            "Prefix-affinity outcome of routing decisions (hit, miss, spill, none).",
            ["pool", "outcome"],
            registry=r,
        )
        self.budget_left = Histogram(
            "gateway_ratelimit_remaining_ratio",
            "Share of the caller's rate-limit budget left after an admitted request (requests, tokens).",
            ["kind"],
            buckets=BUDGET_BUCKETS,
            registry=r,
        )
        self.redis_latency = Histogram(
            "gateway_redis_latency_seconds",
            "Redis round trips, by operation.",
            ["op"],
            buckets=REDIS_BUCKETS,
            registry=r,
        )
        self.redis_failures = Counter(
            "gateway_redis_failures",
            "Redis operations that failed (connection, timeout), by operation.",
            ["op"],
            registry=r,
        )
        # Gauges: how the values of several worker processes combine is part of their meaning.
        self.in_flight = Gauge(
            "gateway_in_flight_requests",
            "Requests being answered now, by pool (sum over workers).",
            ["pool"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.pool_weight = Gauge(
            "gateway_pool_weight",
            "Live routing weight of each pool (the latest any worker saw).",
            ["pool"],
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.backend_healthy = Gauge(
            "gateway_backend_healthy",
            "1 when the backend's last health probe passed (in every worker).",
            pb,
            registry=r,
            multiprocess_mode="livemin",
        )
        self.backend_circuit = Gauge(
            "gateway_backend_circuit_open",
            "1 while the backend's circuit breaker is not closed (open or half-open) in some worker.",
            pb,
            registry=r,
            multiprocess_mode="livemax",
        )
        self.backend_circuit_state = Gauge(
            "gateway_backend_circuit_state",
            "Circuit breaker state: 0 closed, 1 half-open, 2 open (the worst over workers).",
            pb,
            registry=r,
            multiprocess_mode="livemax",
        )
        self.backend_in_flight = Gauge(
            "gateway_backend_in_flight",
            "Requests open on the backend (sum over workers).",
            pb,
            registry=r,
            multiprocess_mode="livesum",
        )
        self.backend_prefill_tokens = Gauge(
            "gateway_backend_prefill_tokens",
            "Estimated prompt tokens sent to the backend and not yet answered with a first token, "
            "less what the routing expected it to hold (sum over workers).",
            pb,
            registry=r,
            multiprocess_mode="livesum",
        )
        self.backend_draining = Gauge(
            "gateway_backend_draining",
            "1 while an operator drains the backend (no new requests).",
            pb,
            registry=r,
            multiprocess_mode="livemax",
        )
        self.build_info = Gauge(
            "gateway_build_info",
            "1, labelled with the gateway's version and the Python it runs on.",
            ["version", "python"],
            registry=r,
            multiprocess_mode="max",
        )
        self.state_lost = Counter(
            "gateway_shared_state_lost",
            "Overrides, audit entries and API keys (those this replica had verified) found gone when "
            "Redis came back empty.",
            ["kind"],
            registry=r,
        )
        # The engines' KV-cache event streams (routing.kv_events; docs/routing.md), per backend.
        # Every routing process subscribes to every stream, so counters add up over a host's workers.
        self.kv_stream_connected = Gauge(
            "gateway_kv_stream_connected",
            "1 while the backend's KV-event stream is connected (in every worker).",
            pb,
            registry=r,
            multiprocess_mode="livemin",
        )
        self.kv_stream_usable = Gauge(
            "gateway_kv_stream_usable",
            "1 while routing trusts the backend's KV events (fresh, no unfilled gap; in every worker); "
            "0: approximate affinity for it.",
            pb,
            registry=r,
            multiprocess_mode="livemin",
        )
        self.kv_index_blocks = Gauge(
            "gateway_kv_index_blocks",
            "Engine KV blocks the routing index holds for the backend (the most any worker holds).",
            pb,
            registry=r,
            multiprocess_mode="livemax",
        )
        self.kv_events = Counter(
            "gateway_kv_events",
            "KV-cache events applied from the backend's stream (stored, removed, cleared), per worker summed.",
            pb,
            registry=r,
        )
        self.kv_event_gaps = Counter(
            "gateway_kv_event_gaps",
            "Sequence gaps in the backend's KV-event stream that replay did not fill (its blocks then "
            "age out).",
            pb,
            registry=r,
        )
        self.kv_event_restarts = Counter(
            "gateway_kv_event_restarts",
            "Times the backend's event sequence went back (the engine restarted: its blocks forgotten).",
            pb,
            registry=r,
        )
        self.kv_event_errors = Counter(
            "gateway_kv_event_errors",
            "Undecodable or unapplied KV-event messages and stream failures, per backend.",
            pb,
            registry=r,
        )
        self.kv_stores_anchored = Counter(
            "gateway_kv_stores_anchored",
            "Stored blocks under a parent the index never heard of (stored before it subscribed, or in a "
            "lost event), placed on a prompt routed to the backend, per worker summed.",
            pb,
            registry=r,
        )
        self.kv_stores_orphaned = Counter(
            "gateway_kv_stores_orphaned",
            "Stored blocks under a parent the index never heard of that no recently routed prompt "
            "placed: skipped (the index under-reports the backend), per worker summed.",
            pb,
            registry=r,
        )
        self.kv_warmups = Counter(
            "gateway_kv_warmups",
            "Warm-ups sent to open a hot prefix group's next holder (a background one-token prefill of "
            "its preamble; docs/routing.md, *Warm-ups*), by outcome: ok, error, skipped (the process's "
            "cap was reached), per worker summed.",
            [*pb, "outcome"],
            registry=r,
        )
        self.redis_up = Gauge(
            "gateway_redis_up",
            "1 when the last Redis probe answered (in every worker); absent without Redis.",
            registry=r,
            multiprocess_mode="livemin",
        )
        # Flow control (docs/flow-control.md): the queue at saturation, per class.
        self.flow_queued_requests = Gauge(
            "gateway_flow_queued",
            "Requests waiting in the gateway's flow queue, by class (sum over workers).",
            ["class"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.flow_queue_seconds = Histogram(
            "gateway_flow_queue_seconds",
            "Time requests waited in the flow queue, by class (served or not).",
            ["class"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.flow_shed_requests = Counter(
            "gateway_flow_shed",
            "Queued requests that left unserved, by class and reason: deadline, full, share (429), "
            "disconnect.",
            ["class", "reason"],
            registry=r,
        )
        self.flow_saturated_gauge = Gauge(
            "gateway_flow_saturated",
            "1 while the flow queue is engaged (requests wait in some worker).",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.ttft_predicted = Histogram(
            "gateway_ttft_predicted_seconds",
            "Time to first token predicted when the request was dispatched (its wait included), by class, "
            "for classes with a TTFT target.",
            ["class"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft_by_class = Histogram(
            "gateway_ttft_seconds",
            "Time to first token from arrival (streamed requests), by class, for classes with a TTFT target.",
            ["class"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._flow: dict[str, tuple[Gauge, _Hist, _Hist, _Hist]] = {}
        self._series: dict[tuple[str, str], _Series] = {}
        self._decisions: dict[tuple[str, str, str], tuple[Counter, Counter]] = {}
        self._upstream: dict[tuple[str, str], Counter] = {}
        self._rejects: dict[tuple[str, str], Counter] = {}
        self._backends: dict[tuple[str, str], _Value] = {}
        self._budget = {
            "requests": self.budget_left.labels("requests"),
            "tokens": self.budget_left.labels("tokens"),
        }
        for reason in LIMIT_REASONS:
            self._reject_child("limit", reason)
        self._budget_rejects = {
            (scope, period): self.budget_rejections.labels(scope, period)
            for scope in BUDGET_SCOPES
            for period in BUDGET_PERIODS
        }

    # -- hot path ---------------------------------------------------------------------------------
    def observe_request(self, ctx: RequestContext, now: float) -> None:
        """Account one request whose response has ended (sent, failed or abandoned)."""
        pool = ctx.pool.name if ctx.pool is not None else "none"
        model = ctx.model.name if ctx.model is not None else "unknown"
        series = self._series.get((pool, model))
        if series is None:
            series = self._series[(pool, model)] = _Series(self, pool, model)
        status = ctx.status
        api_status = (ctx.api, status)
        counter = series.status.get(api_status)
        if counter is None:
            counter = series.status[api_status] = _value(
                self.requests.labels(pool, model, ctx.api, str(status))
            )
        counter.inc(1)
        if ctx.response_headers:
            self._observe_budget(ctx.response_headers)
        if ctx.pool is None:
            # a stored response read back (GET /v1/responses/{id}) is never routed: its 404 is no refusal
            lookup = ctx.api in _LOOKUPS
            if status in _INTAKE_REASONS and REJECTED_MARK not in ctx.extras and not lookup:
                self._reject_child("intake", _INTAKE_REASONS[status]).inc()
            return
        series.duration.observe(now - ctx.started)
        backend = ctx.backend
        if backend is not None:
            key = (pool, backend.name)
            child = self._backends.get(key)
            if child is None:
                child = self._backends[key] = _value(self.backend_requests.labels(pool, backend.name))
            child.inc(1)
        usage = ctx.usage
        if usage is not None:
            series.prompt.inc(usage.prompt_tokens)
            series.completion.inc(usage.completion_tokens)
            if usage.cached_tokens:
                series.cached.inc(usage.cached_tokens)
            price = ctx.model.price if ctx.model is not None else None
            if price is not None:
                cached = min(usage.cached_tokens or 0, usage.prompt_tokens)
                cached_price = price.prompt if price.cached_prompt is None else price.cached_prompt
                series.spend.inc(
                    (
                        (usage.prompt_tokens - cached) * price.prompt
                        + cached * cached_price
                        + usage.completion_tokens * price.completion
                    )
                    / 1e6
                )
        first = ctx.first_token_at
        if first is not None:
            series.ttft.observe(first - ctx.started)
            if usage is not None and usage.completion_tokens > 1:
                series.tpot.observe((now - first) / (usage.completion_tokens - 1))

    def _observe_budget(self, headers: list[tuple[bytes, bytes]]) -> None:
        """The budget left, read back from OpenAI's rate-limit headers when a limiter set them."""
        found: dict[str, list[int]] = {}
        for name, value in headers:
            slot = _BUDGET_HEADERS.get(name)
            if slot is not None and value.isdigit():
                found.setdefault(slot[0], [0, -1])[slot[1]] = int(value)
        for kind, (limit, remaining) in found.items():
            if limit > 0 and remaining >= 0:
                self._budget[kind].observe(min(1.0, remaining / limit))

    def observe_decision(self, decision: Decision) -> None:
        key = (decision.pool, decision.reason, decision.affinity)
        children = self._decisions.get(key)
        if children is None:
            children = self._decisions[key] = (
                self.route_decisions.labels(decision.pool, decision.reason),
                self.affinity.labels(decision.pool, decision.affinity),
            )
        children[0].inc()
        children[1].inc()

    def upstream_error(self, pool: str, kind: str, backend: str | None = None) -> None:
        child = self._upstream.get((pool, kind))
        if child is None:
            child = self._upstream[(pool, kind)] = self.upstream_errors.labels(pool, kind)
        child.inc()
        if kind == "misconfigured" and backend is not None:
            self.misconfigured.labels(pool, backend).inc()

    def build(self, version: str, python: str) -> None:
        self.build_info.labels(version, python).set(1)

    def shared_state_lost(self, kind: str, count: int) -> None:
        """What the shared state lost when Redis came back empty (gateway/control/verbs.py)."""
        self.state_lost.labels(kind).inc(count)

    def warmup(self, pool: str, backend: str, outcome: str) -> None:
        """A warm-up's outcome (`gateway.routing.warmup`): rare, so no cached children."""
        self.kv_warmups.labels(pool, backend, outcome).inc()

    # -- flow control (gateway/flow/) --------------------------------------------------------------
    def flow_classes(self, names: list[str], reasons: tuple[str, ...]) -> None:
        """Create each class's series at zero, so "nothing queued or shed" is a series, not a gap."""
        for name in names:
            self._flow_child(name)
            for reason in reasons:
                self.flow_shed_requests.labels(name, reason)
        self.flow_saturated_gauge.set(0)

    def _flow_child(self, klass: str) -> tuple[Gauge, _Hist, _Hist, _Hist]:
        found = self._flow.get(klass)
        if found is None:
            found = self._flow[klass] = (
                self.flow_queued_requests.labels(klass),
                _Hist(self.flow_queue_seconds.labels(klass)),
                _Hist(self.ttft_predicted.labels(klass)),
                _Hist(self.ttft_by_class.labels(klass)),
            )
        return found

    def flow_queued(self, klass: str, waiting: int) -> None:
        self._flow_child(klass)[0].set(waiting)

    def flow_waited(self, klass: str, seconds: float) -> None:
        self._flow_child(klass)[1].observe(seconds)

    def flow_shed(self, klass: str, reason: str) -> None:
        self.flow_shed_requests.labels(klass, reason).inc()

    def flow_saturated(self, engaged: bool) -> None:
        self.flow_saturated_gauge.set(1 if engaged else 0)

    def flow_ttft(self, klass: str, predicted: float | None, observed: float | None) -> None:
        child = self._flow_child(klass)
        if predicted is not None:
            child[2].observe(predicted)
        if observed is not None:
            child[3].observe(observed)

    # -- admission and Redis ----------------------------------------------------------------------
    def reject(self, stage: str, reason: str, ctx: RequestContext | None = None) -> None:
        """Count a refusal by `stage` (e.g. `limit`, `sanitise`, `auth`) for a bounded `reason`.

        Pass `ctx` so the request is not counted a second time as an `intake` refusal. Reasons of the
        limit stage are LIMIT_REASONS; never put user input or ids in a reason.
        """
        self._reject_child(stage, reason).inc()
        if ctx is not None:
            ctx.extras[REJECTED_MARK] = True

    def _reject_child(self, stage: str, reason: str) -> Counter:
        child = self._rejects.get((stage, reason))
        if child is None:
            child = self._rejects[(stage, reason)] = self.rejections.labels(stage, reason)
        return child

    def budget_rejection(self, scope: str, period: str) -> None:
        """A request refused by a budget of `scope` (`user`, `tenant`, `key`) over `period`."""
        child = self._budget_rejects.get((scope, period))
        if child is None:
            child = self._budget_rejects[(scope, period)] = self.budget_rejections.labels(scope, period)
        child.inc()

    def observe_redis(self, op: str, seconds: float) -> None:
        """One Redis round trip of operation `op` (a fixed name such as `limit`, `ping`, `weights`)."""
        self.redis_latency.labels(op).observe(seconds)

    def redis_failure(self, op: str) -> None:
        self.redis_failures.labels(op).inc()

    def set_redis_up(self, up: bool) -> None:
        self.redis_up.set(1 if up else 0)
