"""bench/BENCHMARKS.md and its PNG plots, written from one run's results (plain dicts, also saved as JSON).

Plots go to bench/plots/ (matplotlib, installed into the running venv from PyPI on first use, Agg
backend). The report states every target as met / missed / not measured, with the figures and the
py-spy profile summaries that explain the misses.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.overload_report import overload_md, overload_verdicts
from bench.procs import BENCH
from bench.serving import METRICS, PERCENTILES, Sla
from bench.verdicts import (
    Verdict,
    by_point,
    compared,
    med,
    overhead_verdicts,
    routing_verdicts,
    slope_us_per_chunk,
)

PLOTS = BENCH / "plots"
#: functions listed per profile: the few that explain where the CPU goes
PROFILE_ROWS = 4
ORDER = ("direct", "gw_bare", "gw_bare2", "gw_full", "sglang_router", "vllm_router", "litellm")
_COLORS = ("#444444", "#1f77b4", "#17becf", "#2ca02c", "#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2")


def _color(names: list[str], name: str) -> str:
    return _COLORS[names.index(name) % len(_COLORS)]


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], check=False)
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _f(x: float, fmt: str = "{:.0f}") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _keys(o: dict[str, Any]) -> list[str]:
    return [k for k in ORDER if k in o["targets"]] + [k for k in o["targets"] if k not in ORDER]


def _label(o: dict[str, Any], k: str) -> str:
    return str(o["targets"][k]["label"])


# -- plots -----------------------------------------------------------------------------------------
def overhead_plots(o: dict[str, Any]) -> list[str]:
    plt = _plt()
    PLOTS.mkdir(exist_ok=True)
    ns = o["nonstream"]
    concs = sorted({p["concurrency"] for p in ns})
    keys = _keys(o)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for k in keys:
        if k != "direct":
            added = [(med(ns, k, c, "p50_us") - med(ns, "direct", c, "p50_us")) / 1000 for c in concs]
            a1.plot(concs, added, marker="o", label=_label(o, k), color=_color(keys, k))
        a2.plot(
            concs,
            [med(ns, k, c, "cpu_us_per_req") / 1000 for c in concs],
            marker="o",
            label=_label(o, k),
            color=_color(keys, k),
        )
    a1.set_yscale("symlog", linthresh=0.1)
    a1.set(xscale="log", xlabel="concurrency (wrk connections)", ylabel="added p50 latency (ms, symlog)",
           title="Added latency over direct, non-streaming")  # fmt: skip
    a2.set(xscale="log", yscale="log", xlabel="concurrency (wrk connections)", ylabel="CPU per request (ms)",
           title="CPU per request of the target's process tree")  # fmt: skip
    for a in (a1, a2):
        a.set_xticks(concs, [str(c) for c in concs])
        a.grid(True, which="both", alpha=0.3)
    a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(PLOTS / "overhead.png", dpi=110)
    plt.close(fig)

    st = o["stream"]
    sconcs = sorted({p["concurrency"] for p in st})
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for k in keys:
        a1.plot(
            sconcs,
            [med(st, k, c, "p50_us") / 1000 for c in sconcs],
            marker="o",
            label=_label(o, k),
            color=_color(keys, k),
        )
        a2.plot(
            sconcs,
            [med(st, k, c, "cpu_us_per_req") / 1000 for c in sconcs],
            marker="o",
            label=_label(o, k),
            color=_color(keys, k),
        )
    a1.set(xscale="log", yscale="log", xlabel="concurrent streams", ylabel="time to first chunk p50 (ms)",
           title="Streaming (32 chunks): time to first chunk")  # fmt: skip
    a2.set(xscale="log", yscale="log", xlabel="concurrent streams", ylabel="CPU per stream (ms)",
           title="CPU per 32-chunk stream")  # fmt: skip
    for a in (a1, a2):
        a.set_xticks(sconcs, [str(c) for c in sconcs])
        a.grid(True, which="both", alpha=0.3)
    a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(PLOTS / "streaming.png", dpi=110)
    plt.close(fig)
    return ["plots/overhead.png", "plots/streaming.png"]


def routing_plots(r: dict[str, Any]) -> list[str]:
    plt = _plt()
    PLOTS.mkdir(exist_ok=True)
    rows = r["rows"]
    workloads = r["workloads"]
    routers = list(dict.fromkeys(x["router"] for x in rows))
    fig, axes = plt.subplots(2, len(workloads), figsize=(4 * len(workloads), 7), squeeze=False)
    for j, w in enumerate(workloads):
        for router in routers:
            pts = sorted(
                (x["load"], x["ttft_p50_ms"], x["ttft_p99_ms"])
                for x in rows
                if x["workload"] == w and x["router"] == router
            )
            if not pts:
                continue
            loads = [p[0] * 100 for p in pts]
            col = _color(routers, router)
            axes[0][j].plot(loads, [p[1] for p in pts], marker="o", label=router, color=col)
            axes[1][j].plot(loads, [p[2] for p in pts], marker="o", label=router, color=col)
        axes[0][j].set(title=w, ylabel="TTFT p50 (ms)", yscale="log")
        axes[1][j].set(xlabel="offered load (% of fleet capacity)", ylabel="TTFT p99 (ms)", yscale="log")
        for a in (axes[0][j], axes[1][j]):
            a.grid(True, which="both", alpha=0.3)
    handles = {h.get_label(): h for a in axes[0] for h in a.get_lines()}
    fig.legend(
        list(handles.values()), list(handles), loc="lower center", ncol=min(4, len(handles)), fontsize=8
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(PLOTS / "routing_ttft.png", dpi=110)
    plt.close(fig)
    return ["plots/routing_ttft.png"]


# -- markdown --------------------------------------------------------------------------------------
def verdict_table(vs: list[Verdict]) -> list[str]:
    lines = ["| area | target | measured | verdict |", "|---|---|---|---|"]
    lines += [f"| {v.area} | {v.target} | {v.measured} | {v.word} |" for v in vs]
    return lines


def overhead_md(o: dict[str, Any]) -> list[str]:
    keys = _keys(o)
    return [
        *_overhead_intro(o),
        *_nonstream_md(o, keys),
        *_stream_md(o, keys),
        *_memory_md(o, keys),
        *_many_streams_md(o),
    ]


def _overhead_intro(o: dict[str, Any]) -> list[str]:
    """The suite's heading: what was measured and how, and what could not be."""
    L: list[str] = ["## Overhead suite", ""]
    L.append(
        f"Gateway under test: {o.get('gateway_source', '?')}. Simulator: `{' '.join(o.get('sim_argv', []))}`."
    )
    plan = o["plan"]
    L.append(
        f"Each point: {plan['seconds']:.0f} s, {plan['rounds']} round(s) (median shown), targets alternated "
        "and their order rotated every round. CPU is user+system time of the target's whole process tree "
        "(from /proc, before/after), divided by completed requests; for `direct` it is the simulator's own."
    )
    L.append("")
    if o.get("unavailable"):
        L.append(
            "Not measured: "
            + "; ".join(f"**{k}** — {v.splitlines()[0][:160]}" for k, v in o["unavailable"].items())
        )
        L.append("")
    return L


def _nonstream_md(o: dict[str, Any], keys: list[str]) -> list[str]:
    """A table per concurrency of the non-streamed requests."""
    ns = o["nonstream"]
    L: list[str] = []
    L += ["### Non-streaming (wrk, `max_tokens` 16)", ""]
    for c in sorted({p["concurrency"] for p in ns}):
        L.append(f"**Concurrency {c}**")
        L.append("")
        L.append(
            "| target | req/s | p50 ms | p99 ms | added p50 ms | CPU µs/req | CPU vs ours (bare) | target CPU (cores) | wrk CPU (cores) | errors |"
        )
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for k in keys:
            cpu = med(ns, k, c, "cpu_us_per_req")
            bare = med(ns, "gw_bare", c, "cpu_us_per_req")
            added = med(ns, k, c, "p50_us") - med(ns, "direct", c, "p50_us")
            errs = sum(p["errors"] for p in ns if p["target"] == k and p["concurrency"] == c)
            L.append(
                f"| {_label(o, k)} | {_f(med(ns, k, c, 'rps'), '{:,.0f}')} | {_f(med(ns, k, c, 'p50_us') / 1000, '{:.3f}')} "
                f"| {_f(med(ns, k, c, 'p99_us') / 1000, '{:.2f}')} | {'' if k == 'direct' else _f(added / 1000, '{:+.3f}')} "
                f"| {_f(cpu)} | {'' if k == 'direct' else _f(cpu / bare, '{:.2f}×')} | {_f(med(ns, k, c, 'target_cpu_util'), '{:.2f}')} "
                f"| {_f(med(ns, k, c, 'client_cpu_util'), '{:.2f}')} | {errs} |"
            )
        L.append("")
    L += ["![added latency and CPU per request](plots/overhead.png)", ""]
    return L


def _stream_md(o: dict[str, Any], keys: list[str]) -> list[str]:
    """A table per concurrency of the streams, then the CPU each relayed chunk costs."""
    st = o["stream"]
    L: list[str] = []
    L += ["### Streaming (32 content chunks, `bench.streamclient` in its own process)", ""]
    for c in sorted({p["concurrency"] for p in st}):
        L.append(f"**{c} concurrent streams**")
        L.append("")
        L.append(
            "| target | streams/s | TTFC p50 ms | TTFC p99 ms | added TTFC p50 ms | total p50 ms | total p99 ms | CPU µs/stream | SSE events/stream | client CPU (cores) | errors |"
        )
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for k in keys:
            added = med(st, k, c, "p50_us") - med(st, "direct", c, "p50_us")
            errs = sum(p["errors"] for p in st if p["target"] == k and p["concurrency"] == c)
            L.append(
                f"| {_label(o, k)} | {_f(med(st, k, c, 'rps'), '{:,.0f}')} | {_f(med(st, k, c, 'p50_us') / 1000, '{:.3f}')} "
                f"| {_f(med(st, k, c, 'p99_us') / 1000, '{:.2f}')} | {'' if k == 'direct' else _f(added / 1000, '{:+.3f}')} "
                f"| {_f(med(st, k, c, 'total_p50_us') / 1000, '{:.2f}')} | {_f(med(st, k, c, 'total_p99_us') / 1000, '{:.2f}')} "
                f"| {_f(med(st, k, c, 'cpu_us_per_req'))} | {_f(med(st, k, c, 'events_per_stream'), '{:.0f}')} "
                f"| {_f(med(st, k, c, 'client_cpu_util'), '{:.2f}')} | {errs} |"
            )
        L.append("")
    L.append(
        "CPU per relayed chunk (slope between 128-chunk and 32-chunk streams at c=32, so the per-request cost cancels):"
    )
    L.append("")
    L.append("| target | CPU µs per chunk |")
    L.append("|---|---:|")
    for k in keys:
        L.append(f"| {_label(o, k)} | {_f(slope_us_per_chunk(o, k), '{:.1f}')} |")
    L += ["", "![streaming](plots/streaming.png)", ""]
    return L


def _memory_md(o: dict[str, Any], keys: list[str]) -> list[str]:
    """The memory slow streams held open cost each target (none when not measured)."""
    mem = o.get("memory") or {}
    if not mem:
        return []
    held = o["plan"]["held_streams"]
    L: list[str] = [
        f"### Memory: {held:,} slow streams held open (a chunk every {o['plan']['drip_ms']:.0f} ms)",
        "",
    ]
    L.append(
        "| target | RSS before MB | RSS with streams open MB | RSS per 1,000 streams MB | time to open all s | errors |"
    )
    L.append("|---|---:|---:|---:|---:|---:|")
    for k in keys:
        m = mem.get(k)
        if m:
            L.append(
                f"| {_label(o, k)} | {_f(m.get('rss_before_mb', math.nan), '{:.1f}')} | {_f(m.get('rss_during_mb', math.nan), '{:.1f}')} "
                f"| {_f(m['rss_delta_mb'], '{:.1f}')} | {_f(m['open_s'], '{:.2f}')} | {m['errors']:.0f} |"
            )
    L.append("")
    L.append("RSS is sampled with the streams open after the earlier phases warmed every process up, so it is "
             "the marginal memory of open streams, not the process's footprint.")  # fmt: skip
    L.append("")
    return L


def _many_streams_md(o: dict[str, Any]) -> list[str]:
    """One line on many concurrent streams through one gateway process (none when not measured)."""
    many = o.get("many_streams")
    if not many:
        return []
    return [
        f"**{many['streams']:,} concurrent streams through one gateway process** (bare, 1 worker): "
        f"{many['completed']:,.0f} completed, {many['errors']:,.0f} errors, all open after {many['open_s']:.2f} s, "
        f"TTFC p50 {many.get('ttfc_p50_ms', math.nan):.1f} ms / p99 {many.get('ttfc_p99_ms', math.nan):.1f} ms, "
        f"RSS +{many['rss_delta_mb']:.1f} MB per 1,000.",
        "",
    ]


def profiles_md(o: dict[str, Any]) -> list[str]:
    profs = o.get("profiles") or []
    if not profs:
        return []
    L = ["### Profiles of our gateway (py-spy, 250 Hz, one worker)", ""]
    L.append(
        "*self*: samples whose innermost Python frame is the function (C code is charged to its Python caller; "
        "`Runner.run` is the event loop itself); *inclusive*: samples with the function anywhere on the stack."
    )
    L.append("")
    for p in profs:
        if p.get("error"):
            L.append(f"- {p['name']}: profile failed ({p['error']})")
            continue
        L.append(f"**{p['name']}** ({p['samples']} samples; raw stacks in `{p.get('raw_path', '')}`)")
        L.append("")
        L.append("| self | function | | inclusive | our function |")
        L.append("|---:|---|---|---:|---|")
        rows = max(len(p["self_share"]), len(p["ours_inclusive"]))
        for i in range(min(rows, PROFILE_ROWS)):
            s = p["self_share"][i] if i < len(p["self_share"]) else ("", math.nan)
            n = p["ours_inclusive"][i] if i < len(p["ours_inclusive"]) else ("", math.nan)
            L.append(
                f"| {_f(s[1] * 100, '{:.1f} %')} | `{s[0]}` | | {_f(n[1] * 100, '{:.1f} %')} | `{n[0]}` |"
            )
        L.append("")
    return L


def routing_md(r: dict[str, Any]) -> list[str]:
    L = ["## Routing-quality suite", ""]
    L += r.get("preamble", [])
    L.append("")
    if r.get("unavailable"):
        L.append("Not measured: " + "; ".join(f"**{k}** — {v[:160]}" for k, v in r["unavailable"].items()))
        L.append("")
    L += [
        "Each cell: TTFT p50 / p99 in ms, then the hit rate (the simulators' cached ÷ prompt tokens) as a "
        "share of the oracle's; requests, rates and the raw hit rates are in `bench/results/routing.json`.",
        "",
        *by_point(r["rows"], "workload"),
    ]
    L += ["", "![TTFT vs offered load](plots/routing_ttft.png)", ""]
    L += serving_md(r)
    if any(x["rounds"] > 1 for x in r.get("repeats", [])):
        L += [
            "The table is round 0. The two routers a routing verdict compares (ours and round robin; least load "
            "on uniform traffic) run each point again on other Poisson schedules of the same requests, and the "
            "verdicts take the p99 of all rounds' first tokens pooled (`repeats` in the results).",
            "",
        ]
    return L


def serving_md(r: dict[str, Any]) -> list[str]:
    """The routing runs' serving figures (bench/serving.py) of ours at each workload's highest load,
    its baseline's goodput and cost beside them, and what they depend on: the SLA, the prices, the
    machine and the commit (the simulators' every flag is in the results, `serving.sim_argv`)."""
    env = r.get("serving")
    cells = {(x["workload"], x["load"], x["router"]): x for x in r["rows"] if "tpot_p50_ms" in x}
    top: dict[str, float] = {}
    for w, load, _ in cells:
        top[w] = max(top.get(w, 0.0), load)
    if not env or not top:
        return []
    sla, price = Sla(**env["sla"]), env["price"]
    L = ["### Serving figures", ""]
    L.append(
        "Ours (`prefix_affinity`) in the same runs, at each workload's highest load, as `vllm bench serve` "
        f"and SGLang's `bench_serving` report it (bench/serving.py): p50 / p90 / p99 in ms; goodput: "
        f"requests/s meeting {sla.label} (their share); cost per million tokens at the gateway config's "
        f"prices (USD per million: prompt {price['prompt']}, cached "
        f"{price.get('cached_prompt', price['prompt'])}, completion {price['completion']}); *vs*: the "
        "baseline's (round robin; least load on uniform traffic)."
    )
    L += ["", "| workload | load | TTFT | TPOT | ITL | E2E | output tok/s | goodput req/s | $ / M tok |"]
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")

    def goodput(x: dict[str, Any] | None) -> str:
        if x is None:
            return "—"
        return f"{_f(x['goodput_rps'], '{:.1f}')} ({_f(x['goodput_share'] * 100, '{:.0f}')} %)"

    def cost(x: dict[str, Any] | None) -> str:
        return "—" if x is None else _f(x["usd_per_mtok"], "{:.4f}")

    for w, load in top.items():
        ours, base = (cells.get((w, load, router)) for router in compared(w))
        if ours is None:
            continue
        latency = [" / ".join(_f(ours[f"{m}_p{q}_ms"], "{:,.0f}") for q in PERCENTILES) for m in METRICS]
        L.append(
            f"| {w} | {load:.0%} | " + " | ".join(latency) + f" | {_f(ours['output_tps'], '{:,.0f}')} "
            f"| {goodput(ours)} vs {goodput(base)} | {cost(ours)} vs {cost(base)} |"
        )
    m = r.get("machine") or {}
    L += [
        "",
        f"Environment: {m.get('date', '?')}, commit {m.get('commit', '?')}, {m.get('nproc', '?')} CPUs "
        f"({m.get('cpu', '?')}), Python {m.get('python', '?')}; the simulators of that commit with the "
        "fleet's flags above (each flag: `serving.sim_argv` in bench/results/routing.json).",
        "",
    ]
    return L


def kv_md(kv: dict[str, str]) -> list[str]:
    """The `kv` suite: bench/kv_micro.py's output as it printed it, and bench/replay.py's markdown tables."""
    date, commit = kv.pop("_date", ""), kv.pop("_commit", "")
    L = ["## KV events and routing processes (`python -m bench --suite kv`)", ""]
    L += [
        f"Measured {date or 'in an earlier run'} on commit {commit or '?'}, in-process (no servers): CPU times are "
        "the thread's own (`time.thread_time_ns`), the replay runs in virtual time (deterministic for a seed; "
        "figures are means over its seeds). Replay cells: hit rate ÷ the oracle's, and TTFT p99 in ms.",
        "",
    ]
    for name, text in kv.items():
        head, _, body = text.partition("\n\n")
        L += [f"### {name}", "", head, ""]
        lines = body.rstrip().splitlines()
        table = [x for x in lines if x.startswith("|")]
        rest = [x for x in lines if not x.startswith("|")]
        if table:  # the lines around a table print the same points
            L += [*table, ""]
        elif name.endswith("from their sources"):  # beside the compiled run: its summary lines
            L += ["```", *(x for x in rest if x.strip().startswith(("with", "all"))), "```", ""]
        else:  # the printed text without its runs of blank lines
            kept = [x for i, x in enumerate(rest) if x.strip() or (i and rest[i - 1].strip())]
            L += ["```", *kept, "```", ""]
    return L


def write(run: dict[str, Any], path: Path) -> None:
    m = run["machine"]
    o, r = run.get("overhead"), run.get("routing")
    L = ["# Benchmarks", ""]
    L.append(
        "Written by `make bench` (quick mode) or `make bench BENCH_ARGS=--full` (several rounds, longer points, "
        "the whole routing matrix); `python -m bench --help` lists the options. Each suite stores its results in "
        "`bench/results/*.json`; `python -m bench --report-only` renders this page again from them. Peers are "
        "installed from PyPI into `bench/.peers/` on first use; logs and raw profiles land in `bench/.work/`."
    )
    L.append("")
    L.append(
        f"- **This run**: `{m['command']}` — {run['mode']} mode, {m['date']}, {run.get('elapsed_s', 0) / 60:.1f} min"
    )
    L.append(
        f"- **Machine**: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']} GiB RAM, Linux {m['kernel']}; load average at start {m['loadavg_at_start']}"
    )
    L.append(
        f"- **Versions**: commit {m['commit']}; Python {m['python']}; {m['wrk']}; "
        + ", ".join(f"{k} {v}" for k, v in m["packages"].items())
    )
    if any((run.get("peer_versions") or {}).values()):  # none installed: a run without peers
        L.append(
            "- **Peers**: "
            + ", ".join(f"{k} {v or 'not installed'}" for k, v in run["peer_versions"].items())
        )
    L.append("")
    L.append(
        "> **Noise.** The machine may be shared with other work, and the targets, the simulators and the load "
        "generator share its cores: absolute figures move by tens of percent between runs; what matters is "
        "**ratios taken in the same run** with targets alternated (CPU per request is the most stable)."
    )
    L.append("")
    verdicts: list[Verdict] = []
    if o:
        verdicts += overhead_verdicts(o)
    if r:
        verdicts += routing_verdicts(r)
    if run.get("overload"):
        verdicts += overload_verdicts(run["overload"])
    if verdicts:
        L += ["## Targets", "", *verdict_table(verdicts), ""]
        missed = [v for v in verdicts if v.met is False and v.area in ("overhead", "streaming", "pipeline")]
        if missed and o:
            L += ["The profiles below (overhead suite) show where the gateway's CPU goes.", ""]
    if o:
        L += overhead_md(o)
        L += profiles_md(o)
    if r:
        L += routing_md(r)
    if run.get("routing_processes"):
        from bench.routing import processes_md

        processes = run["routing_processes"]
        same_fleet = bool(r) and r.get("preamble", [""])[:1] == processes["preamble"][:1]
        L += processes_md(
            processes, fleet="Fleet: the routing-quality suite's (above)." if same_fleet else None
        )
    if run.get("overload"):
        L += overload_md(run["overload"])
    micro = dict(run.get("micro") or {})
    date = micro.pop("_date", "")
    if micro:
        L += ["## Micro-benchmarks (other files in bench/)", ""]
        when = f"Measured {date}" if date else "Each with its command and date"
        L += [
            f"{when} (`python -m bench --suite micro`, or `--micro NAME` for one; quick mode does not rerun them).",
            "",
        ]
        for name, text in micro.items():
            L += [f"### `{name}`", "", text.strip(), ""]
    kv = dict(run.get("kv") or {})
    if kv:
        L += kv_md(kv)
    path.write_text("\n".join(L) + "\n")
