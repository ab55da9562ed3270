"""Writes the Grafana dashboards in deploy/grafana/dashboards/ from the definitions below.

    python deploy/grafana/generate.py          # rewrite the JSON files
    python deploy/grafana/generate.py --check  # exit 1 if the committed files differ

The JSON is what Grafana loads (deploy/grafana/provisioning); this file is where panels are edited,
so the four dashboards share one layout, one datasource variable and one style. Every query names
metrics that exist: tests/deploy/test_prometheus.py evaluates each of them against a real
Prometheus scraping a gateway and both engines' simulators. Variables in queries: `$datasource`
(the Prometheus datasource), `$pool` (gateway pools, multi-value), `$__rate_interval`.
`deploy/grafana/check_schema.sh` type-checks the output against Grafana's own schema package.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"
P = 'pool=~"$pool"'


@dataclass
class Panel:
    title: str
    targets: list[tuple[str, str]]  # (expr, legend)
    unit: str = "short"
    description: str = ""
    kind: str = "timeseries"
    width: int = 12
    height: int = 8
    max: float | None = None
    thresholds: list[tuple[float, str]] = field(default_factory=list)


@dataclass
class Row:
    title: str
    panels: list[Panel]


def q(quantile: float, metric: str, by: str, selector: str = "") -> str:
    sel = "{" + selector + "}" if selector else ""
    return f"histogram_quantile({quantile}, sum by ({by}, le) (rate({metric}_bucket{sel}[{RI}])))"


def rate(metric: str, by: str, selector: str = "") -> str:
    sel = "{" + selector + "}" if selector else ""
    return f"sum by ({by}) (rate({metric}{sel}[{RI}]))"


# -- the dashboards ---------------------------------------------------------------------------------
def overview() -> list[Row]:
    five_xx = (
        f'(sum by (pool) (rate(gateway_requests_total{{{P}, status=~"5.."}}[{RI}]))'
        f" or 0 * sum by (pool) (rate(gateway_requests_total{{{P}}}[{RI}])))"
        f" / sum by (pool) (rate(gateway_requests_total{{{P}}}[{RI}]))"
    )
    four_xx = (
        f'(sum by (pool) (rate(gateway_requests_total{{{P}, status=~"4.."}}[{RI}]))'
        f" or 0 * sum by (pool) (rate(gateway_requests_total{{{P}}}[{RI}])))"
        f" / sum by (pool) (rate(gateway_requests_total{{{P}}}[{RI}]))"
    )
    lat = "gateway_request_duration_seconds"
    ttft = "gateway_time_to_first_token_seconds"
    tpot = "gateway_time_per_output_token_seconds"
    return [
        Row(
            "Traffic",
            [
                Panel(
                    "Requests per second, by pool",
                    [(rate("gateway_requests_total", "pool", P), "{{pool}}")],
                    "reqps",
                ),
                Panel(
                    "Responses per second, by status",
                    [(rate("gateway_requests_total", "status", P), "{{status}}")],
                    "reqps",
                    'pool="none" counts requests refused before routing.',
                ),
                Panel(
                    "In flight, by pool", [(f"sum by (pool) (gateway_in_flight_requests{{{P}}})", "{{pool}}")]
                ),
                Panel(
                    "Tokens per second, by pool",
                    [
                        (rate("gateway_prompt_tokens_total", "pool", P), "prompt {{pool}}"),
                        (rate("gateway_completion_tokens_total", "pool", P), "completion {{pool}}"),
                        (rate("gateway_cached_tokens_total", "pool", P), "cached {{pool}}"),
                    ],
                    "short",
                    "As the engines counted them (usage is always requested upstream).",
                ),
            ],
        ),
        Row(
            "Errors",
            [
                Panel(
                    "5xx share, by pool",
                    [(five_xx, "{{pool}}")],
                    "percentunit",
                    "Alert GatewayHighErrorRate at 5% for 5 minutes.",
                    thresholds=[(0.05, "red")],
                ),
                Panel("4xx share, by pool", [(four_xx, "{{pool}}")], "percentunit"),
                Panel(
                    "Upstream errors per second, by pool and kind",
                    [(rate("gateway_upstream_errors_total", "pool, kind", P), "{{pool}} {{kind}}")],
                    "ops",
                    "Failed attempts to reach or read an engine; most are retried on another backend.",
                    width=24,
                ),
            ],
        ),
        Row(
            "Latency",
            [
                Panel(
                    "Request duration p50 / p95 / p99, by pool",
                    [(q(x, lat, "pool", P), f"p{int(x * 100)} {{{{pool}}}}") for x in (0.5, 0.95, 0.99)],
                    "s",
                ),
                Panel(
                    "Time to first token p50 / p95 / p99, by pool",
                    [(q(x, ttft, "pool", P), f"p{int(x * 100)} {{{{pool}}}}") for x in (0.5, 0.95, 0.99)],
                    "s",
                    "Streamed requests. Alert GatewayTTFTP99OverSLO above 2 s.",
                    thresholds=[(2.0, "red")],
                ),
                Panel(
                    "Time per output token p50 / p99, by pool",
                    [(q(x, tpot, "pool", P), f"p{int(x * 100)} {{{{pool}}}}") for x in (0.5, 0.99)],
                    "s",
                ),
                Panel(
                    "Prompt tokens served from prefix caches, by pool",
                    [
                        (
                            f"{rate('gateway_cached_tokens_total', 'pool', P)} / {rate('gateway_prompt_tokens_total', 'pool', P)}",
                            "{{pool}}",
                        )
                    ],
                    "percentunit",
                    "Where the engine reports cached tokens (vLLM --enable-prompt-tokens-details, SGLang --enable-cache-report).",
                    max=1,
                ),
            ],
        ),
        Row(
            "Flow control (docs/flow-control.md)",
            [
                Panel(
                    "Waiting in the gateway's queue, by class",
                    [
                        ("sum by (class) (gateway_flow_queued)", "{{class}}"),
                        ("max(gateway_flow_saturated)", "queue engaged (1)"),
                    ],
                    "short",
                    "Requests wait in the gateway only while every backend they may use is saturated.",
                ),
                Panel(
                    "Time waited in the queue p50 / p99, by class",
                    [
                        (q(x, "gateway_flow_queue_seconds", "class"), f"p{int(x * 100)} {{{{class}}}}")
                        for x in (0.5, 0.99)
                    ],
                    "s",
                ),
                Panel(
                    "Shed per second, by class and reason",
                    [(rate("gateway_flow_shed_total", "class, reason"), "{{class}} {{reason}}")],
                    "ops",
                    "deadline and full answer 503 fleet_saturated, share answers 429; disconnect: the client left.",
                ),
                Panel(
                    "Time to first token p90, predicted and observed, by class",
                    [
                        (q(0.9, "gateway_ttft_predicted_seconds", "class"), "predicted {{class}}"),
                        (q(0.9, "gateway_ttft_seconds", "class"), "observed {{class}}"),
                    ],
                    "s",
                    "Classes with a TTFT target (flow.classes.<name>.ttft_target_s).",
                ),
            ],
        ),
    ]


def routing() -> list[Row]:
    affinity_share = (
        f"{rate('gateway_prefix_affinity_total', 'pool, outcome', P)}"
        f" / ignoring (outcome) group_left {rate('gateway_prefix_affinity_total', 'pool', P)}"
    )
    return [
        Row(
            "Decisions",
            [
                Panel(
                    "Route decisions per second, by reason",
                    [(rate("gateway_route_decisions_total", "pool, reason", P), "{{pool}} {{reason}}")],
                    "ops",
                    "The reason is the x-gateway-route header: pool part (pin, rule:<name>, default, +weights) + backend part.",
                    width=24,
                ),
                Panel(
                    "Prefix-affinity outcome share, by pool",
                    [(affinity_share, "{{pool}} {{outcome}}")],
                    "percentunit",
                    "hit: the conversation's home (or a warmer backend); miss: home, nothing known there yet; spill: moved for load.",
                    max=1,
                ),
                Panel(
                    "Pool weights",
                    [(f"max by (pool) (gateway_pool_weight{{{P}}})", "{{pool}}")],
                    "short",
                    "Live weights (admin API PUT /admin/pools/{pool}/weight).",
                ),
            ],
        ),
        Row(
            "Backends",
            [
                Panel(
                    "Requests per second, by backend",
                    [(rate("gateway_backend_requests_total", "pool, backend", P), "{{backend}}")],
                    "reqps",
                ),
                Panel(
                    "In flight, by backend (gateway's view)",
                    [(f"sum by (pool, backend) (gateway_backend_in_flight{{{P}}})", "{{backend}}")],
                ),
                Panel(
                    "Queued prefill tokens, by backend (gateway's view)",
                    [(f"sum by (pool, backend) (gateway_backend_prefill_tokens{{{P}}})", "{{backend}}")],
                    "short",
                ),
                Panel(
                    "Healthy (1) / failing probe (0)",
                    [(f"min by (pool, backend) (gateway_backend_healthy{{{P}}})", "{{backend}}")],
                    "short",
                    max=1,
                ),
                Panel(
                    "Circuit state (0 closed, 1 half-open, 2 open) and draining",
                    [
                        (
                            f"max by (pool, backend) (gateway_backend_circuit_state{{{P}}})",
                            "circuit {{backend}}",
                        ),
                        (f"max by (pool, backend) (gateway_backend_draining{{{P}}})", "draining {{backend}}"),
                    ],
                    "short",
                    max=2,
                ),
            ],
        ),
        Row(
            "KV-cache events (the engines' streams, as routing reads them)",
            [
                Panel(
                    "Stream usable (1) or approximate affinity (0), and connected",
                    [
                        (f"min by (pool, backend) (gateway_kv_stream_usable{{{P}}})", "usable {{backend}}"),
                        (
                            f"min by (pool, backend) (gateway_kv_stream_connected{{{P}}})",
                            "connected {{backend}}",
                        ),
                    ],
                    "short",
                    "Only backends with kv_events (or discovered). Usable 0: routing ignores the backend's events for now.",
                    max=1,
                ),
                Panel(
                    "Events applied per second, by backend",
                    [(rate("gateway_kv_events_total", "pool, backend", P), "{{backend}}")],
                    "ops",
                ),
                Panel(
                    "Blocks held by the routing index, by backend",
                    [(f"max by (pool, backend) (gateway_kv_index_blocks{{{P}}})", "{{backend}}")],
                ),
                Panel(
                    "Stream gaps, engine restarts, errors and stores under unknown parents per second",
                    [
                        (rate("gateway_kv_event_gaps_total", "pool, backend", P), "gaps {{backend}}"),
                        (rate("gateway_kv_event_restarts_total", "pool, backend", P), "restarts {{backend}}"),
                        (rate("gateway_kv_event_errors_total", "pool, backend", P), "errors {{backend}}"),
                        (
                            rate("gateway_kv_stores_anchored_total", "pool, backend", P),
                            "anchored {{backend}}",
                        ),
                        (
                            rate("gateway_kv_stores_orphaned_total", "pool, backend", P),
                            "orphaned {{backend}}",
                        ),
                    ],
                    "ops",
                    "A gap replay could not fill ages the backend's blocks out; a restart forgets them. "
                    "Stores under a parent never heard of (stored before this gateway subscribed) are "
                    "anchored on prompts it routed, or skipped as orphans (the index under-reports).",
                ),
            ],
        ),
        Row(
            "Engine load (the engines' own metrics, per instance)",
            [
                Panel(
                    "Running requests",
                    [
                        ("sum by (instance) (vllm:num_requests_running)", "vLLM {{instance}}"),
                        ("sum by (instance) (sglang:num_running_reqs)", "SGLang {{instance}}"),
                    ],
                ),
                Panel(
                    "Queued requests",
                    [
                        ("sum by (instance) (vllm:num_requests_waiting)", "vLLM {{instance}}"),
                        ("sum by (instance) (sglang:num_queue_reqs)", "SGLang {{instance}}"),
                    ],
                ),
            ],
        ),
    ]


def admission() -> list[Row]:
    total = f"sum(rate(gateway_requests_total[{RI}]))"
    budget = "gateway_ratelimit_remaining_ratio"
    return [
        Row(
            "Rejections",
            [
                Panel(
                    "Rejections per second, by stage and reason",
                    [(rate("gateway_rejections_total", "stage, reason"), "{{stage}} {{reason}}")],
                    "ops",
                    "stage: auth, intake, sanitise, limit (docs/metrics.md lists the reasons).",
                ),
                Panel(
                    "Share of requests refused, by stage",
                    [
                        (
                            f"{rate('gateway_rejections_total', 'stage')} / ignoring (stage) group_left {total}",
                            "{{stage}}",
                        )
                    ],
                    "percentunit",
                    "Alert GatewayLimiterRejectingLargeShare when stage=limit passes 25% for 10 minutes.",
                    thresholds=[(0.25, "red")],
                ),
                Panel(
                    "429 answers per second",
                    [(f'sum(rate(gateway_requests_total{{status="429"}}[{RI}]))', "429")],
                    "reqps",
                ),
            ],
        ),
        Row(
            "Remaining budget",
            [
                Panel(
                    "Budget left after admission: p10 and p50 across admitted requests",
                    [(q(x, budget, "kind"), f"p{int(x * 100)} {{{{kind}}}}") for x in (0.1, 0.5)],
                    "percentunit",
                    "From the x-ratelimit-remaining-* / x-ratelimit-limit-* headers of each answer, "
                    "per scope most constrained. Low p10: some callers run close to their limits.",
                    max=1,
                ),
                Panel(
                    "Admissions with 10% or less of the budget left",
                    [
                        (
                            f'sum by (kind) (rate({budget}_bucket{{le="0.1"}}[{RI}])) / sum by (kind) (rate({budget}_count[{RI}]))',
                            "{{kind}}",
                        )
                    ],
                    "percentunit",
                    max=1,
                ),
            ],
        ),
        Row(
            "Spend and budgets",
            [
                Panel(
                    "Spend, USD per hour, by model",
                    [(f"{rate('gateway_spend_usd_total', 'model')} * 3600", "{{model}}")],
                    "currencyUSD",
                    "At the models' configured prices, from the engines' usage. Per user, tenant or API "
                    "key: GET /admin/spend (never a label).",
                ),
                Panel(
                    "Budget refusals per second (429 insufficient_quota), by scope and period",
                    [(rate("gateway_budget_rejections_total", "scope, period"), "{{scope}} {{period}}")],
                    "ops",
                    "scope: user, tenant, key; period: day, month, rolling (docs/admission.md, Budgets).",
                ),
            ],
        ),
        Row(
            "Redis",
            [
                Panel(
                    "Redis round trip p50 / p99, by operation",
                    [
                        (q(x, "gateway_redis_latency_seconds", "op"), f"p{int(x * 100)} {{{{op}}}}")
                        for x in (0.5, 0.99)
                    ],
                    "s",
                ),
                Panel(
                    "Redis failures per second, by operation",
                    [(rate("gateway_redis_failures_total", "op"), "{{op}}")],
                    "ops",
                ),
                Panel(
                    "Redis reachable (1) per gateway replica",
                    [("min by (instance) (gateway_redis_up)", "{{instance}}")],
                    "short",
                    "Alert GatewayRedisUnreachable after 30 s at 0.",
                    max=1,
                ),
                Panel(
                    "Limiter deciding alone (Redis down, fail_open)",
                    [
                        ("max by (instance) (gateway_limiter_redis_down)", "redis down {{instance}}"),
                        (
                            f"sum by (instance) (rate(gateway_limiter_local_decisions_total[{RI}]))",
                            "local decisions/s {{instance}}",
                        ),
                    ],
                ),
            ],
        ),
    ]


def engines() -> list[Row]:
    def pair(
        title: str, unit: str, vllm: list[tuple[str, str]], sglang: list[tuple[str, str]], **kw: Any
    ) -> list[Panel]:
        return [Panel(f"vLLM: {title}", vllm, unit, **kw), Panel(f"SGLang: {title}", sglang, unit, **kw)]

    def by_inst(metric: str, agg: str = "sum") -> list[tuple[str, str]]:
        return [(f"{agg} by (instance) ({metric})", "{{instance}}")]

    def lat(prefix: str, name: str) -> list[tuple[str, str]]:
        return [
            (q(x, f"{prefix}:{name}", "instance"), f"p{int(x * 100)} {{{{instance}}}}") for x in (0.5, 0.99)
        ]

    kv = {"max": 1.0, "thresholds": [(0.92, "red")], "description": "Alert at 0.92 for 5 minutes."}
    return [
        Row(
            "Load",
            pair(
                "queue depth", "short", by_inst("vllm:num_requests_waiting"), by_inst("sglang:num_queue_reqs")
            ),
        ),
        Row(
            "Running",
            pair(
                "running requests",
                "short",
                by_inst("vllm:num_requests_running"),
                by_inst("sglang:num_running_reqs"),
            ),
        ),
        Row(
            "KV cache",
            pair(
                "KV-cache use",
                "percentunit",
                by_inst("vllm:kv_cache_usage_perc", "max"),
                by_inst("sglang:token_usage", "max"),
                **kv,
            ),
        ),
        Row(
            "Prefix cache",
            pair(
                "prefix-cache hit rate",
                "percentunit",
                [
                    (
                        f"sum by (instance) (rate(vllm:prefix_cache_hits_total[{RI}])) / sum by (instance) (rate(vllm:prefix_cache_queries_total[{RI}]))",
                        "{{instance}}",
                    )
                ],
                [
                    ("max by (instance) (sglang:cache_hit_rate)", "last batch {{instance}}"),
                    (
                        f"sum by (instance) (rate(sglang:cached_tokens_total[{RI}])) / sum by (instance) (rate(sglang:prompt_tokens_total[{RI}]))",
                        "windowed {{instance}}",
                    ),
                ],
                max=1.0,
                description="Share of prompt tokens found in the engine's prefix cache. SGLang's gauge covers its last prefill batch only.",
            ),
        ),
        Row(
            "TTFT",
            pair(
                "time to first token p50 / p99",
                "s",
                lat("vllm", "time_to_first_token_seconds"),
                lat("sglang", "time_to_first_token_seconds"),
            ),
        ),
        Row(
            "ITL",
            pair(
                "inter-token latency p50 / p99",
                "s",
                lat("vllm", "inter_token_latency_seconds"),
                lat("sglang", "inter_token_latency_seconds"),
            ),
        ),
        Row(
            "Queue time",
            pair(
                "time in queue p50 / p99",
                "s",
                lat("vllm", "request_queue_time_seconds"),
                lat("sglang", "queue_time_seconds"),
            ),
        ),
        Row(
            "Tokens",
            pair(
                "tokens per second",
                "short",
                [
                    (f"sum by (instance) (rate(vllm:prompt_tokens_total[{RI}]))", "prompt {{instance}}"),
                    (
                        f"sum by (instance) (rate(vllm:generation_tokens_total[{RI}]))",
                        "generation {{instance}}",
                    ),
                ],
                [
                    (f"sum by (instance) (rate(sglang:prompt_tokens_total[{RI}]))", "prompt {{instance}}"),
                    (
                        f"sum by (instance) (rate(sglang:generation_tokens_total[{RI}]))",
                        "generation {{instance}}",
                    ),
                ],
            ),
        ),
    ]


DASHBOARDS: dict[str, tuple[str, str, Any, bool]] = {
    # file stem: (uid, title, rows, has the pool variable)
    "gateway-overview": ("llm-gw-overview", "LLM gateway / Fleet overview", overview, True),
    "gateway-routing": ("llm-gw-routing", "LLM gateway / Routing", routing, True),
    "gateway-admission": ("llm-gw-admission", "LLM gateway / Admission", admission, False),
    "engines": ("llm-gw-engines", "LLM gateway / Engines: vLLM and SGLang", engines, False),
}


# -- rendering ----------------------------------------------------------------------------------------
def _panel_json(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [{"color": color, "value": value} for value, color in p.thresholds]
    defaults: dict[str, Any] = {
        "unit": p.unit,
        "min": 0,
        "thresholds": {"mode": "absolute", "steps": steps},
        "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}
        | ({"thresholdsStyle": {"mode": "line"}} if p.thresholds else {}),
    }
    if p.max is not None:
        defaults["max"] = p.max
    return {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DS,
        "gridPos": {"h": p.height, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DS,
                "expr": expr,
                "legendFormat": legend,
                "range": True,
            }
            for i, (expr, legend) in enumerate(p.targets)
        ],
    }


def _variables(with_pool: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "hide": 0,
            "refresh": 1,
            "regex": "",
        }
    ]
    if with_pool:
        definition = "label_values(gateway_requests_total, pool)"
        out.append(
            {
                "name": "pool",
                "label": "Pool",
                "type": "query",
                "datasource": DS,
                "query": {"query": definition, "refId": "PoolVariable"},
                "includeAll": True,
                "multi": True,
                "allValue": ".*",
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                "refresh": 2,
                "sort": 1,
                "hide": 0,
            }
        )
    return out


def build(stem: str) -> dict[str, Any]:
    uid, title, rows_fn, with_pool = DASHBOARDS[stem]
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row in rows_fn():
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y, x, row_h = pid + 1, y + 1, 0, 0
        for p in row.panels:
            if x + p.width > 24:
                x, y, row_h = 0, y + row_h, 0
            panels.append(_panel_json(p, pid, x, y))
            pid, x, row_h = pid + 1, x + p.width, max(row_h, p.height)
        y += row_h
    return {
        "uid": uid,
        "title": title,
        "description": "Generated by deploy/grafana/generate.py; metrics: docs/metrics.md.",
        "tags": ["llm-gateway"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": _variables(with_pool)},
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "links": [
            {
                "title": "LLM gateway",
                "type": "dashboards",
                "tags": ["llm-gateway"],
                "asDropdown": True,
                "includeVars": False,
                "keepTime": True,
                "targetBlank": False,
                "icon": "external link",
                "tooltip": "",
            }
        ],
        "panels": panels,
    }


def render(stem: str) -> str:
    return json.dumps(build(stem), indent=2) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for stem in DASHBOARDS:
        path = OUT / f"{stem}.json"
        text = render(stem)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("out of date (run python deploy/grafana/generate.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
