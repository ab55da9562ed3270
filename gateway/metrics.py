"""The gateway's Prometheus metrics (prefix `gateway_`, no per-user labels). Reference: docs/metrics.md.

One `Metrics` object per process owns its own registry, so tests can build several gateways in one
process. Label children are cached per label tuple by prometheus-client itself; the hot path calls
`observe_request` once per request, after the response has ended.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.context import RequestContext

# Milliseconds to a minute: LLM latencies span four orders of magnitude.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
PER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "gateway_requests",
            "Requests answered, by pool, model and HTTP status.",
            ["pool", "model", "status"],
            registry=r,
        )
        self.duration = Histogram(
            "gateway_request_duration_seconds",
            "Time from request arrival to the end of the response.",
            ["pool", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time from request arrival to the first streamed token.",
            ["pool", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "gateway_time_per_output_token_seconds",
            "Streamed decode time per output token after the first.",
            ["pool", "model"],
            buckets=PER_TOKEN_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "gateway_prompt_tokens",
            "Prompt tokens, as the engines counted them.",
            ["pool", "model"],
            registry=r,
        )
        self.completion_tokens = Counter(
            "gateway_completion_tokens",
            "Completion tokens, as the engines counted them.",
            ["pool", "model"],
            registry=r,
        )
        self.cached_tokens = Counter(
            "gateway_cached_tokens",
            "Prompt tokens served from an engine's prefix cache (where the engine reports it).",
            ["pool", "model"],
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
        self.in_flight = Gauge(
            "gateway_in_flight_requests", "Requests being answered now, by pool.", ["pool"], registry=r
        )
        self.route_decisions = Counter(
            "gateway_route_decisions",
            "Routing decisions, by pool and reason.",
            ["pool", "reason"],
            registry=r,
        )
        self.affinity = Counter(
            "gateway_prefix_affinity",
            "Prefix-affinity outcome of routing decisions.",
            ["outcome"],
            registry=r,
        )
        self.pool_weight = Gauge(
            "gateway_pool_weight", "Live routing weight of each pool.", ["pool"], registry=r
        )
        self.backend_healthy = Gauge(
            "gateway_backend_healthy",
            "1 when the backend's last health probe passed.",
            ["pool", "backend"],
            registry=r,
        )
        self.backend_circuit = Gauge(
            "gateway_backend_circuit_open",
            "1 while the backend's circuit breaker is open.",
            ["pool", "backend"],
            registry=r,
        )
        self.backend_in_flight = Gauge(
            "gateway_backend_in_flight",
            "Requests this replica has open on the backend.",
            ["pool", "backend"],
            registry=r,
        )

    def observe_request(self, ctx: RequestContext, now: float) -> None:
        pool = ctx.pool.name if ctx.pool is not None else "none"
        model = ctx.model.name if ctx.model is not None else "unknown"
        self.requests.labels(pool, model, str(ctx.status)).inc()
        if ctx.pool is None:
            return
        self.duration.labels(pool, model).observe(now - ctx.started)
        usage = ctx.usage
        if usage is not None:
            self.prompt_tokens.labels(pool, model).inc(usage.prompt_tokens)
            self.completion_tokens.labels(pool, model).inc(usage.completion_tokens)
            if usage.cached_tokens:
                self.cached_tokens.labels(pool, model).inc(usage.cached_tokens)
        if ctx.first_token_at is not None:
            self.ttft.labels(pool, model).observe(ctx.first_token_at - ctx.started)
            if usage is not None and usage.completion_tokens > 1:
                self.tpot.labels(pool, model).observe(
                    (now - ctx.first_token_at) / (usage.completion_tokens - 1)
                )

    def render(self) -> bytes:
        return generate_latest(self.registry)
