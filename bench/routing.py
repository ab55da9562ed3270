"""Routing-quality suite: prefix-cache hit rate against the oracle, TTFT and throughput, per router.

The fleet: 4 vLLM-dialect + 4 SGLang-dialect simulators with bounded prefix caches and a cost model
whose latencies are tens to hundreds of milliseconds (so a shared 2-core machine's noise is small
against them). Routers, each started fresh for every run in front of the same fleet (whose caches and
counters are reset by `POST /sim/reset` first): our gateway with `prefix_affinity`, `least_load` and
`round_robin` (two pools of four, sticky pool choice), `sglang-router` and `vllm-router` with
`cache_aware` (and, in full mode, `round_robin`).

For each seeded workload (bench/workloads.py) and load level:
- **oracle**: one pooled LRU prefix cache with the fleet's total capacity replays the trace, using the
  simulator's own template, tokenizer and block hashing (`engines/sim/prompt.py`, `tokenizer.py`,
  `prefix_cache.py`) and its rule that the last prompt token is always computed;
- **capacity** from the cost model: a request's service time is `ttft + prefill × uncached tokens +
  (output − 1) × itl` with the oracle's hits, and the fleet serves `sims × max_num_seqs` at once, so
  capacity = that ÷ the mean service time; offered load is a Poisson process at 50 % / 80 % of it;
- **measured**: hit rate from the simulators' own counters (`/sim/stats`: cached ÷ prompt tokens),
  TTFT p50/p99 and throughput from the trace client (bench/tracerunner.py, its own process);
- **rounds** (full mode): the two routers an issue #5 verdict compares (ours and round robin; ours and
  least load on uniform traffic) run the point again on other Poisson schedules of the same requests,
  and the verdicts take the p99 of all their rounds' first tokens (`pool_rounds`): one 20 s run's p99
  is its few slowest requests, and which requests collide depends on the schedule.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import orjson

from bench import peers
from bench.procs import ROOT, WORK, Service, ServiceError, free_port
from bench.targets import gateway_service, gateway_source
from bench.verdicts import compared
from bench.workloads import WORKLOADS, Request, schedule
from engines.sim import tokenizer
from engines.sim.config import parse_config
from engines.sim.prefix_cache import PrefixCache, usable_hit
from engines.sim.prompt import render_chat
from engines.sim.step_model import BatchConfig
from gateway.demo import SERVED
from gateway.demo import sim_flags as demo_sim_flags

Log = Callable[[str], None]
PUBLIC = "bench-model"
SERVED_NAME = SERVED["vllm"]


@dataclass(frozen=True)
class FleetSpec:
    """The bench fleet: `per_engine` vLLM-dialect and as many SGLang-dialect simulators.

    `scheduler="batching"` (the default): the simulators' batching engine (`engines/sim/step_model.py`,
    each its dialect's scheduler), a step costing `itl_ms` + `prefill_us_per_token` × prefill tokens +
    `decode_us_per_seq` × decoding sequences + `context_ns_per_token` × context tokens, a budget of
    `max_num_batched_tokens` tokens a step (vLLM 0.32's default below 70 GiB of GPU memory; SGLang's
    `--chunked-prefill-size` the same), and a KV pool of `cache_blocks` blocks that holds the running
    requests' KV and the prefix cache (1,024 blocks: room for a batch next to what the serial fleet's
    512-block cache held). A small, slow GPU on purpose: prefill is 2 % of a step per token (an H100
    running Llama-3.1-8B: 0.35 %), so a cache miss costs what it cost the serial fleet relative to a
    token, and the whole fleet runs ~4x slower than it would at the serial fleet's 10 ms a step, which
    keeps the offered request rates (tens per second) within what a shared 2-core machine drives in
    the wall-clock suite. `scheduler="serial"` (`SERIAL`): one request at a time per simulator, the
    fleet of before 2026-12.
    """

    per_engine: int = 4
    block_size: int = 16
    cache_blocks: int = 1024  # per simulator: 16,384 tokens of KV (serial: 512, the prefix cache only)
    ttft_ms: float = (
        20.0  # batching: the front end's fixed latency before the scheduler; serial: the fixed TTFT
    )
    prefill_us_per_token: float = 800.0
    itl_ms: float = 40.0  # batching: a step's fixed time; serial: the ITL
    output_tokens: int = 16
    max_num_seqs: int = 256
    scheduler: Literal["batching", "serial"] = "batching"
    decode_us_per_seq: float = 800.0
    context_ns_per_token: float = 1560.0
    max_num_batched_tokens: int = 2048

    @property
    def sims(self) -> int:
        return 2 * self.per_engine

    @property
    def batching(self) -> bool:
        return self.scheduler == "batching"

    def flags(self, engine: str) -> list[str]:
        common = [
            *demo_sim_flags(engine),
            "--max-model-len", "32768",
            "--block-size", str(self.block_size),
            "--num-cache-blocks", str(self.cache_blocks),
            "--ttft-ms", str(self.ttft_ms),
            "--prefill-us-per-token", str(self.prefill_us_per_token),
            "--itl-ms", str(self.itl_ms),
            "--min-output-tokens", str(self.output_tokens),
            "--max-output-tokens", str(self.output_tokens),
            "--max-num-seqs", str(self.max_num_seqs),
            "--request-log-size", "1",
        ]  # fmt: skip
        if not self.batching:
            return [*common, "--scheduler", "serial", "--load-slowdown", "0"]
        return [
            *common,
            "--decode-us-per-seq", str(self.decode_us_per_seq),
            "--context-ns-per-token", str(self.context_ns_per_token),
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
            "--chunked-prefill-size", str(self.max_num_batched_tokens),
        ]  # fmt: skip

    def batch_config(self, engine: str) -> BatchConfig:
        """The step model a simulator of this fleet runs, from its own flags (the replay uses it)."""
        return parse_config(["--engine", engine, *self.flags(engine)]).batch_config()

    def first_token_s(self, prompt: int, cached: int) -> float:
        """Serial: the simulator's time to first token once a request runs (fixed + uncached prefill)."""
        return self.ttft_ms / 1e3 + (prompt - cached) * self.prefill_us_per_token / 1e6

    def service_s(self, prompt: int, cached: int) -> float:
        """Serial: a request's whole time on its simulator."""
        return self.first_token_s(prompt, cached) + (self.output_tokens - 1) * self.itl_ms / 1e3

    def work_s(self, prompt: int, cached: int, batch: float) -> float:
        """Batching: the engine time a request costs when the engine runs `batch` sequences at once:
        its uncached prefill (its steps' fixed time wholly its own), its decode steps' per-sequence
        and context costs, and a `1 / batch` share of their fixed time."""
        a, b = self.itl_ms / 1e3, self.prefill_us_per_token / 1e6
        c, d = self.decode_us_per_seq / 1e6, self.context_ns_per_token / 1e9
        out = self.output_tokens
        uncached = prompt - cached
        prefill_steps = max(1, -(-uncached // self.max_num_batched_tokens))
        return b * uncached + a * prefill_steps + (out - 1) * (c + a / batch) + d * out * (prompt + out / 2)


SERIAL = FleetSpec(
    cache_blocks=512,
    ttft_ms=20.0,
    prefill_us_per_token=200.0,
    itl_ms=10.0,
    max_num_seqs=1,
    scheduler="serial",
)


@dataclass(frozen=True)
class Matrix:
    workloads: tuple[str, ...]
    loads: tuple[float, ...]
    routers: tuple[str, ...]
    seconds: float
    uniform_routers: tuple[str, ...]  # on uniform traffic only balance matters
    # Arrival schedules per point for the two routers an issue #5 verdict compares (`compared`): a
    # TTFT p99 over one 20 s run is its few slowest requests, and round robin's moved by 1.3-2.1 s
    # between runs of one point; the verdicts pool every round's first tokens.
    rounds: int = 1


OURS = ("ours (prefix_affinity)", "ours (least_load)", "ours (round_robin)")
QUICK = Matrix(
    workloads=("shared_prefix", "multi_turn_chat", "uniform"),
    loads=(0.8,),
    routers=("ours (prefix_affinity)", "ours (round_robin)", "sglang-router cache_aware"),
    seconds=6.0,
    uniform_routers=("ours (prefix_affinity)", "ours (least_load)"),
)
FULL = Matrix(
    workloads=tuple(WORKLOADS),
    loads=(0.5, 0.8),
    routers=(
        *OURS,
        "sglang-router cache_aware",
        "sglang-router round_robin",
        "vllm-router cache_aware",
        "vllm-router round_robin",
    ),
    seconds=20.0,
    uniform_routers=(*OURS, "sglang-router cache_aware", "vllm-router cache_aware"),
    rounds=3,
)


def prompt_ids(req: Request) -> list[int]:
    return tokenizer.encode(render_chat(req.messages, req.tools))


def oracle(trace: list[Request], spec: FleetSpec) -> tuple[float, list[tuple[int, int]]]:
    """Token-weighted hit rate of one pooled LRU cache of the fleet's capacity; (prompt, cached) per request."""
    cache = PrefixCache(spec.block_size, spec.cache_blocks * spec.sims)
    per: list[tuple[int, int]] = []
    for req in trace:
        ids = prompt_ids(req)
        lease = cache.acquire(ids)
        cache.release(lease)
        per.append((len(ids), usable_hit(lease.cached_tokens, len(ids), spec.block_size)))
    total = sum(n for n, _ in per)
    return (sum(c for _, c in per) / total if total else 0.0), per


def capacity(per: list[tuple[int, int]], spec: FleetSpec) -> float:
    """Requests/s the fleet sustains with the oracle's hits (cost model, every engine busy).

    Serial: `sims × max_num_seqs` slots over the mean service time. Batching: `sims` engines over the
    mean `work_s`, the engines running as many sequences at once as their KV pool holds on average
    (each request's uncached prompt and output; the cached prefix is shared), at most `max_num_seqs`."""
    if not spec.batching:
        mean = statistics.fmean(spec.service_s(n, c) for n, c in per)
        return spec.sims * spec.max_num_seqs / mean
    own_kv = statistics.fmean(n - c + spec.output_tokens for n, c in per)
    batch = min(float(spec.max_num_seqs), max(1.0, spec.cache_blocks * spec.block_size / own_kv))
    return spec.sims / statistics.fmean(spec.work_s(n, c, batch) for n, c in per)


@dataclass(frozen=True)
class Point:
    """One (workload, load) point of the suite: its trace, Poisson send times and oracle."""

    trace: list[Request]
    times: list[float]
    oracle_rate: float
    per: list[tuple[int, int]]  # (prompt, cached) per request under the oracle
    capacity: float  # req/s, from the cost model with the oracle's hits


def make_point(workload: str, load: float, seconds: float, spec: FleetSpec, seed: int = 0) -> Point:
    """`seconds` of arrivals at `load` × the fleet's capacity (sized on a 400-request sample, then on
    the trace itself). `seed` 0 is the suite's own schedule (bench.replay varies it)."""
    make = WORKLOADS[workload]
    _, per0 = oracle(make(400), spec)
    n = max(50, round(capacity(per0, spec) * load * seconds))
    trace = make(n)
    rate, per = oracle(trace, spec)
    cap = capacity(per, spec)
    times = schedule(n, cap * load, seed=zlib.crc32(f"{workload}-{load}".encode()) + seed)
    return Point(trace, times, rate, per, cap)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


Samples = dict[tuple[str, float, str], list[tuple[list[float], float]]]


def pool_rounds(samples: Samples) -> list[dict[str, Any]]:
    """The rounds of the routers a verdict compares, pooled: the TTFT p50 and p99 of all their first
    tokens, and each round's p99 and hit rate ÷ oracle. `samples`: (workload, load, router) -> (first
    tokens in ms, hit rate ÷ oracle) per round."""
    out = []
    for (w, load, router), runs in samples.items():
        if router not in compared(w):
            continue
        pooled = [t for ttft, _ in runs for t in ttft]
        out.append(
            {
                "workload": w, "load": load, "router": router, "rounds": len(runs),
                "ttft_p50_ms": _pct(pooled, 50), "ttft_p99_ms": _pct(pooled, 99),
                "ttft_p99_ms_each": [_pct(ttft, 99) for ttft, _ in runs],
                "hit_vs_oracle_each": [hit for _, hit in runs],
            }
        )  # fmt: skip
    return out


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _post(url: str) -> None:
    req = urllib.request.Request(url, data=b"{}", headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


class Suite:
    def __init__(
        self, matrix: Matrix, spec: FleetSpec, log: Log, with_peers: bool, gateway_ref: str | None
    ) -> None:
        self.m = matrix
        self.spec = spec
        self.log = log
        self.with_peers = with_peers
        self.source = gateway_source(gateway_ref)
        self.stack = contextlib.ExitStack()
        self.sims: list[Service] = []
        self.urls: dict[str, list[str]] = {"vllm": [], "sglang": []}
        self.rows: list[dict[str, Any]] = []
        self.unavailable: dict[str, str] = {}
        self.samples: Samples = {}  # see `pool_rounds`
        self.versions: dict[str, str | None] = {}

    def start_fleet(self) -> None:
        for engine in ("vllm", "sglang"):
            for i in range(self.spec.per_engine):
                port = free_port()
                argv = [sys.executable, "-m", "engines.sim", "--engine", engine, "--host", "127.0.0.1",
                        "--port", str(port), *self.spec.flags(engine)]  # fmt: skip
                svc = self.stack.enter_context(Service(f"fleet-{engine}-{i}", argv, port, probe="/health"))
                self.sims.append(svc)
                self.urls[engine].append(svc.base_url)
        self.log(
            f"fleet up: {len(self.sims)} simulators ({self.spec.per_engine} vLLM + {self.spec.per_engine} SGLang dialect)"
        )

    def gateway_config(self, policy: str) -> dict[str, Any]:
        return {
            "server": {"log_level": "warning", "graceful_shutdown_s": 1},
            "models": [{"name": PUBLIC, "context_length": 32768}],
            "pools": [
                {
                    "name": e,
                    "dialect": e,
                    "weight": 0.5,
                    "models": {PUBLIC: SERVED[e]},
                    "backends": [{"name": f"{e}-{i}", "url": u} for i, u in enumerate(self.urls[e])],
                }
                for e in ("vllm", "sglang")
            ],
            "routing": {"policy": policy, "scrape_interval_s": 0.5},
            "upstream": {"health": {"interval_s": 2.0}},
            "access_log": {"enabled": False},
        }

    def router(self, name: str) -> tuple[Service, str]:
        """Start router `name`; its service and the model name to send."""
        all_urls = self.urls["vllm"] + self.urls["sglang"]
        if name.startswith("ours"):
            policy = name[name.index("(") + 1 : -1]
            return gateway_service(f"routing-gw-{policy}", self.gateway_config(policy), self.source), PUBLIC
        peer = peers.SGLANG_ROUTER if name.startswith("sglang") else peers.VLLM_ROUTER
        policy = name.split()[-1]
        return peers.rust_router(peer, all_urls, policy, f"routing-{peer.key}-{policy}"), SERVED_NAME

    def available(self, name: str) -> bool:
        if name.startswith("ours"):
            return True
        if not self.with_peers:
            self.unavailable[name] = "peers skipped (--no-peers)"
            return False
        peer = peers.SGLANG_ROUTER if name.startswith("sglang") else peers.VLLM_ROUTER
        if peer.label not in self.versions:
            self.versions[peer.label] = peers.ensure(peer, self.log)
        if not self.versions[peer.label]:
            self.unavailable[name] = "could not be installed"
            return False
        return True

    def one(
        self,
        workload: str,
        load: float,
        router: str,
        trace: list[Request],
        times: list[float],
        oracle_rate: float,
        cap: float,
        round_: int = 0,
    ) -> None:
        """Run `router` on one point: round 0 is the table's row, and every round's first tokens go
        into `samples` (`pool_rounds`)."""
        for s in self.sims:
            _post(s.base_url + "/sim/reset")
        try:
            svc, model = self.router(router)
            svc.start()
        except ServiceError as e:
            self.unavailable[router] = str(e).splitlines()[0][:200]
            self.log(f"  {router}: did not start")
            return
        try:
            path = WORK / "traces" / f"{workload}-{load:.2f}-{round_}-{router.replace(' ', '_')}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                for t, req in zip(times, trace, strict=True):
                    f.write(orjson.dumps({"t": t, "session": req.session, "body": req.body(model)}) + b"\n")
            argv = [sys.executable, "-m", "bench.tracerunner", "--url", svc.base_url + "/v1/chat/completions",
                    "--trace", str(path), "--timeout", "120"]  # fmt: skip
            out = subprocess.run(
                argv, capture_output=True, text=True, cwd=str(ROOT), timeout=self.m.seconds * 6 + 200
            )
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            if not lines:
                raise RuntimeError(f"trace client failed: {out.stderr[-500:]}")
            res = json.loads(lines[-1])
        finally:
            svc.stop()
        stats = [_get(s.base_url + "/sim/stats") for s in self.sims]
        prompt = sum(s["prompt_tokens_total"] for s in stats)
        cached = sum(s["cached_tokens_total"] for s in stats)
        per_sim = [s["requests_total"] for s in stats]
        ok = [r for r in res["results"] if "ttft" in r]
        ttft = [r["ttft"] * 1000 for r in ok]
        ends = [r["sent"] + r["total"] for r in ok]
        span = (max(ends) - min(r["sent"] for r in ok)) if ok else 0.0
        hit = cached / prompt if prompt else 0.0
        share = hit / oracle_rate if oracle_rate else 0.0
        self.samples.setdefault((workload, load, router), []).append((ttft, share))
        row = {
            "workload": workload, "load": load, "router": router, "round": round_, "requests": len(trace),
            "completed": len(ok), "errors": len(trace) - len(ok),
            "offered_rps": len(trace) / times[-1] if times else 0.0, "capacity_rps": cap,
            "rps": len(ok) / span if span else 0.0,
            "ttft_p50_ms": _pct(ttft, 50), "ttft_p90_ms": _pct(ttft, 90), "ttft_p99_ms": _pct(ttft, 99),
            "hit_rate": hit, "oracle_hit_rate": oracle_rate, "hit_vs_oracle": share,
            "per_sim_requests": per_sim, "client_cpu_s": res["client_cpu_s"],
        }  # fmt: skip
        if round_ == 0:
            self.rows.append(row)
        self.log(
            f"  {workload:<17} {load:4.0%} {router:<27} {f'#{round_}' if round_ else '':>3} TTFT p50 {row['ttft_p50_ms']:7.0f} ms  p99 {row['ttft_p99_ms']:7.0f} ms"
            f"  hit {hit:5.1%} ({row['hit_vs_oracle']:4.0%} of oracle)  {row['rps']:5.1f} req/s  errors {row['errors']}"
        )

    def run(self) -> None:
        self.start_fleet()
        for w in self.m.workloads:
            for load in self.m.loads:
                pt = make_point(w, load, self.m.seconds, self.spec)
                trace, times, orate, cap = pt.trace, pt.times, pt.oracle_rate, pt.capacity
                self.log(
                    f"{w} @ {load:.0%}: {len(trace)} requests at {cap * load:.1f} req/s (capacity {cap:.1f} req/s from the "
                    f"cost model), mean prompt {statistics.fmean(p for p, _ in pt.per):.0f} tokens, oracle hit rate {orate:.1%}"
                )
                routers = self.m.uniform_routers if w == "uniform" else self.m.routers
                for r in routers:
                    if self.available(r):
                        self.one(w, load, r, trace, times, orate, cap)
                pair = compared(w)
                for k in range(1, self.m.rounds):
                    # the same requests on another Poisson schedule; the pair alternates its order
                    times = make_point(w, load, self.m.seconds, self.spec, seed=k).times
                    for r in pair if k % 2 == 0 else pair[::-1]:
                        self.one(w, load, r, trace, times, orate, cap, round_=k)

    def stop(self) -> None:
        self.stack.close()


def run(quick: bool, log: Log, *, with_peers: bool = True, gateway_ref: str | None = None) -> dict[str, Any]:
    matrix = QUICK if quick else FULL
    spec = FleetSpec()
    suite = Suite(matrix, spec, log, with_peers, gateway_ref)
    try:
        suite.run()
    finally:
        suite.stop()
    workloads = [w for w in matrix.workloads if any(r["workload"] == w for r in suite.rows)]
    return {
        "rows": suite.rows,
        "repeats": pool_rounds(suite.samples),
        "workloads": workloads,
        "unavailable": suite.unavailable,
        "spec": asdict(spec),
        "matrix": asdict(matrix),
        "gateway_source": suite.source.describe,
        "preamble": preamble(spec, matrix, suite.source.describe),
    }


def preamble(spec: FleetSpec, m: Matrix, source: str) -> list[str]:
    if spec.batching:
        fleet = (
            f"Fleet: {spec.per_engine} vLLM-dialect + {spec.per_engine} SGLang-dialect simulators running the batching "
            f"engine (engines/sim/step_model.py, each its dialect's scheduler), each with a KV cache of {spec.cache_blocks} "
            f"blocks × {spec.block_size} tokens that also holds its prefix cache, a step costing {spec.itl_ms:.0f} ms + "
            f"{spec.prefill_us_per_token:.0f} µs per prefill token + {spec.decode_us_per_seq:.0f} µs per decoding sequence + "
            f"{spec.context_ns_per_token:.0f} ns per context token, {spec.max_num_batched_tokens} tokens a step, "
            f"{spec.ttft_ms:.0f} ms before a request reaches the scheduler, {spec.output_tokens} output tokens. Capacity "
            "is derived from this cost model with the oracle's cache hits (bench/routing.py `capacity`); "
            "offered load is Poisson at the given share of it, so a router whose hit rate falls short of the oracle's "
            "runs the fleet above 100 % and its queues (TTFT p99) grow."
        )
    else:
        fleet = (
            f"Fleet: {spec.per_engine} vLLM-dialect + {spec.per_engine} SGLang-dialect simulators, each with a prefix cache of "
            f"{spec.cache_blocks} blocks × {spec.block_size} tokens, TTFT {spec.ttft_ms:.0f} ms + {spec.prefill_us_per_token:.0f} µs "
            f"per uncached prompt token, {spec.output_tokens} output tokens at {spec.itl_ms:.0f} ms each, {spec.max_num_seqs} running "
            "requests per simulator (then a FIFO queue). Capacity is derived from this cost model with the oracle's cache hits; "
            "offered load is Poisson at the given share of it, so a router whose hit rate falls short of the oracle's runs the "
            "fleet above 100 % and its queues (TTFT p99) grow."
        )
    return [
        fleet,
        "",
        f"Each run: {m.seconds:.0f} s of arrivals, caches and counters reset, router started fresh"
        + (
            f"; ours and its baseline run {m.rounds} schedules per point (below the table)"
            if m.rounds > 1
            else ""
        )
        + f". Our gateway: {source}, "
        "two pools (vLLM, SGLang) of four, weights 0.5/0.5, sticky pool choice, `routing.policy` as named. Hit rate = "
        "cached ÷ prompt tokens summed over the simulators' own `/sim/stats` counters; oracle = one pooled LRU cache of the "
        "fleet's total capacity replaying the same trace offline with the simulator's tokenizer and block hashing.",
        "",
        "Workloads (bench/workloads.py, seeded): " + ", ".join(f"`{w}`" for w in m.workloads) + ".",
    ]
