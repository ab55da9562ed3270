"""The overload suite's verdicts and its section of bench/BENCHMARKS.md, from its results
(bench/results/overload.json, written by bench/overload.py): formatting alone, no processes.

bench/BENCHMARKS.md has a byte budget (scripts/lint_docs.py): the verdicts and the section are terse,
the setup is bench/overload.py's docstring and every figure is in the results.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from bench.verdicts import Verdict

#: what became of a request (bench/overload.py `outcome`)
OUTCOMES = ("served", "429", "503", "no retry-after", "error", "lost")


def _points(res: dict[str, Any], flow: str, replicas: int = 1) -> dict[float, dict[str, Any]]:
    return {p["load"]: p for p in res.get("points", []) if p["flow"] == flow and p["replicas"] == replicas}


def fmt_ms(x: float | None) -> str:
    """Milliseconds for the report; None is a percentile that fell on a lost request."""
    return "lost" if x is None else f"{x:,.0f}"


def fmt_load(load: float) -> str:
    """A load in multiples of capacity: 1.5×."""
    return f"{load:g}×"


def _ratio_p99(p: dict[str, Any], base: dict[str, Any]) -> float:
    """p99 ÷ the base's p99; inf when `p`'s p99 is a lost request, NaN when the base's is."""
    a, b = p["ttft_p99_ms"], base["ttft_p99_ms"]
    if b is None or not b:
        return math.nan
    return math.inf if a is None else float(a) / float(b)


def _totals(points: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Requests by outcome over `points`, every class."""
    total = dict.fromkeys(OUTCOMES, 0)
    for p in points:
        for by in p["outcomes"].values():
            for k, n in by.items():
                total[k] += n
    return total


def _bad(total: dict[str, int]) -> int:
    """Requests neither served nor refused properly: lost, errors, refusals without retry-after."""
    return total["lost"] + total["error"] + total["no retry-after"]


def _outcome_text(points: Iterable[dict[str, Any]]) -> str:
    t = _totals(points)
    return f"{_bad(t):,} of {sum(t.values()):,} lost or failed"


def _p99_text(points: dict[float, dict[str, Any]], base: float, over: Sequence[float]) -> str:
    cells = [
        f"{fmt_load(x)} "
        + ("lost" if points[x]["ttft_p99_ms"] is None else f"{_ratio_p99(points[x], points[base]):.2f}×")
        for x in over
    ]
    return ", ".join(cells) + f" (of {fmt_ms(points[base]['ttft_p99_ms'])} ms)"


def _share_text(points: dict[float, dict[str, Any]], over: Sequence[float]) -> str:
    """The backlogged tenants' deviation from their fair share at each load (the others are not judged)."""
    cells = []
    for x in over:
        devs = [
            f"{t} {(s['ratio'] - 1) * 100:+.0f} %" for t, s in points[x]["shares"].items() if s["backlogged"]
        ]
        cells.append(f"{fmt_load(x)} " + (", ".join(devs) if devs else "none backlogged"))
    return "; ".join(cells)


#: why a target misses where the suite has shown it (read from its per-request records), appended to
#: a missed target's figure
WHY_MISSED = {
    "ttft": "the rest is in the engine: steps shared with documents' prefills",
    "shares": "waits reach the {deadline:g} s deadline; the {window:g} s window serves a backlog built in "
    "arrival order",
}


def _why(measured: str, met: bool | None, key: str, **run: float) -> str:
    """`measured`, and when the target is missed why (`WHY_MISSED`, with the run's `run` figures)."""
    return f"{measured} ({WHY_MISSED[key].format(**run)})" if met is False else measured


def overload_verdicts(res: dict[str, Any]) -> list[Verdict]:
    """The flow-control targets on the suite's results, one verdict each (flow off's figure beside flow
    on's where the target compares them; the section's table has the rest); not measured when flow on
    was not run (a gateway without flow control)."""
    on, off = _points(res, "on"), _points(res, "off")
    loads = sorted(off or on)
    if not loads:
        return []
    base, over = loads[0], [x for x in loads if x > 1]
    have = bool(on) and all(x in on for x in loads)
    absent = "flow on not measured"
    out: list[Verdict] = []

    target = f"interactive TTFT p99 at {', '.join(fmt_load(x) for x in over)} load ≤ 1.5× its p99 at {fmt_load(base)}"
    off_text = f"off: {_p99_text(off, base, over)}"
    if have:
        ratios = [_ratio_p99(on[x], on[base]) for x in over]
        met = None if any(math.isnan(r) for r in ratios) else all(r <= 1.5 for r in ratios)
        text = _why(f"on: {_p99_text(on, base, over)}; {off_text}", met, "ttft")
        out.append(Verdict("overload", target, text, met))
    else:
        out.append(Verdict("overload", target, f"{absent}; {off_text}", None))

    target = "backlogged batch tenants' tokens within ±10 % of weighted share"
    if have:
        devs = [abs(s["ratio"] - 1) for x in over for s in on[x]["shares"].values() if s["backlogged"]]
        met = all(d <= 0.10 for d in devs) if devs else None
        lo, hi = res.get("share_window") or (0.0, 0.0)
        deadline = float(res.get("classes", {}).get("batch", {}).get("max_queue_s", 0.0))
        text = _why(_share_text(on, over), met, "shares", deadline=deadline, window=hi - lo)
        out.append(Verdict("overload", target, text, met))
    else:
        out.append(Verdict("overload", target, absent, None))

    target = "every request served or refused with retry-after by its deadline + 1 s"
    off_text = f"off: {_outcome_text(off.values())}"
    if have:
        every_on = [p for p in res.get("points", []) if p["flow"] == "on"]
        met = _bad(_totals(every_on)) == 0
        out.append(Verdict("overload", target, f"on: {_outcome_text(every_on)}; {off_text}", met))
    else:
        out.append(Verdict("overload", target, f"{absent}; {off_text}", None))

    target = "goodput (output tok/s within class TTFT targets) ≥ flow off's"
    if have:
        text = ", ".join(
            f"{fmt_load(x)} {on[x]['goodput_tps']:,.0f} vs {off[x]['goodput_tps']:,.0f}" for x in over
        )
        met = all(on[x]["goodput_tps"] >= off[x]["goodput_tps"] for x in over)
        out.append(Verdict("overload", target, f"on vs off: {text} tok/s", met))
    else:
        out.append(Verdict("overload", target, absent, None))

    target = "added latency p50 below saturation ≤ 0.1 ms"
    probe = res.get("probe") or {}
    if have and probe.get("added_ms") is not None:
        text = f"{probe['added_ms']:+.3f} ms (median of {len(probe['on_p50_us'])} paired rounds)"
        out.append(Verdict("overload", target, text, probe["added_ms"] <= 0.1))
    else:
        out.append(Verdict("overload", target, absent if not have else "probe failed", None))
    return out


def overload_md(res: dict[str, Any]) -> list[str]:
    """The suite's section of bench/BENCHMARKS.md: when and how it ran, a line per (load, flow, replicas)."""
    m = res.get("machine", {})
    replicas = any(p["replicas"] > 1 for p in res["points"])
    L = ["## Overload suite", ""]
    L.append(
        f"`--suite overload`, {m.get('date', '?')}, commit {m.get('commit', '?')}, {res['elapsed_s'] / 60:.1f} min; setup: "
        f"bench/overload.py; capacity {res['capacity']['rps']:.1f} req/s; {res['arrival_s']:g} s of arrivals "
        f"a run; seeds {', '.join(map(str, res['seeds']))} pooled"
        + (f"; on ×2: two replicas sharing Redis, seed {res['seeds'][0]}." if replicas else ".")
        + "".join(f" Not measured: {k} ({v})." for k, v in (res.get("unavailable") or {}).items())
    )
    L += [
        "",
        "| load | flow | interactive TTFT p50/p99 ms | batch ÷ fair "
        "| served/429/503/lost/other | waited (p50 ms) | goodput tok/s |",
        "|---:|---|---:|---|---:|---:|---:|",
    ]
    for p in sorted(res["points"], key=lambda p: (p["load"], p["replicas"], p["flow"])):
        t = _totals([p])
        ttft = "/".join(fmt_ms(p[f"ttft_p{q}_ms"]) for q in (50, 99))
        # below capacity nothing is backlogged: what the window's edges leave in flight is no share
        share = (
            "—"
            if p["load"] < 1
            else ", ".join(
                f"{k} {s['ratio']:.2f}{'' if s['backlogged'] else '*'}" for k, s in p["shares"].items()
            )
        )
        flow = p["flow"] + (f" ×{p['replicas']}" if p["replicas"] > 1 else "")
        waited = f"{p['queued']:,} ({p['queue_p50_ms']:,.0f})" if p.get("queued") else "0"
        other = t["error"] + t["no retry-after"]
        L.append(
            f"| {fmt_load(p['load'])} | {flow} | {ttft} | {share} "
            f"| {t['served']}/{t['429']}/{t['503']}/{t['lost']}/{other} | {waited} | {p['goodput_tps']:,.0f} |"
        )
    L += [
        "",
        f"\\* not backlogged. *Lost*: no first token or refusal by deadline + {res['lost_grace_s']:g} s; "
        "*waited*: with `x-gateway-queue-ms`.",
        "",
    ]
    return L
