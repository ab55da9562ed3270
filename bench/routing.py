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
  TTFT p50/p99 and throughput from the trace client (bench/tracerunner.py, its own process), and the
  serving figures the engines' benchmark tools report (bench/serving.py: TTFT, TPOT, ITL and E2E at
  p50/p90/p99, output tokens/s, goodput under `SLA`, cost per million tokens at `PRICE`);
- **rounds** (full mode): the two routers a routing verdict compares (ours and round robin; ours and
  least load on uniform traffic) run the point again on other Poisson schedules of the same requests,
  and the verdicts take the p99 of all their rounds' first tokens (`pool_rounds`): one 20 s run's p99
  is its few slowest requests, and which requests collide depends on the schedule.

**Several routing processes** (`python -m bench.routing`, or `python -m bench --suite routing
--processes`; `PROCESSES`, `Setup`): the same fleet with its KV-cache events on (each simulator's
`--kv-events-config`, a ZMQ PUB socket on its own loopback port) and a real redis-server; our gateway
runs as 1 process, or as 4 (2 gateway replicas × `workers: 2`, the trace client spreading requests
over the replicas round robin), subscribed to every simulator's events (`kv_events` per backend,
`tokenizer: sim`) and sharing in-flight counts and group placements through Redis
(`routing.shared`); the fallback (4 processes, neither events nor Redis) beside it; round robin and
least load (one process; on uniform traffic also as x4 with shared in-flight counts, the x4 rows'
baseline there: four gateway processes share the two cores with the fleet, whatever they route by);
and the SGLang and vLLM routers' `cache_aware` (single-process routers: one process each). Redis is flushed before every run. Results go to
`bench/results/routing_processes.json`, their section of bench/BENCHMARKS.md is `processes_md`.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
import urllib.request
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from bench import machine, peers
from bench.procs import BENCH, ROOT, WORK, Service, ServiceError, free_port
from bench.serving import Sla, figures, percentile
from bench.targets import gateway_service, gateway_source
from bench.verdicts import by_point, compared
from bench.workloads import WORKLOADS, Request, schedule
from engines.sim import tokenizer
from engines.sim.config import parse_config
from engines.sim.prefix_cache import PrefixCache, usable_hit
from engines.sim.prompt import render_chat
from engines.sim.step_model import BatchConfig
from gateway.core.settings import PriceSettings
from gateway.demo import SERVED
from gateway.demo import sim_flags as demo_sim_flags

Log = Callable[[str], None]
PUBLIC = "bench-model"
SERVED_NAME = SERVED["vllm"]
#: goodput's bound: an interactive target on a GPU (TTFT ≤ 500 ms, TPOT ≤ 50 ms) scaled by this
#: fleet's ~4x slower steps (`FleetSpec`: 40 ms a step where the serial fleet took 10)
SLA = Sla(ttft_ms=2000, tpot_ms=200)
#: the benchmark model's `price` in the gateway config (USD per million tokens), which the cost per
#: million tokens is figured at: a small hosted model's list prices, cached prompt tokens at half
PRICE = {"prompt": 0.15, "cached_prompt": 0.075, "completion": 0.6}


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
    the wall-clock suite. `scheduler="serial"` (`SERIAL`): one request at a time per simulator.
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
    # Arrival schedules per point for the two routers a routing verdict compares (`compared`): a
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


@dataclass(frozen=True)
class Setup:
    """A router of the processes mode: our gateway as `replicas` gateways of `workers` workers each
    (`processes` routing processes), subscribed to the simulators' KV events (`events`) and sharing
    in-flight counts and group placements through Redis (`shared`); or `peer`'s router (one process)."""

    policy: str  # our `routing.policy`, or the peer's `--policy`
    replicas: int = 1
    workers: int = 1
    events: bool = False
    shared: bool = False
    peer: Literal["sglang", "vllm"] | None = None

    @property
    def processes(self) -> int:
        return self.replicas * self.workers


SETUPS: dict[str, Setup] = {
    "ours prefix_affinity x1, events + shared": Setup("prefix_affinity", events=True, shared=True),
    "ours prefix_affinity x4, events + shared": Setup("prefix_affinity", 2, 2, events=True, shared=True),
    "ours prefix_affinity x4, fallback (no events, no Redis)": Setup("prefix_affinity", 2, 2),
    "ours round_robin x1": Setup("round_robin"),
    "ours least_load x1": Setup("least_load"),
    # uniform traffic's baseline at the same process count (four processes share the two cores)
    "ours least_load x4, shared": Setup("least_load", 2, 2, shared=True),
    "sglang-router cache_aware (single process)": Setup("cache_aware", peer="sglang"),
    "vllm-router cache_aware (single process)": Setup("cache_aware", peer="vllm"),
}
OURS_EVENTS = ("ours prefix_affinity x1, events + shared", "ours prefix_affinity x4, events + shared")
FALLBACK = "ours prefix_affinity x4, fallback (no events, no Redis)"
ROUND_ROBIN, LEAST_LOAD = "ours round_robin x1", "ours least_load x1"
LEAST_LOAD_X4 = "ours least_load x4, shared"
PEERS_CACHE_AWARE = ("sglang-router cache_aware (single process)", "vllm-router cache_aware (single process)")
PREFIX_HEAVY = ("shared_prefix", "long_document_qa", "multi_turn_chat", "agent_tool_loop")
PROCESSES = Matrix(
    workloads=(*PREFIX_HEAVY, "uniform"),
    loads=(0.5, 0.8),
    routers=tuple(r for r in SETUPS if r != LEAST_LOAD_X4),
    seconds=20.0,
    uniform_routers=(*OURS_EVENTS, FALLBACK, LEAST_LOAD, LEAST_LOAD_X4),
)


def baseline_of(workload: str, processes: int = 1) -> str:
    """The router a processes-mode row's TTFT p99 is divided by: least load on uniform traffic (only
    balance matters there; with as many processes as the row's when it has 4, since four gateway
    processes share the machine's cores with the fleet), round robin elsewhere."""
    if workload != "uniform":
        return ROUND_ROBIN
    return LEAST_LOAD_X4 if processes == 4 else LEAST_LOAD


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


_pct = percentile


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


def _flush(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushall()
    finally:
        client.close()


def _post(url: str) -> None:
    req = urllib.request.Request(url, data=b"{}", headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


class Suite:
    def __init__(
        self,
        matrix: Matrix,
        spec: FleetSpec,
        log: Log,
        with_peers: bool,
        gateway_ref: str | None,
        setups: dict[str, Setup] | None = None,
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
        #: the processes mode's routers (`SETUPS`), by name; none in the default suite
        self.setups = setups or {}
        self.events = any(x.events for x in self.setups.values())
        self.kv: dict[str, str] = {}  # simulator URL -> the endpoint its KV events are published on
        self.redis: Any = None  # tests.support.RedisServer when a setup shares state
        self.on_row: Callable[[], None] | None = None  # called after every run (partial results)

    def start_fleet(self) -> None:
        for engine in ("vllm", "sglang"):
            for i in range(self.spec.per_engine):
                port = free_port()
                argv = [sys.executable, "-m", "engines.sim", "--engine", engine, "--host", "127.0.0.1",
                        "--port", str(port), *self.spec.flags(engine)]  # fmt: skip
                events = free_port() if self.events else None
                if events is not None:  # both dialects parse this (SGLang ignores the first field)
                    config = {"enable_kv_cache_events": True, "publisher": "zmq",
                              "endpoint": f"tcp://*:{events}", "topic": "kv"}  # fmt: skip
                    argv += ["--kv-events-config", json.dumps(config)]
                svc = self.stack.enter_context(Service(f"fleet-{engine}-{i}", argv, port, probe="/health"))
                self.sims.append(svc)
                self.urls[engine].append(svc.base_url)
                if events is not None:
                    self.kv[svc.base_url] = f"tcp://127.0.0.1:{events}"
        self.log(
            f"fleet up: {len(self.sims)} simulators ({self.spec.per_engine} vLLM + {self.spec.per_engine} SGLang dialect)"
            + (", publishing KV events" if self.events else "")
        )
        if any(x.shared for x in self.setups.values()):
            from tests.support import RedisServer

            self.redis = self.stack.enter_context(RedisServer())
            self.log(f"redis-server up on port {self.redis.port}")

    def gateway_config(self, policy: str, setup: Setup | None = None) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "server": {"log_level": "warning", "graceful_shutdown_s": 1},
            "models": [{"name": PUBLIC, "context_length": 32768, "price": PRICE}],
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
        if setup is None:
            return cfg
        cfg["server"]["workers"] = setup.workers
        if setup.events:
            cfg["models"][0]["tokenizer"] = "sim"
            for pool in cfg["pools"]:
                for b in pool["backends"]:
                    b["kv_events"] = {"endpoint": self.kv[b["url"]], "topic": "kv"}
        cfg["routing"]["shared"] = {"enabled": setup.shared}
        if setup.shared:
            cfg["redis"] = {"url": self.redis.url}
        return cfg

    def router(self, name: str) -> tuple[list[Service], str]:
        """Router `name`'s services (not started: one, or a gateway's replicas) and the model name to send."""
        all_urls = self.urls["vllm"] + self.urls["sglang"]
        setup = self.setups.get(name)
        if setup is not None and setup.peer is None:
            cfg = self.gateway_config(setup.policy, setup)
            slug = f"{setup.policy}-x{setup.processes}{'-events' if setup.events else ''}"
            return [
                gateway_service(f"routing-gw-{slug}-{k}", cfg, self.source) for k in range(setup.replicas)
            ], PUBLIC
        if setup is not None:
            peer = peers.SGLANG_ROUTER if setup.peer == "sglang" else peers.VLLM_ROUTER
            return [
                peers.rust_router(peer, all_urls, setup.policy, f"routing-{peer.key}-{setup.policy}")
            ], SERVED_NAME
        if name.startswith("ours"):
            policy = name[name.index("(") + 1 : -1]
            return [gateway_service(f"routing-gw-{policy}", self.gateway_config(policy), self.source)], PUBLIC
        peer = peers.SGLANG_ROUTER if name.startswith("sglang") else peers.VLLM_ROUTER
        policy = name.split()[-1]
        return [peers.rust_router(peer, all_urls, policy, f"routing-{peer.key}-{policy}")], SERVED_NAME

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
        if self.redis is not None:  # no placements or counts left by the previous router
            _flush(self.redis.url)
        setup = self.setups.get(router)
        started: list[Service] = []
        try:
            services, model = self.router(router)
            for svc in services:
                started.append(svc)
                svc.start()
        except ServiceError as e:
            for svc in started:
                svc.stop()
            self.unavailable[router] = str(e).splitlines()[0][:200]
            self.log(f"  {router}: did not start")
            return
        if setup is not None and setup.peer is None and (setup.events or setup.workers > 1):
            time.sleep(2.0)  # every worker up (readiness is one worker's) and subscribed to the streams
        try:
            path = WORK / "traces" / f"{workload}-{load:.2f}-{round_}-{router.replace(' ', '_')}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                for t, req in zip(times, trace, strict=True):
                    f.write(orjson.dumps({"t": t, "session": req.session, "body": req.body(model)}) + b"\n")
            urls = [a for svc in services for a in ("--url", svc.base_url + "/v1/chat/completions")]
            argv = [
                sys.executable,
                "-m",
                "bench.tracerunner",
                *urls,
                "--trace",
                str(path),
                "--timeout",
                "120",
                "--out",
                str(path.with_suffix(".json")),
            ]
            path.with_suffix(".json").unlink(missing_ok=True)
            out = subprocess.run(
                argv, capture_output=True, text=True, cwd=str(ROOT), timeout=self.m.seconds * 6 + 200
            )
            try:
                res = json.loads(path.with_suffix(".json").read_bytes())
            except (OSError, ValueError) as e:
                raise RuntimeError(f"trace client failed ({e}): {out.stderr[-500:]}") from e
        finally:
            for svc in services:
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
            **figures(res["results"], SLA, PriceSettings(**PRICE).price()),
        }  # fmt: skip
        if setup is not None:
            routes = Counter(r["route"] for r in res["results"] if "route" in r)
            row.update(
                processes=setup.processes, replicas=setup.replicas, workers=setup.workers,
                events=setup.events, shared=setup.shared, routes=dict(routes.most_common()),
            )  # fmt: skip
        if round_ == 0:
            self.rows.append(row)
        if self.on_row is not None:
            self.on_row()
        self.log(
            f"  {workload:<17} {load:4.0%} {router:<{55 if self.setups else 27}} {f'#{round_}' if round_ else '':>3} TTFT p50 {row['ttft_p50_ms']:7.0f} ms  p99 {row['ttft_p99_ms']:7.0f} ms"
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
        "serving": serving_environment(spec),
    }


def serving_environment(spec: FleetSpec) -> dict[str, Any]:
    """What the serving figures depend on besides the machine and the commit: the SLA, the prices and
    each simulator's flags."""
    argv = {e: ["python -m engines.sim --engine", e, *spec.flags(e)] for e in ("vllm", "sglang")}
    return {"sla": asdict(SLA), "price": PRICE, "sim_argv": argv}


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


# -- several routing processes (`SETUPS`, `PROCESSES`) ---------------------------------------------

PROCESSES_JSON = BENCH / "results" / "routing_processes.json"


def run_processes(
    matrix: Matrix,
    log: Log,
    *,
    spec: FleetSpec | None = None,
    setups: dict[str, Setup] | None = None,
    with_peers: bool = True,
    gateway_ref: str | None = None,
    partial: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The processes mode over `matrix` (its routers are names of `setups`, default `SETUPS`);
    `partial` is handed the results so far after every run."""
    spec = spec or FleetSpec()
    setups = setups or SETUPS
    suite = Suite(matrix, spec, log, with_peers, gateway_ref, {r: setups[r] for r in _names(matrix)})
    t0 = time.monotonic()
    if partial is not None:
        suite.on_row = lambda: partial(_processes_result(suite, spec, matrix, t0))
    try:
        suite.run()
    finally:
        suite.stop()
    return _processes_result(suite, spec, matrix, t0)


def _processes_result(suite: Suite, spec: FleetSpec, matrix: Matrix, t0: float) -> dict[str, Any]:
    return {
        "rows": suite.rows,
        "unavailable": suite.unavailable,
        "setups": {name: asdict(x) for name, x in suite.setups.items()},
        "spec": asdict(spec),
        "matrix": asdict(matrix),
        "gateway_source": suite.source.describe,
        "peer_versions": {
            p.label: v for p, v in ((p, suite.versions.get(p.label)) for p in peers.PEERS) if v
        },
        "elapsed_s": time.monotonic() - t0,
        "preamble": preamble(spec, matrix, suite.source.describe),
    }


def _names(m: Matrix) -> list[str]:
    return list(dict.fromkeys((*m.routers, *m.uniform_routers)))


def _row(rows: Sequence[dict[str, Any]], workload: str, load: float, router: str) -> dict[str, Any] | None:
    return next(
        (x for x in rows if (x["workload"], x["load"], x["router"]) == (workload, load, router)), None
    )


def _mark(met: bool | None) -> str:
    return "—" if met is None else ("met" if met else "**missed**")


def _baseline(
    rows: Sequence[dict[str, Any]], workload: str, load: float, processes: int
) -> dict[str, Any] | None:
    """The row a processes-mode row is compared with (`baseline_of`; a run without least load x4
    falls back to x1's)."""
    return _row(rows, workload, load, baseline_of(workload, processes)) or _row(
        rows, workload, load, baseline_of(workload)
    )


def processes_verdicts(res: dict[str, Any]) -> list[str]:
    """The several-process targets on the processes mode's rows: one table row per (workload, load), each
    cell its figure for 1 / 4 processes (ours with events and shared load) and whether it met the target."""
    rows = res["rows"]
    ours = [r for r in OURS_EVENTS if r in res["setups"]]
    L = [
        "| workload | load | hits ÷ oracle ≥ 95 % | TTFT p99 ÷ round robin ≤ 0.5× at 80 %, ≤ 0.8× at 50 % "
        "(uniform: ÷ least load ≤ 1.05×) | p99 below sglang-router `cache_aware` | p99 below vllm-router `cache_aware` |",
        "|---|---:|---|---|---|---|",
    ]
    points = dict.fromkeys((x["workload"], x["load"]) for x in rows)
    heads = ("hits ≥ 95 % of the oracle", "TTFT p99 against round robin", "uniform within +5 % of least load",
             "p99 below sglang-router cache_aware", "p99 below vllm-router cache_aware")  # fmt: skip
    tally = {h: [0, 0] for h in heads}  # met, judged

    def judge(head: str, met: bool) -> str:
        tally[head][0] += met
        tally[head][1] += 1
        return _mark(met)

    for w, load in points:
        cells: list[list[str]] = [[], [], [], []]
        for name in ours:
            x = _row(rows, w, load, name)
            processes = res["setups"][name]["replicas"] * res["setups"][name]["workers"]
            n = f"x{processes}"
            base = _baseline(rows, w, load, processes)
            if x is None:
                for c in cells:
                    c.append(f"{n} not run")
                continue
            if w == "uniform":
                cells[0].append(f"{n} —")
            else:
                cells[0].append(f"{n} {x['hit_vs_oracle']:.1%} {judge(heads[0], x['hit_vs_oracle'] >= 0.95)}")
            if base is None or not base["ttft_p99_ms"]:
                cells[1].append(f"{n} no baseline")
            else:
                ratio = x["ttft_p99_ms"] / base["ttft_p99_ms"]
                bound = 1.05 if w == "uniform" else (0.5 if load >= 0.8 else 0.8)
                cells[1].append(
                    f"{n} {ratio:.2f}× {judge(heads[2 if w == 'uniform' else 1], ratio <= bound)}"
                )
            for k, peer in enumerate(PEERS_CACHE_AWARE, 2):
                p = _row(rows, w, load, peer)
                if w == "uniform":
                    cells[k].append(f"{n} —")
                elif p is None:
                    cells[k].append(f"{n} peer not run")
                else:
                    ahead = x["ttft_p99_ms"] < p["ttft_p99_ms"]
                    cells[k].append(
                        f"{n} {x['ttft_p99_ms']:,.0f} vs {p['ttft_p99_ms']:,.0f} ms {judge(heads[k + 1], ahead)}"
                    )
        L.append(f"| `{w}` | {load:.0%} | " + " | ".join("; ".join(c) for c in cells) + " |")
    judged = [f"{h}: {met} of {n} met" for h, (met, n) in tally.items() if n]
    if judged:
        L += ["", "In all (each point counted once per process count): " + "; ".join(judged) + "."]
    return L


def processes_md(res: dict[str, Any], fleet: str | None = None) -> list[str]:
    """The processes mode's section of bench/BENCHMARKS.md: how it ran, every row, the targets;
    `fleet` in place of its fleet's description (the routing-quality suite's, when the same)."""
    m = res.get("machine", {})
    L = ["## Routing with several processes, KV events and shared load (wall clock)", ""]
    L += [
        f"`{res.get('command', 'python -m bench.routing')}` — {m.get('date', '?')}, commit {m.get('commit', '?')} "
        f"({res['gateway_source']}), {res['elapsed_s'] / 60:.0f} min; {m.get('nproc', '?')} CPUs ({m.get('cpu', '?')}), "
        f"load average at start {m.get('loadavg_at_start', '?')}"
        + (
            "; peers " + ", ".join(f"{k} {v}" for k, v in res["peer_versions"].items())
            if res.get("peer_versions")
            else ""
        )
        + ".",
        "",
        *([fleet] if fleet else res["preamble"][:1]),
        "",
        "Every simulator publishes its KV-cache events (ZMQ on loopback); a real redis-server is flushed before "
        "each run. **x1**: one gateway process; **x4**: two replicas × `workers: 2`, the trace client sending each "
        "request to the next replica. *events + shared*: `kv_events`, `tokenizer: sim` and `routing.shared` on; "
        "*fallback*: neither. Round robin, least load and the peers (single-process routers) run as one process; "
        "on uniform traffic least load also runs as x4 with shared counts, the x4 rows' baseline there. "
        f"Each run: {res['matrix']['seconds']:.0f} s of arrivals at the suite's rates, one schedule per point.",
        "",
    ]
    if res.get("unavailable"):
        L += ["Not measured: " + "; ".join(f"**{k}** — {v[:160]}" for k, v in res["unavailable"].items()), ""]
    L += [
        "Each cell: TTFT p50 / p99 in ms, then hits ÷ oracle (requests and `x-gateway-route` counts: "
        "`bench/results/routing_processes.json`).",
        "",
        *by_point(res["rows"], "workload"),
    ]
    L += ["", "The targets on these rows (ours with events and shared load, x1; x4):", ""]
    L += processes_verdicts(res)
    L.append("")
    return L


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m bench.routing",
        description="The routing suite with several routing processes, the simulators' KV events and "
        "shared load (bench/routing.py's docstring); writes bench/results/routing_processes.json and "
        "prints its bench/BENCHMARKS.md section. The default routing suite is `python -m bench --suite routing`.",
    )
    ap.add_argument("--workload", action="append", choices=list(WORKLOADS), help="repeatable (all five)")
    ap.add_argument("--load", type=float, action="append", help="repeatable (0.5 and 0.8)")
    ap.add_argument("--router", action="append", choices=list(SETUPS), help="repeatable (all)")
    ap.add_argument("--seconds", type=float, default=PROCESSES.seconds, help="arrivals per run")
    ap.add_argument("--no-peers", action="store_true", help="skip the SGLang and vLLM routers")
    ap.add_argument("--gateway-ref", default=None, help="benchmark a git ref instead of the working tree")
    ap.add_argument("--out", default=str(PROCESSES_JSON))
    a = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    routers = tuple(a.router) if a.router else PROCESSES.routers
    matrix = Matrix(
        workloads=tuple(a.workload) if a.workload else PROCESSES.workloads,
        loads=tuple(a.load) if a.load else PROCESSES.loads,
        routers=routers,
        seconds=a.seconds,
        uniform_routers=tuple(r for r in PROCESSES.uniform_routers if not a.router or r in a.router),
    )
    t0 = time.monotonic()

    def log(msg: str) -> None:
        el = time.monotonic() - t0
        print(f"[{int(el // 60):02d}:{el % 60:04.1f}] {msg}", flush=True)

    shown = list(argv if argv is not None else sys.argv[1:])
    about = machine.describe(shown)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m bench.routing", *shown])

    def save(res: dict[str, Any]) -> None:
        res.update(machine=about, command=command)
        out.write_text(json.dumps(res, indent=1))

    res = run_processes(matrix, log, with_peers=not a.no_peers, gateway_ref=a.gateway_ref, partial=save)
    save(res)
    print("\n".join(processes_md(res)))
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
