"""Overload suite: flow control on and off, side by side, on one saturated fleet (`python -m bench
--suite overload`).

**Fleet.** `BACKENDS` vLLM-dialect simulators running the batching engine (engines/sim/step_model.py)
with a bounded capacity (`MAX_NUM_SEQS` running sequences, a KV pool of `CACHE_BLOCKS` blocks, a step
budget of `STEP_TOKENS` tokens) and the step costs of Llama-3.1-8B on one H100 (`StepCosts`'
defaults) `SLOWDOWN` times slower, one pool behind one real gateway on loopback.

**Traffic** (`TENANTS`): three tenants in two classes, each a JWT with its tier and tenant: `chat`
(tier `chat`, `priority_class: interactive`: short prompts, short streamed answers) and two batch
tenants of long-document jobs (tier `batch`, `priority_class: batch`), `docs-b` offering twice what
`docs-a` offers. Every answer has exactly its `max_tokens` (`ignore_eos`).

**Capacity** (`calibrate`): the fleet's throughput in requests of this mix, from the simulators' own
step model in virtual time, every engine saturated (the mix queued at once, FCFS, as the engines
schedule it): completions between the 10th and the 90th percentile over their time. Offered load is
`LOADS` times that, as seeded open-loop Poisson arrivals per tenant over `ARRIVAL_S` (`schedule`: one
unit-rate process per seed and tenant, scaled to the load, so flow on and off get the same arrivals,
and a higher load the same requests and more).

**Runs.** Every (seed, load) runs with `flow.enabled: false` and `true` (two gateways started once,
alternating which goes first), then with two flow-on replicas sharing Redis (`routing.shared`) at the
highest load on the first seed. A client that has neither a first token nor a refusal by its
class's `max_queue_s` plus `LOST_GRACE_S` gives up: that request is *lost* (bench/tracerunner.py
`give_up`), and its disconnect reaches the engine. Without flow control in the gateway under test
(`flow_available`), flow off runs alone, with no `flow` section in its config, and the verdicts say
*not measured*. `python -m bench.overload` runs the suite alone, shortened at will (`--seconds`,
`--seed`, `--off-only`), and prints the verdicts.

**Figures** (`summarise`, over the seeds pooled): interactive TTFT p50/p90/p99 (lost requests count as
never answered: above any figure), every request's outcome (`OUTCOMES`), each batch tenant's served
tokens (prompt plus output) in `share_window` against its weighted max-min fair share of what its class
was served there (`fair_shares`), goodput (output tokens/s of requests within their class's
`TTFT_TARGET_S`) and, in a separate probe, the gateway's added latency below saturation (non-streaming
requests through a gateway with flow on and one with flow off to a zero-latency simulator, wrk at one
connection, `PROBE_ROUNDS` alternated rounds). bench/overload_report.py checks them against the targets.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from bench.overload_report import OUTCOMES, fmt_load, fmt_ms, overload_verdicts
from bench.procs import ROOT, WORK, Service, free_port
from bench.serving import percentile
from bench.targets import GatewaySource, gateway_service, gateway_source, source_has
from bench.workloads import Words
from engines.sim import tokenizer
from engines.sim.config import parse_config
from engines.sim.prompt import render_chat
from engines.sim.step_model import Seq, StepCosts, StepEngine
from gateway.admission.tokens import mint_token
from gateway.demo import SERVED
from gateway.demo import sim_flags as demo_sim_flags

Log = Callable[[str], None]
PUBLIC = "bench-model"
JWT_SECRET = "bench-secret-not-for-production-0123456789abcdef"

# -- the fleet -------------------------------------------------------------------------------------
#: simulators behind the gateway (one pool): the fewest for placement to have a choice
BACKENDS = 2
#: the step costs of an H100 on Llama-3.1-8B this many times slower, so the fleet saturates at tens of
#: requests a second: what two shared cores drive through a gateway and a client
SLOWDOWN = 4.0
#: running sequences per engine: a bounded batch, so the engines queue (their waiting gauge) at saturation
MAX_NUM_SEQS = 32
#: KV pool per engine, in blocks of 16 tokens (32,768 tokens: about a dozen documents at once)
CACHE_BLOCKS = 2048
#: tokens a step computes (vLLM's default below 70 GiB of GPU memory); longer prefills are chunked
STEP_TOKENS = 2048


def sim_flags(fast: bool = False) -> list[str]:
    """A simulator of the fleet (`fast`: the zero-latency one of the added-latency probe)."""
    flags = [*demo_sim_flags("vllm"), "--request-log-size", "1"]
    if fast:
        return [*flags, "--fast", "--max-num-seqs", "100000"]
    c = StepCosts()
    return [
        *flags,
        "--max-num-seqs", str(MAX_NUM_SEQS),
        "--num-cache-blocks", str(CACHE_BLOCKS),
        "--max-num-batched-tokens", str(STEP_TOKENS),
        "--itl-ms", f"{c.fixed_s * 1e3 * SLOWDOWN:g}",
        "--prefill-us-per-token", f"{c.prefill_token_s * 1e6 * SLOWDOWN:g}",
        "--decode-us-per-seq", f"{c.decode_seq_s * 1e6 * SLOWDOWN:g}",
        "--context-ns-per-token", f"{c.context_token_s * 1e9 * SLOWDOWN:g}",
    ]  # fmt: skip


# -- the traffic -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tenant:
    """One tenant's traffic: `share` of the mix's requests, prompts of `words` words (about as many
    simulator tokens) after a system prompt of `system` words shared by its requests, and answers of
    exactly `output` tokens."""

    name: str
    tier: str
    klass: str
    share: float
    words: tuple[int, int]
    output: int
    system: int = 0


TENANTS = (
    Tenant("chat", "chat", "interactive", 0.7, (40, 200), 32, system=60),
    Tenant("docs-a", "batch", "batch", 0.1, (1500, 2500), 96),
    Tenant("docs-b", "batch", "batch", 0.2, (1500, 2500), 96),
)
#: the gateway's classes (`flow.classes`): the shipped interactive class; batch's deadline and depth
#: bounded so that a run's refusals come within its few seconds (the shipped 120 s would outlast it),
#: its KV headroom the shipped one
CLASSES: dict[str, dict[str, float | int]] = {
    "interactive": {"priority": 0, "max_queue_s": 5, "max_queued": 256, "ttft_target_s": 1.0},
    "standard": {"priority": 1, "max_queue_s": 20, "max_queued": 1024},
    "batch": {"priority": 2, "max_queue_s": 8, "max_queued": 32, "max_kv_use": 0.8},
}
#: `flow.tenant_weights`: equal shares within the batch class, whatever each tenant offers
TENANT_WEIGHTS = {"docs-a": 1.0, "docs-b": 1.0}
#: goodput's bound per class: the class's TTFT target, else its deadline (answered in time)
TTFT_TARGET_S = {k: float(c.get("ttft_target_s", c["max_queue_s"])) for k, c in CLASSES.items()}
#: a request with neither a first token nor a refusal this long after its deadline is lost
LOST_GRACE_S = 1.0

# -- the runs --------------------------------------------------------------------------------------
#: offered load, in multiples of the fleet's capacity
LOADS = (0.5, 1.5, 2.0)
SEEDS = (1, 2, 3)
#: seconds of arrivals per run: at capacity about 100 requests (70 interactive), so a load's three
#: seeds pool 100 to 450 interactive first tokens, and the 19 runs with their drains (a batch
#: request's deadline and grace, about 10 s a run above capacity) keep the suite near seven minutes
ARRIVAL_S = 10.0
#: the batch tenants' shares are measured from this fraction of the arrivals on (the queue has built
#: up: a couple of seconds above capacity) to their end (then the shorter backlog drains alone)
SHARE_FROM = 0.2


def share_window(seconds: float) -> tuple[float, float]:
    """The window of a run of `seconds` of arrivals in which shares are measured (`SHARE_FROM`)."""
    return (seconds * SHARE_FROM, seconds)


SHARE_WINDOW = share_window(ARRIVAL_S)
#: the runs of two gateway replicas sharing Redis: the highest load, on the first seed
REPLICA_LOADS = (2.0,)
#: the added-latency probe: seconds of wrk per gateway and round, rounds (the gateways alternate
#: within each; the machine's drift between rounds is larger than the 0.1 ms the probe measures)
PROBE_S = 3.0
PROBE_ROUNDS = 5
#: requests the capacity is calibrated on (the mix queued at once on the fleet's engines)
CALIBRATION_REQUESTS = 400


@dataclass(frozen=True)
class Job:
    """One request of a tenant: its chat body's messages, prompt tokens (the simulator's count) and
    the output it asks for."""

    messages: list[dict[str, str]]
    prompt_tokens: int
    output: int

    @property
    def cost(self) -> int:
        """Tokens the request is served (the flow queue's cost: prompt plus output asked)."""
        return self.prompt_tokens + self.output

    def body(self) -> dict[str, Any]:
        return {
            "model": PUBLIC, "messages": self.messages, "max_tokens": self.output, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip


def jobs(tenant: Tenant, seed: int, n: int) -> list[Job]:
    """The tenant's first `n` requests on `seed` (the same text whatever `n`: a prefix)."""
    rng = random.Random(f"{seed}:{tenant.name}:text")
    w = Words(rng)
    system = w.text(tenant.system) if tenant.system else None
    out = []
    for _ in range(n):
        msgs = [{"role": "system", "content": system}] if system else []
        msgs.append({"role": "user", "content": w.text(rng.randint(*tenant.words))})
        ids = tokenizer.encode(render_chat(msgs, None))
        out.append(Job(msgs, len(ids), tenant.output))
    return out


@dataclass(frozen=True)
class Arrival:
    t: float  # seconds from the run's start
    tenant: str
    index: int  # the tenant's index-th request


def schedule(
    seed: int, load: float, capacity: float, seconds: float = ARRIVAL_S, tenants: Sequence[Tenant] = TENANTS
) -> list[Arrival]:
    """Poisson arrivals of every tenant at `load` × `capacity` × its share, for `seconds`, in time
    order. One unit-rate process per (seed, tenant) scaled to the rate: the same seed gives every load
    the same requests in the same order, a higher load more of them sooner."""
    out: list[Arrival] = []
    for ten in tenants:
        rate = load * capacity * ten.share
        rng = random.Random(f"{seed}:{ten.name}:arrivals")
        u, k = rng.expovariate(1.0), 0
        while rate > 0 and u / rate < seconds:
            out.append(Arrival(u / rate, ten.name, k))
            u += rng.expovariate(1.0)
            k += 1
    return sorted(out, key=lambda a: (a.t, a.tenant))


# -- capacity --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Capacity:
    rps: float  # requests of the mix per second
    output_tps: float  # their output tokens per second
    requests: int


def mix(seed: int, n: int, tenants: Sequence[Tenant] = TENANTS) -> list[Job]:
    """`n` requests in the tenants' shares, in a seeded random order."""
    counts = {t.name: round(n * t.share) for t in tenants}
    pool = [(t.name, j) for t in tenants for j in jobs(t, seed, counts[t.name])]
    random.Random(f"{seed}:mix").shuffle(pool)
    return [j for _, j in pool]


def calibrate(
    sample: Sequence[Job], backends: int = BACKENDS, flags: Sequence[str] | None = None
) -> Capacity:
    """The fleet's throughput on `sample`, every engine saturated: the requests queued at once (round
    robin over `backends` engines, the simulators' step model in virtual time), completions between
    the 10th and 90th percentile over the time between them."""
    cfg = parse_config(["--engine", "vllm", *(sim_flags() if flags is None else flags)]).batch_config()
    ends: list[tuple[float, int]] = []
    for b in range(backends):
        engine = StepEngine(cfg)
        for i, job in enumerate(sample[b::backends]):
            engine.add(Seq(i, tokenizer.encode(render_chat(job.messages, None)), job.output))
        now = 0.0
        while (batch := engine.schedule()) is not None:
            now += batch.duration_s
            ends += [(now, s.out_len) for s in engine.complete(batch).finished]
    ends.sort()
    lo, hi = len(ends) // 10, len(ends) * 9 // 10
    span = ends[hi][0] - ends[lo][0]
    done = ends[lo + 1 : hi + 1]
    return Capacity(len(done) / span, sum(n for _, n in done) / span, len(sample))


# -- accounting ------------------------------------------------------------------------------------
def outcome(record: dict[str, Any]) -> str:
    """What became of one request (`OUTCOMES`), from its trace-runner record: served (a first token
    and a stream that ends with its usage chunk), refused with 429 or 503 and a `retry-after` (without
    one: `no retry-after`), lost (neither a first token nor a refusal by its deadline plus
    `LOST_GRACE_S`), or an error (any other answer, a stream cut short, a connection error)."""
    if record.get("gave_up"):
        return "lost"
    status = record.get("status")
    if status == 200 and "ttft" in record and "usage" in record:
        return "served"
    if status in (429, 503):
        return str(status) if record.get("retry_after") else "no retry-after"
    return "error"


def records(
    arrivals: Sequence[Arrival], results: Sequence[dict[str, Any]], work: dict[str, list[Job]]
) -> list[dict[str, Any]]:
    """One accounting record per request of a run, from its arrivals and the trace runner's results
    (in the same order): tenant, class, scheduled time, tokens (`cost`, `output`), outcome, TTFT and
    the times of its first token and its end (seconds from the run's start), the time it queued."""
    klass = {t.name: t.klass for t in TENANTS}
    out = []
    for a, res in zip(arrivals, results, strict=True):
        job = work[a.tenant][a.index]
        usage = res.get("usage")
        rec: dict[str, Any] = {
            "tenant": a.tenant, "klass": klass[a.tenant], "t": a.t, "cost": job.cost,
            "output": int(usage[1]) if usage else job.output, "outcome": outcome(res),
        }  # fmt: skip
        if rec["outcome"] == "served":
            rec.update(ttft=res["ttft"], first=res["sent"] + res["ttft"], end=res["sent"] + res["total"])
        if "queue_ms" in res:
            rec["queue_ms"] = float(res["queue_ms"])
        out.append(rec)
    return out


def fair_shares(total: float, demand: dict[str, float], weight: dict[str, float]) -> dict[str, float]:
    """`total` split max-min fairly by `weight` among tenants that want `demand`: a tenant that wants
    less than its weighted part gets what it wants, the rest share what is left by weight."""
    out: dict[str, float] = {}
    left, remaining = dict(demand), total
    while left:
        level = remaining / sum(weight.get(k, 1.0) for k in left)
        sated = {k: d for k, d in left.items() if d <= level * weight.get(k, 1.0)}
        if not sated:
            out.update({k: level * weight.get(k, 1.0) for k in left})
            break
        for k, d in sated.items():
            out[k] = d
            remaining -= d
            del left[k]
    return out


#: backlogged: the class offered at least this much more than it was served, and the tenant this much
#: more than its fair share (below that its queue empties now and then, and it is served what it
#: offers rather than its share; the margin also absorbs the requests still in flight at the window's end)
BACKLOG_MARGIN = 0.1


def shares(
    recs: Iterable[dict[str, Any]],
    klass: str = "batch",
    window: tuple[float, float] = SHARE_WINDOW,
    weights: dict[str, float] | None = None,
) -> dict[str, dict[str, float | bool]]:
    """Per tenant of `klass`: the tokens it offered (arrivals in `window`) and was served (requests
    whose first token came in `window`, prompt plus output), its fair share of what the class was
    served there (`fair_shares` by `weights`, default `TENANT_WEIGHTS`), served ÷ fair, and whether it
    was backlogged (`BACKLOG_MARGIN`)."""
    weights = TENANT_WEIGHTS if weights is None else weights
    offered: dict[str, float] = {}
    served: dict[str, float] = {}
    lo, hi = window
    for r in recs:
        if r["klass"] != klass:
            continue
        offered.setdefault(r["tenant"], 0.0)
        served.setdefault(r["tenant"], 0.0)
        if lo <= r["t"] < hi:
            offered[r["tenant"]] += r["cost"]
        if r["outcome"] == "served" and lo <= r["first"] < hi:
            served[r["tenant"]] += r["cost"]
    total = sum(served.values())
    fair = fair_shares(total, offered, weights)
    short = sum(offered.values()) >= total * (1 + BACKLOG_MARGIN)
    return {
        k: {
            "offered": offered[k],
            "served": served[k],
            "fair": fair[k],
            "ratio": served[k] / fair[k] if fair[k] else math.nan,
            "backlogged": short and fair[k] > 0 and offered[k] >= fair[k] * (1 + BACKLOG_MARGIN),
        }
        for k in sorted(offered)
    }


def _finite(x: float) -> float | None:
    """A percentile for JSON: None when it fell on a lost request (never answered)."""
    return None if math.isinf(x) else x


def summarise(
    runs: Sequence[Sequence[dict[str, Any]]], window: tuple[float, float] = SHARE_WINDOW
) -> dict[str, Any]:
    """The figures of one (load, flow, replicas) point over its runs (one per seed), pooled:
    interactive TTFT percentiles (a lost request counts as never answered, refused ones are left
    out and counted), outcomes by class, the batch tenants' shares, goodput (output tokens of
    requests within their class's `TTFT_TARGET_S`, over the runs' spans: from the start to the last
    byte served). Shares are measured in `window` (seconds from a run's start)."""
    recs = [r for run in runs for r in run]
    inter = [r for r in recs if r["klass"] == "interactive" and r["outcome"] in ("served", "lost")]
    ttft = [r["ttft"] if r["outcome"] == "served" else math.inf for r in inter]
    out: dict[str, Any] = {
        f"ttft_p{q}_ms": _finite(percentile(ttft, q) * 1000) if ttft else None for q in (50, 90, 99)
    }
    out["ttft_p99_ms_each"] = []
    for run in runs:
        each = [r["ttft"] if r["outcome"] == "served" else math.inf
                for r in run if r["klass"] == "interactive" and r["outcome"] in ("served", "lost")]  # fmt: skip
        out["ttft_p99_ms_each"].append(_finite(percentile(each, 99) * 1000) if each else None)
    outcomes: dict[str, dict[str, int]] = {}
    for r in recs:
        by = outcomes.setdefault(r["klass"], dict.fromkeys(OUTCOMES, 0))
        by[r["outcome"]] += 1
    out["outcomes"] = outcomes
    out["requests"] = len(recs)
    out["shares"] = shares(recs, window=window)
    good = [r for r in recs if r["outcome"] == "served" and r["ttft"] <= TTFT_TARGET_S[r["klass"]]]
    span = sum(max((r["end"] for r in run if r["outcome"] == "served"), default=0.0) for run in runs)
    out["goodput_tps"] = sum(r["output"] for r in good) / span if span else 0.0
    out["output_tps"] = sum(r["output"] for r in recs if r["outcome"] == "served") / span if span else 0.0
    queued = [r["queue_ms"] for r in recs if "queue_ms" in r]
    out["queued"] = len(queued)
    out["queue_p50_ms"] = percentile(queued, 50) if queued else None
    return out


# -- the runs --------------------------------------------------------------------------------------
def flow_available(source: GatewaySource) -> bool:
    """Whether that gateway has flow control (`flow` settings and a tier's `priority_class`)."""
    return source_has(
        source,
        "from gateway.settings import Settings; from gateway.admission.settings import LimitSet",
        "'flow' in Settings.model_fields and 'priority_class' in LimitSet.model_fields",
    )


def gateway_config(urls: Sequence[str], flow: bool | None, redis_url: str | None = None) -> dict[str, Any]:
    """The gateway in front of `urls`: JWT auth, a tier per tenant's class without limits, and
    `flow.enabled: flow` with the suite's classes (None: a gateway without flow control, whose
    tiers name no class). The shipped defaults otherwise (routing policy, scrape interval)."""
    tiers: dict[str, dict[str, Any]] = {"default": {}}
    for t in TENANTS:
        tiers[t.tier] = {"priority_class": t.klass} if flow is not None else {}
    cfg: dict[str, Any] = {
        "server": {"log_level": "warning", "graceful_shutdown_s": 1},
        "models": [{"name": PUBLIC, "context_length": 8192}],
        "pools": [{
            "name": "vllm", "dialect": "vllm", "models": {PUBLIC: SERVED["vllm"]},
            "backends": [{"name": f"vllm-{i}", "url": u} for i, u in enumerate(urls)],
        }],
        "upstream": {"health": {"interval_s": 2.0}},
        "access_log": {"enabled": False},
        "auth": {"jwt": {"secret": JWT_SECRET}},
        "limits": {"tiers": tiers},
    }  # fmt: skip
    if flow is not None:
        cfg["flow"] = {"enabled": flow, "classes": CLASSES, "tenant_weights": TENANT_WEIGHTS}
    if redis_url:
        cfg["redis"] = {"url": redis_url}
    return cfg


def tokens() -> dict[str, str]:
    """A bearer token per tenant: a user of its tier in its tenant."""
    return {
        t.name: mint_token(JWT_SECRET, f"{t.name}-user", tier=t.tier, tenant=t.name, ttl_s=24 * 3600)
        for t in TENANTS
    }


def trace_item(a: Arrival, job: Job, bearer: str) -> dict[str, Any]:
    """One line of the trace runner's trace: sent at `a.t` with the tenant's token, given up when it
    has neither a first token nor a refusal by its class's deadline plus `LOST_GRACE_S`."""
    klass = next(t.klass for t in TENANTS if t.name == a.tenant)
    return {
        "t": a.t,
        "session": None,
        "body": job.body(),
        "headers": {"authorization": f"Bearer {bearer}"},
        "give_up": float(CLASSES[klass]["max_queue_s"]) + LOST_GRACE_S,
    }


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _post(url: str) -> None:
    req = urllib.request.Request(url, data=b"{}", headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


#: seconds the fleet may take to finish what a run left running (aborted requests leave at once)
IDLE_TIMEOUT_S = 60.0
#: requests per tenant sent through a gateway before it is measured (connections, token cache)
WARMUP = 4


@dataclass
class Suite:
    """The fleet of a run of the suite, the gateways in front of it and the client, stopped with
    `stack`."""

    source: GatewaySource
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    sims: list[Service] = field(default_factory=list)
    bearer: dict[str, str] = field(default_factory=tokens)

    def start_fleet(self) -> None:
        for i in range(BACKENDS):
            port = free_port()
            argv = [sys.executable, "-m", "engines.sim", "--engine", "vllm", "--host", "127.0.0.1",
                    "--port", str(port), *sim_flags()]  # fmt: skip
            self.sims.append(self.stack.enter_context(Service(f"overload-sim-{i}", argv, port)))

    def gateways(
        self, name: str, flow: bool | None, replicas: int = 1, redis_url: str | None = None
    ) -> list[Service]:
        cfg = gateway_config([s.base_url for s in self.sims], flow, redis_url)
        return [
            self.stack.enter_context(gateway_service(f"overload-gw-{name}-{k}", cfg, self.source))
            for k in range(replicas)
        ]

    def idle(self) -> None:
        """Wait until no simulator runs or queues anything, then reset their caches and counters."""
        deadline = time.monotonic() + IDLE_TIMEOUT_S
        while time.monotonic() < deadline:
            stats = [_get(s.base_url + "/sim/stats") for s in self.sims]
            if all(not s["running"] and not s["waiting"] for s in stats):
                break
            time.sleep(0.2)
        for s in self.sims:
            _post(s.base_url + "/sim/reset")

    def replay(
        self, name: str, gws: Sequence[Service], arrivals: Sequence[Arrival], work: dict[str, list[Job]]
    ) -> list[dict[str, Any]]:
        """Send `arrivals` through `gws` (round robin) with the trace runner; the runs' records."""
        path = WORK / "traces" / f"overload-{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            for a in arrivals:
                f.write(orjson.dumps(trace_item(a, work[a.tenant][a.index], self.bearer[a.tenant])) + b"\n")
        urls = [a for g in gws for a in ("--url", g.base_url + "/v1/chat/completions")]
        result = path.with_suffix(".json")
        result.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "bench.tracerunner", *urls, "--trace", str(path), "--timeout", "120"]
        last = max((a.t for a in arrivals), default=0.0)
        limit = last + max(float(c["max_queue_s"]) for c in CLASSES.values()) + 180
        out = subprocess.run([*argv, "--out", str(result)], capture_output=True, cwd=str(ROOT), timeout=limit)
        try:
            return records(arrivals, orjson.loads(result.read_bytes())["results"], work)
        except (OSError, KeyError, ValueError) as e:  # no result, or not the expected one
            raise RuntimeError(
                f"trace client failed (exit {out.returncode}): {e}; {out.stderr[-500:].decode(errors='replace')}"
            ) from e

    def warm(self, name: str, gws: Sequence[Service], work: dict[str, list[Job]]) -> None:
        arrivals = [
            Arrival(0.1 * (k * len(TENANTS) + i), t.name, k)
            for k in range(WARMUP)
            for i, t in enumerate(TENANTS)
        ]
        self.replay(f"warm-{name}", gws, arrivals, work)
        self.idle()


def _line(s: dict[str, Any]) -> str:
    """A run's figures in one line of progress."""
    n = dict.fromkeys(OUTCOMES, 0)
    for by in s["outcomes"].values():
        for k, v in by.items():
            n[k] += v
    share = " ".join(f"{t} {x['ratio']:.2f}" for t, x in s["shares"].items())
    return (
        f"interactive TTFT p50 {fmt_ms(s['ttft_p50_ms'])} p99 {fmt_ms(s['ttft_p99_ms'])} ms; "
        + " ".join(f"{k} {v}" for k, v in n.items() if v)
        + f"; batch ÷ fair {share}; goodput {s['goodput_tps']:,.0f} tok/s"
    )


def probe(log: Log, source: GatewaySource) -> dict[str, Any]:
    """The gateway's added latency below saturation: non-streaming requests of the interactive tenant
    through a gateway with flow off and one with flow on, in front of one zero-latency simulator,
    wrk at one connection for `PROBE_S` seconds, `PROBE_ROUNDS` rounds, the gateways alternated
    (`added_latency`)."""
    from bench.load import run_wrk, write_wrk_script

    body = orjson.dumps({"model": PUBLIC, "max_tokens": 16,
                         "messages": [{"role": "user", "content": "Say something short."}]})  # fmt: skip
    chat = next(t for t in TENANTS if t.klass == "interactive")
    headers = {"Authorization": f"Bearer {tokens()[chat.name]}"}
    script = write_wrk_script("overload-probe", body, headers)
    p50: dict[str, list[float]] = {"off": [], "on": []}
    with contextlib.ExitStack() as stack:
        port = free_port()
        argv = [sys.executable, "-m", "engines.sim", "--engine", "vllm", "--host", "127.0.0.1",
                "--port", str(port), *sim_flags(fast=True)]  # fmt: skip
        sim = stack.enter_context(Service("overload-probe-sim", argv, port))
        gws = {
            mode: stack.enter_context(
                gateway_service(
                    f"overload-probe-{mode}", gateway_config([sim.base_url], mode == "on"), source
                )
            )
            for mode in ("off", "on")
        }
        for g in gws.values():  # warm
            run_wrk(g.base_url + "/v1/chat/completions", script, 1, 2)
        for k in range(PROBE_ROUNDS):
            for mode in ("off", "on") if k % 2 == 0 else ("on", "off"):
                r = run_wrk(gws[mode].base_url + "/v1/chat/completions", script, 1, PROBE_S)
                p50[mode].append(r.p50_us)
                log(
                    f"  probe round {k}: flow {mode} p50 {r.p50_us / 1000:.3f} ms ({r.requests} requests, {r.errors} errors)"
                )
    return added_latency(p50["on"], p50["off"])


def added_latency(on_us: Sequence[float], off_us: Sequence[float]) -> dict[str, Any]:
    """The probe's figures from each round's p50 with flow on and off (µs): their medians and the
    added latency, the median of the rounds' differences (each round's pair ran back to back)."""
    added = statistics.median(a - b for a, b in zip(on_us, off_us, strict=True))
    return {"on_p50_us": list(on_us), "off_p50_us": list(off_us), "on_p50_ms": statistics.median(on_us) / 1000,
            "off_p50_ms": statistics.median(off_us) / 1000, "added_ms": added / 1000}  # fmt: skip


def run(
    log: Log,
    gateway_ref: str | None = None,
    *,
    seconds: float = ARRIVAL_S,
    seeds: Sequence[int] = SEEDS,
    flow_on: bool = True,
) -> dict[str, Any]:
    """The whole suite (module docstring); its results for bench/results/overload.json. `seconds` of
    arrivals per run and `seeds` shorten it; `flow_on=False` runs flow off alone (and neither the
    replicas nor the probe), as on a gateway without flow control."""
    t0 = time.monotonic()
    source = gateway_source(gateway_ref)
    flow = flow_available(source)
    unavailable: dict[str, str] = {}
    if not flow:
        unavailable["flow on"] = "the gateway under test has no `flow` settings"
    elif not flow_on:
        unavailable["flow on"] = "left out of this run"
    cap = calibrate(mix(0, CALIBRATION_REQUESTS))
    log(f"overload: capacity {cap.rps:.1f} req/s of the mix ({cap.output_tps:,.0f} output tok/s, step model)")
    window = share_window(seconds)
    work = {}
    for seed in seeds:
        # the highest load's requests (every lower load sends a prefix of them) and the warm-up's
        wanted = dict.fromkeys((t.name for t in TENANTS), WARMUP)
        for a in schedule(seed, max(LOADS), cap.rps, seconds):
            wanted[a.tenant] = max(wanted[a.tenant], a.index + 1)
        work[seed] = {t.name: jobs(t, seed, wanted[t.name]) for t in TENANTS}
    runs: dict[tuple[float, str, int], list[list[dict[str, Any]]]] = {}
    per_run: list[dict[str, Any]] = []
    suite = Suite(source)
    modes = ("off", "on") if flow and flow_on else ("off",)

    def one(name: str, gws: Sequence[Service], seed: int, load: float, mode: str, replicas: int) -> None:
        suite.idle()
        arrivals = schedule(seed, load, cap.rps, seconds)
        recs = suite.replay(name, gws, arrivals, work[seed])
        runs.setdefault((load, mode, replicas), []).append(recs)
        s = summarise([recs], window)
        per_run.append({"seed": seed, "load": load, "flow": mode, "replicas": replicas, **s})
        log(f"  seed {seed} {fmt_load(load):>4} flow {mode}{f' x{replicas}' if replicas > 1 else ''}: "
            f"{len(arrivals)} requests; {_line(s)}")  # fmt: skip

    try:
        suite.start_fleet()
        # without flow control in the gateway, "off" is a gateway whose config has no `flow` section
        gws = {mode: suite.gateways(mode, mode == "on" if flow else None) for mode in modes}
        for mode, g in gws.items():
            suite.warm(mode, g, work[seeds[0]])
        log(f"overload: {BACKENDS} simulators and {len(gws)} gateway(s) up")
        for k, seed in enumerate(seeds):
            for load in LOADS:
                for mode in modes if k % 2 == 0 else modes[::-1]:
                    one(f"{seed}-{load:g}-{mode}", gws[mode], seed, load, mode, 1)
        if "on" in modes:
            from tests.support import RedisServer

            redis = suite.stack.enter_context(RedisServer())
            pair = suite.gateways("on-x2", True, replicas=2, redis_url=redis.url)
            suite.warm("on-x2", pair, work[seeds[0]])
            for load in REPLICA_LOADS:
                one(f"{seeds[0]}-{load:g}-on-x2", pair, seeds[0], load, "on", 2)
    finally:
        suite.stack.close()
    probed = None
    if "on" in modes:
        log("overload: added latency below saturation (zero-latency simulator, wrk at one connection)")
        probed = probe(log, source)
    points = [
        {"load": load, "flow": mode, "replicas": replicas, "runs": len(rs), **summarise(rs, window)}
        for (load, mode, replicas), rs in sorted(runs.items())
    ]
    return {
        "points": points, "runs": per_run, "probe": probed, "flow_available": flow,
        "unavailable": unavailable, "capacity": asdict(cap), "gateway_source": source.describe,
        "backends": BACKENDS, "max_num_seqs": MAX_NUM_SEQS, "cache_blocks": CACHE_BLOCKS, "slowdown": SLOWDOWN,
        "sim_argv": ["python -m engines.sim --engine vllm", *sim_flags()],
        "tenants": [asdict(t) for t in TENANTS], "classes": CLASSES, "tenant_weights": TENANT_WEIGHTS,
        "loads": list(LOADS), "seeds": list(seeds), "arrival_s": seconds, "lost_grace_s": LOST_GRACE_S,
        "share_window": list(window), "elapsed_s": time.monotonic() - t0,
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench.overload`: the suite alone, shortened at will; prints each run and the verdicts,
    writes the results to `--out` (bench/BENCHMARKS.md is `python -m bench --suite overload`'s)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.overload", description=main.__doc__)
    ap.add_argument("--seconds", type=float, default=ARRIVAL_S, help="seconds of arrivals per run")
    ap.add_argument("--seed", type=int, action="append", help=f"repeatable (default: {SEEDS})")
    ap.add_argument("--off-only", action="store_true", help="flow off alone: no flow-on runs, no probe")
    ap.add_argument("--gateway-ref", default=None, help="benchmark a git ref instead of the working tree")
    ap.add_argument("--out", default=None, help="write the results (JSON) here")
    a = ap.parse_args(argv)
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}] {msg}", flush=True)

    res = run(log, a.gateway_ref, seconds=a.seconds, seeds=a.seed or SEEDS, flow_on=not a.off_only)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    for v in overload_verdicts(res):
        print(f"- {v.word}: {v.target} — {v.measured}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
