"""Serving figures of one run, from its per-request records (bench/tracerunner.py), as the engines' own
benchmark tools (`vllm bench serve`, SGLang's `bench_serving`) define them:

- **TTFT**: send to the first SSE event; **E2E**: send to the last byte; **ITL**: the gaps between a
  request's successive token events, pooled over the run; **TPOT**: per request, (E2E − TTFT) ÷
  (output tokens − 1); each at p50 / p90 / p99, in ms;
- **output tokens/s**: the run's completion tokens over its span (first send to last byte);
- **goodput**: requests per second that met the SLA (TTFT and TPOT both within it; a one-token answer
  by its TTFT alone), and their share of the completed requests;
- **cost per million tokens**: the run's usage (prompt, cached prompt and completion tokens) priced as
  the gateway bills it (`policies.budgets.Price`, from the gateway config's `models[].price`), over
  its prompt and completion tokens.

A record: `{"sent", "ttft", "total"}` in seconds, `"itl"`: its token events' gaps in seconds,
`"tokens"`: its token events, `"usage"`: `[prompt, completion, cached]` when the stream ended with one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.budgets import NANOS_PER_USD, Price

PERCENTILES = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl", "e2e")


@dataclass(frozen=True)
class Sla:
    """The latency a request must meet to count towards goodput."""

    ttft_ms: float
    tpot_ms: float

    @property
    def label(self) -> str:
        return f"TTFT ≤ {self.ttft_ms:,.0f} ms and TPOT ≤ {self.tpot_ms:,.0f} ms"


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-th percentile; NaN for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def _tokens(record: dict[str, Any]) -> int:
    usage = record.get("usage")
    return int(usage[1]) if usage else int(record.get("tokens", 0))


def tpot_s(record: dict[str, Any]) -> float | None:
    """(E2E − TTFT) ÷ (output tokens − 1); None for an answer of one token or none."""
    n = _tokens(record)
    return (record["total"] - record["ttft"]) / (n - 1) if n > 1 else None


def figures(records: Sequence[dict[str, Any]], sla: Sla, price: Price) -> dict[str, float]:
    """The serving figures of the completed `records` (those with a TTFT): `<metric>_p<q>_ms` for
    every metric and percentile, `output_tps`, `goodput_rps`, `goodput_share`, `usd_per_mtok`."""
    done = [r for r in records if "ttft" in r and "total" in r]
    series = {
        "ttft": [r["ttft"] for r in done],
        "e2e": [r["total"] for r in done],
        "itl": [gap for r in done for gap in r.get("itl", ())],
        "tpot": [t for r in done if (t := tpot_s(r)) is not None],
    }
    out: dict[str, float] = {
        f"{m}_p{q}_ms": percentile(series[m], q) * 1000 for m in METRICS for q in PERCENTILES
    }
    span = max((r["sent"] + r["total"] for r in done), default=0.0) - min(
        (r["sent"] for r in done), default=0.0
    )
    good = 0
    for r in done:
        t = tpot_s(r)
        good += r["ttft"] * 1000 <= sla.ttft_ms and (t is None or t * 1000 <= sla.tpot_ms)
    out["output_tps"] = sum(_tokens(r) for r in done) / span if span > 0 else math.nan
    out["goodput_rps"] = good / span if span > 0 else math.nan
    out["goodput_share"] = good / len(done) if done else math.nan
    usage = [r["usage"] for r in done if r.get("usage")]
    tokens = sum(p + c for p, c, _ in usage)
    nanos = sum(price.cost(p, c, cached) for p, c, cached in usage)
    out["usd_per_mtok"] = nanos / NANOS_PER_USD / tokens * 1e6 if tokens else math.nan
    return out
