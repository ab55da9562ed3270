"""gateway/observability/metrics.py, metrics_export.py, metrics_sampler.py in-process: counts, labels, cost, auth."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engines.base import Usage
from gateway.core.context import RequestContext
from gateway.core.fleet import Fleet
from gateway.observability.access_log import AccessLog
from gateway.observability.metrics import LIMIT_REASONS, Metrics
from gateway.observability.metrics_export import MetricsExporter, multiprocess_dir, reap_dead_workers
from gateway.observability.metrics_sampler import MetricsSampler
from gateway.settings import AccessLogSettings, MetricsSettings, Settings, parse_settings
from policies.types import Decision

pytestmark = pytest.mark.processes


def _settings() -> Settings:
    return parse_settings(
        {
            "models": [{"name": "m"}],
            "pools": [
                {
                    "name": "vllm",
                    "dialect": "vllm",
                    "weight": 0.25,
                    "models": {"m": "served"},
                    "backends": [
                        {"name": "v0", "url": "http://127.0.0.1:1"},
                        {"name": "v1", "url": "http://127.0.0.1:2"},
                    ],
                }
            ],
        },
        environ={},
    )


def _ctx(
    fleet: Fleet | None, settings: Settings, *, status: int = 200, stream: bool = False
) -> RequestContext:
    async def receive() -> dict[str, Any]:
        return {}

    ctx = RequestContext(request_id="r", endpoint="chat", started=100.0, headers={}, receive=receive)
    ctx.model = settings.models[0]
    ctx.status = status
    if fleet is not None:
        ctx.pool = fleet.pools["vllm"]
        ctx.backend = ctx.pool.backends["v0"]
        ctx.usage = Usage(prompt_tokens=10, completion_tokens=21, cached_tokens=4)
        if stream:
            ctx.first_token_at = 100.5
    return ctx


def _samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(
        MetricsExporter(m.registry, MetricsSettings()).render().decode()
    ):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _v(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_observe_request_counts_requests_tokens_and_latencies() -> None:
    settings = _settings()
    fleet = Fleet(settings.pools, settings.upstream.health, 10)
    m = Metrics()
    m.observe_request(_ctx(fleet, settings), now=101.0)
    m.observe_request(_ctx(fleet, settings, stream=True), now=102.5)
    m.observe_request(_ctx(fleet, settings, status=502), now=100.2)
    s = _samples(m)
    assert _v(s, "gateway_requests_total", pool="vllm", model="m", endpoint="chat", status="200") == 2
    assert _v(s, "gateway_requests_total", pool="vllm", model="m", endpoint="chat", status="502") == 1
    assert _v(s, "gateway_prompt_tokens_total", pool="vllm", model="m") == 30
    assert _v(s, "gateway_completion_tokens_total", pool="vllm", model="m") == 63
    assert _v(s, "gateway_cached_tokens_total", pool="vllm", model="m") == 12
    assert _v(s, "gateway_backend_requests_total", pool="vllm", backend="v0") == 3
    assert _v(s, "gateway_request_duration_seconds_count", pool="vllm", model="m") == 3
    assert _v(s, "gateway_request_duration_seconds_sum", pool="vllm", model="m") == pytest.approx(
        1.0 + 2.5 + 0.2
    )
    # TTFT and time per output token only for the stream: 0.5 s, then 2.0 s over 20 tokens.
    assert _v(s, "gateway_time_to_first_token_seconds_count", pool="vllm", model="m") == 1
    assert _v(s, "gateway_time_to_first_token_seconds_bucket", pool="vllm", model="m", le="0.5") == 1
    assert _v(s, "gateway_time_to_first_token_seconds_bucket", pool="vllm", model="m", le="0.25") == 0
    assert _v(s, "gateway_time_per_output_token_seconds_sum", pool="vllm", model="m") == pytest.approx(0.1)


def test_refusals_before_routing_are_counted_once() -> None:
    settings = _settings()
    m = Metrics()
    m.observe_request(_ctx(None, settings, status=400), now=100.0)  # the intake's own validation
    ctx = _ctx(None, settings, status=400)
    m.reject("sanitise", "special_tokens", ctx)  # a stage that counted it itself
    m.observe_request(ctx, now=100.0)
    m.observe_request(_ctx(None, settings, status=503), now=100.0)  # not a refusal: no backend
    s = _samples(m)
    assert _v(s, "gateway_rejections_total", stage="intake", reason="invalid_request") == 1
    assert _v(s, "gateway_rejections_total", stage="sanitise", reason="special_tokens") == 1
    assert _v(s, "gateway_requests_total", pool="none", model="m", endpoint="chat", status="400") == 2
    assert _v(s, "gateway_requests_total", pool="none", model="m", endpoint="chat", status="503") == 1
    for reason in LIMIT_REASONS:  # the limiter's reasons exist at zero from the start
        assert ("gateway_rejections_total", (("reason", reason), ("stage", "limit"))) in s


def test_budget_is_read_from_the_rate_limit_headers() -> None:
    settings = _settings()
    fleet = Fleet(settings.pools, settings.upstream.health, 10)
    m = Metrics()
    ctx = _ctx(fleet, settings)
    ctx.response_headers += [
        (b"x-ratelimit-limit-requests", b"100"),
        (b"x-ratelimit-remaining-requests", b"5"),
        (b"x-ratelimit-limit-tokens", b"1000"),
        (b"x-ratelimit-remaining-tokens", b"900"),
    ]
    m.observe_request(ctx, now=101.0)
    s = _samples(m)
    assert _v(s, "gateway_ratelimit_remaining_ratio_bucket", kind="requests", le="0.05") == 1
    assert _v(s, "gateway_ratelimit_remaining_ratio_bucket", kind="tokens", le="0.75") == 0
    assert _v(s, "gateway_ratelimit_remaining_ratio_bucket", kind="tokens", le="0.9") == 1


def test_decisions_upstream_errors_and_redis() -> None:
    m = Metrics()
    for affinity in ("hit", "hit", "miss"):
        m.observe_decision(Decision("vllm", "v0", f"default+affinity:{affinity}", affinity))  # type: ignore[arg-type]
    m.upstream_error("vllm", "status_503")
    m.observe_redis("limit", 0.0004)
    m.redis_failure("limit")
    m.set_redis_up(False)
    s = _samples(m)
    assert _v(s, "gateway_route_decisions_total", pool="vllm", reason="default+affinity:hit") == 2
    assert _v(s, "gateway_prefix_affinity_total", pool="vllm", outcome="hit") == 2
    assert _v(s, "gateway_prefix_affinity_total", pool="vllm", outcome="miss") == 1
    assert _v(s, "gateway_upstream_errors_total", pool="vllm", kind="status_503") == 1
    assert _v(s, "gateway_redis_latency_seconds_bucket", op="limit", le="0.0005") == 1
    assert _v(s, "gateway_redis_failures_total", op="limit") == 1
    assert ("gateway_redis_up", ()) in s and _v(s, "gateway_redis_up") == 0


def test_sampler_copies_the_fleet_and_forgets_removed_backends() -> None:
    settings = _settings()
    fleet = Fleet(settings.pools, settings.upstream.health, 10)
    m = Metrics()
    sampler = MetricsSampler(fleet, m, 1.0)
    v0, v1 = fleet.backends["v0"], fleet.backends["v1"]
    v0.healthy, v1.healthy = True, False
    v0.in_flight, v1.in_flight = 3, 1
    for _ in range(3):
        v1.circuit.failure(time.monotonic())
    v1.draining = True
    sampler.sample()
    s = _samples(m)
    assert _v(s, "gateway_pool_weight", pool="vllm") == 0.25
    assert _v(s, "gateway_in_flight_requests", pool="vllm") == 4
    assert _v(s, "gateway_backend_healthy", pool="vllm", backend="v0") == 1
    assert _v(s, "gateway_backend_healthy", pool="vllm", backend="v1") == 0
    assert _v(s, "gateway_backend_circuit_open", pool="vllm", backend="v1") == 1
    assert _v(s, "gateway_backend_circuit_state", pool="vllm", backend="v1") == 2
    assert _v(s, "gateway_backend_circuit_state", pool="vllm", backend="v0") == 0
    assert _v(s, "gateway_backend_draining", pool="vllm", backend="v1") == 1
    assert _v(s, "gateway_backend_in_flight", pool="vllm", backend="v0") == 3
    fleet.remove_backend("v1")
    sampler.sample()
    s = _samples(m)
    assert ("gateway_backend_healthy", (("backend", "v1"), ("pool", "vllm"))) not in s
    assert _v(s, "gateway_in_flight_requests", pool="vllm") == 3


def test_bearer_token_protects_the_exposition() -> None:
    open_ = MetricsExporter(Metrics().registry, MetricsSettings())
    assert open_.authorized({})
    closed = MetricsExporter(Metrics().registry, MetricsSettings(bearer_token="s3cret"))
    assert not closed.authorized({})
    assert not closed.authorized({b"authorization": b"Bearer wrong"})
    assert not closed.authorized({b"authorization": b"Basic s3cret"})
    assert closed.authorized({b"authorization": b"Bearer s3cret"})
    assert closed.authorized({b"authorization": b"bearer s3cret"})


def test_multiprocess_dir_is_cleaned_and_dead_workers_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = tmp_path / "mp"
    given.mkdir()
    (given / "counter_123.db").write_bytes(b"stale")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(given))
    with multiprocess_dir() as path:
        assert path == str(given) and not list(given.iterdir()), "an earlier run's files are removed"
    assert given.is_dir(), "an operator-given directory is kept"
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    with multiprocess_dir() as path:
        assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == path
        dead = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True
        )
        pid = int(dead.stdout)
        for name in (
            f"gauge_livesum_{pid}.db",
            f"gauge_livemin_{pid}.db",
            f"counter_{pid}.db",
            f"gauge_livesum_{os.getpid()}.db",
        ):
            Path(path, name).write_bytes(b"")
        assert reap_dead_workers(path) == [pid]
        left = sorted(p.name for p in Path(path).iterdir())
        assert left == sorted([f"counter_{pid}.db", f"gauge_livesum_{os.getpid()}.db"]), (
            "counters of the dead stay"
        )
    assert not Path(path).exists(), "a directory the gateway created is removed"
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ


def test_observe_request_cost() -> None:
    """The per-request cost of the hot path (reported in docs/metrics.md); bound generous for CI noise."""
    settings = _settings()
    fleet = Fleet(settings.pools, settings.upstream.health, 10)
    m = Metrics()
    ctx = _ctx(fleet, settings, stream=True)
    ctx.response_headers += [
        (b"x-request-id", b"r"),
        (b"x-gateway-pool", b"vllm"),
        (b"x-gateway-route", b"default"),
    ]
    n = 20000
    for _ in range(1000):
        m.observe_request(ctx, 101.0)
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()  # CPU time: robust against other processes on a busy machine
        for _ in range(n):
            m.observe_request(ctx, 101.0)
        best = min(best, (time.process_time() - t0) / n)
    print(f"observe_request: {best * 1e6:.2f} µs CPU per streamed request (one process)")
    assert best < 50e-6


def test_access_log_line_has_the_fields_and_no_text(caplog: pytest.LogCaptureFixture) -> None:
    settings = _settings()
    fleet = Fleet(settings.pools, settings.upstream.health, 10)
    ctx = _ctx(fleet, settings, stream=True)
    ctx.raw_body = b'{"messages": [{"role": "user", "content": "secret prompt"}]}'
    ctx.route_reason, ctx.affinity, ctx.attempts = "default+affinity:hit", "hit", 2
    ctx.flow_class = "batch"
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        AccessLog(AccessLogSettings()).write(ctx, now=101.25)
        AccessLog(AccessLogSettings(include_text=True)).write(ctx, now=101.25)
    plain, with_text = (json.loads(r.getMessage()) for r in caplog.records)
    assert plain["request_id"] == "r" and plain["principal"] == "anonymous"
    assert (plain["pool"], plain["backend"], plain["status"]) == ("vllm", "v0", 200)
    assert (
        plain["prompt_tokens"],
        plain["completion_tokens"],
        plain["cached_tokens"],
        plain["total_tokens"],
    ) == (10, 21, 4, 31)
    assert plain["ttft_ms"] == 500.0 and plain["duration_ms"] == 1250.0
    assert plain["route"] == "default+affinity:hit" and plain["affinity"] == "hit" and plain["attempts"] == 2
    assert plain["class"] == "batch"
    assert "secret prompt" not in json.dumps(plain)
    assert "secret prompt" in with_text["request_body"]


def test_requests_are_counted_by_client_api_and_lookups_are_no_refusals() -> None:
    settings = _settings()
    fleet = Fleet(settings.pools, settings.upstream.health, 10)
    m = Metrics()
    ctx = _ctx(fleet, settings)
    ctx.api = "responses"
    m.observe_request(ctx, now=101.0)
    lookup = _ctx(None, settings, status=404)
    lookup.api = "responses.get"  # a stored response that is not there: not an intake refusal
    m.observe_request(lookup, now=100.0)
    s = _samples(m)
    assert _v(s, "gateway_requests_total", pool="vllm", model="m", endpoint="responses", status="200") == 1
    assert _v(s, "gateway_requests_total", pool="vllm", model="m", endpoint="chat", status="200") == 0
    assert (
        _v(s, "gateway_requests_total", pool="none", model="m", endpoint="responses.get", status="404") == 1
    )
    assert _v(s, "gateway_rejections_total", stage="intake", reason="model_not_found") == 0
