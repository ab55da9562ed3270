"""Overhead suite: what each proxy adds in front of one zero-latency simulator, side by side in one run.

Targets (all in front of the *same* vLLM-dialect simulator, `--fast`, 128-token natural answers capped
by `max_tokens`): `direct` (the simulator itself), our gateway bare (1 and 2 workers), our gateway
with the full admission pipeline (when the settings exist), LiteLLM, the SGLang router and the vLLM
router (both `round_robin`, one worker).

Phases, each alternating the targets (the order rotates every round, so slow drift of a shared machine
spreads over all of them):

1. non-streaming, `wrk` at concurrency 1, 16, 64 (`max_tokens` 16): latency percentiles, req/s, and
   CPU per request of the target's process tree (/proc before/after, divided by requests);
2. streaming, `bench.streamclient` at concurrency 1, 32, 256 (`max_tokens` 32, so 32 content chunks):
   time to first chunk and total, CPU per stream and per SSE event; plus one run with 128 chunks at
   concurrency 32, so CPU per *relayed chunk* is a slope that excludes the per-request cost;
3. memory: 1,000 slow streams (the simulator drips a chunk every 100 ms) held open at once; RSS delta
   of the target's tree per 1,000 streams; and 2,000 concurrent streams through one gateway process,
   counting errors.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from bench import peers
from bench.load import HeldStreams, StreamResult, WrkResult, run_streams, run_wrk, write_wrk_script
from bench.procs import WORK, Service, ServiceError, free_port
from bench.targets import (
    MODEL,
    GatewaySource,
    Target,
    bench_token,
    full_pipeline_available,
    full_sections,
    gateway_config,
    gateway_service,
    gateway_source,
)
from gateway.demo import SERVED

Log = Callable[[str], None]
SERVED_NAME = SERVED["vllm"]
PROMPT = "Write a short note about the weather in Lisbon today, please."


@dataclass
class Plan:
    nonstream_conc: tuple[int, ...] = (1, 16, 64)
    stream_conc: tuple[int, ...] = (1, 32, 256)
    seconds: float = 3.0
    rounds: int = 1
    held_streams: int = 1000
    many_streams: int = 2000
    drip_ms: float = 100.0
    with_peers: bool = True
    profile: bool = True
    #: the 2-worker gateway is there for the c=64 throughput target; other points only in full mode
    workers2_everywhere: bool = False
    #: quick mode: a target needing more than this CPU per request (LiteLLM) is streamed at ≤ 32
    #: concurrent streams and holds 200 streams (scaled to 1,000) — otherwise it alone takes minutes
    slow_cpu_us: float | None = 5000.0


QUICK = Plan(seconds=2.0)
FULL = Plan(seconds=6.0, rounds=3, workers2_everywhere=True, slow_cpu_us=None)


@dataclass
class Point:
    """One measurement of one target at one concurrency (one round)."""

    target: str
    concurrency: int
    rps: float
    p50_us: float
    p90_us: float
    p99_us: float
    cpu_us_per_req: float
    target_cpu_util: float  # CPU seconds of the target per wall second
    client_cpu_util: float
    errors: int
    requests: int
    events_per_stream: float = 0.0
    total_p50_us: float = 0.0
    total_p99_us: float = 0.0


@dataclass
class OverheadResults:
    targets: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> label, note, version
    unavailable: dict[str, str] = field(default_factory=dict)  # label -> why
    nonstream: list[Point] = field(default_factory=list)
    stream: list[Point] = field(default_factory=list)
    stream_long: list[Point] = field(default_factory=list)  # 128 chunks at c=32
    memory: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> rss figures
    many_streams: dict[str, Any] = field(default_factory=dict)
    profiles: list[dict[str, Any]] = field(default_factory=list)
    plan: dict[str, Any] = field(default_factory=dict)
    gateway_source: str = ""
    sim_argv: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    i = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return sorted(values)[i]


def _body(model: str, *, stream: bool, max_tokens: int) -> bytes:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
    }
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


def _post(url: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(url, data=orjson.dumps(body), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        r.read()


def _check(target: Target) -> str | None:
    """None when one plain and one streamed request succeed through the target, else why not."""
    for stream in (False, True):
        req = urllib.request.Request(
            target.chat_url,
            data=_body(target.model, stream=stream, max_tokens=4),
            headers={"content-type": "application/json", **target.headers},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                data = r.read()
                if r.status != 200 or (stream and b"data:" not in data):
                    return f"status {r.status}: {data[:200]!r}"
        except Exception as e:
            return f"{type(e).__name__}: {e}"
    return None


class Bench:
    """Holds the running processes of the suite; everything is stopped by PID on exit."""

    def __init__(self, plan: Plan, log: Log, gateway_ref: str | None = None) -> None:
        self.plan = plan
        self.gateway_ref = gateway_ref
        self.source: GatewaySource = gateway_source(gateway_ref)
        self.log = log
        self.stack = contextlib.ExitStack()
        self.results = OverheadResults(plan=asdict(plan))
        self.targets: list[Target] = []
        self.sim: Service | None = None
        self.slow: set[str] = set()  # targets measured less in quick mode (see Plan.slow_cpu_us)

    # -- set-up --------------------------------------------------------------------------------
    def start(self) -> None:
        port = free_port()
        argv = [
            __import__("sys").executable,
            "-m",
            "engines.sim",
            "--engine",
            "vllm",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            SERVED_NAME,
            "--fast",
            "--max-num-seqs",
            "100000",
            "--min-output-tokens",
            "128",
            "--max-output-tokens",
            "128",
            "--request-log-size",
            "1",
        ]
        self.results.sim_argv = ["python", *argv[1:]]
        self.sim = self.stack.enter_context(Service("overhead-sim", argv, port, probe="/health"))
        sim = self.sim
        self.log(f"simulator up on {sim.base_url} (pid {sim.pid})")
        self._add(Target("direct", "direct (simulator)", sim.base_url, SERVED_NAME, None, charge_pid=sim.pid))
        urls = [sim.base_url]
        self._gateway("gw_bare", "our gateway, bare", gateway_config("vllm", urls))
        if "gw_bare" not in self.results.targets and self.gateway_ref is None:
            self.source = gateway_source("HEAD")
            self.log(
                f"the working tree's gateway fails; falling back to a snapshot of {self.source.describe}"
            )
            self.results.unavailable.pop("our gateway, bare", None)
            self._gateway("gw_bare", "our gateway, bare", gateway_config("vllm", urls))
        self.results.gateway_source = self.source.describe
        self._gateway("gw_bare2", "our gateway, bare, 2 workers", gateway_config("vllm", urls, workers=2))
        if full_pipeline_available(self.source):
            from tests.support import RedisServer

            redis = self.stack.enter_context(RedisServer())
            self.log(f"redis-server up on port {redis.port} (pid {redis.proc.pid if redis.proc else '?'})")
            cfg = gateway_config("vllm", urls, **full_sections(redis.url))
            self._gateway(
                "gw_full", "our gateway, full pipeline", cfg, {"authorization": f"Bearer {bench_token()}"}
            )
        else:
            self.results.unavailable["our gateway, full pipeline"] = (
                "not available yet: gateway/settings.py has no auth/limits/sanitise sections"
            )
        if self.plan.with_peers:
            self._peers(urls)

    def _add(self, target: Target, version: str = "") -> None:
        why = _check(target)
        if why:
            self.log(f"  {target.label}: unavailable ({why})")
            self.results.unavailable[target.label] = why
            if target.service is not None:
                target.service.stop()
            return
        self.targets.append(target)
        self.results.targets[target.key] = {"label": target.label, "version": version, "note": target.note}

    def _gateway(
        self, key: str, label: str, cfg: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        try:
            svc = self.stack.enter_context(gateway_service(f"overhead-{key}", cfg, self.source))
        except ServiceError as e:
            self.results.unavailable[label] = str(e)[-300:]
            self.log(f"  {label}: did not start")
            return
        svc.remember_tree()
        self.log(f"{label} up on {svc.base_url} (pid {svc.pid})")
        self._add(Target(key, label, svc.base_url, MODEL, svc, dict(headers or {}), charge_pid=svc.pid))
        if key not in self.results.targets:
            self.log(f"    log: {svc.log_tail(600)}")

    def _peers(self, urls: list[str]) -> None:
        for peer, make in (
            (
                peers.SGLANG_ROUTER,
                lambda: peers.rust_router(peers.SGLANG_ROUTER, urls, "round_robin", "overhead-sglang-router"),
            ),
            (
                peers.VLLM_ROUTER,
                lambda: peers.rust_router(peers.VLLM_ROUTER, urls, "round_robin", "overhead-vllm-router"),
            ),
            (peers.LITELLM, lambda: peers.litellm_proxy(urls, MODEL, SERVED_NAME, "overhead-litellm")),
        ):
            version = peers.ensure(peer, self.log)
            label = f"{peer.label} {version}" if version else peer.label
            if not version:
                self.results.unavailable[peer.label] = "could not be installed from the package index"
                continue
            try:
                svc = self.stack.enter_context(make())
            except ServiceError as e:
                self.results.unavailable[label] = str(e)[-300:]
                self.log(f"  {label}: did not start")
                continue
            self.log(f"{label} up on {svc.base_url} (pid {svc.pid})")
            model = MODEL if peer is peers.LITELLM else SERVED_NAME
            key = peer.key.replace("-", "_")
            headers = {"authorization": f"Bearer {peers.LITELLM_KEY}"} if peer is peers.LITELLM else {}
            note = (
                "master key on (it will not start without one), no database"
                if peer is peers.LITELLM
                else "round_robin"
            )
            self._add(
                Target(key, label, svc.base_url, model, svc, headers, charge_pid=svc.pid, note=note), version
            )

    def stop(self) -> None:
        self.stack.close()

    # -- phases --------------------------------------------------------------------------------
    def _order(self, rnd: int, streaming: bool = False, conc: int = 0) -> list[Target]:
        targets = self.targets
        if not self.plan.workers2_everywhere and (streaming or conc != 64):
            targets = [t for t in targets if t.key != "gw_bare2"]
        if streaming and conc > 32:
            targets = [t for t in targets if t.key not in self.slow]
        n = len(targets)
        k = rnd % n if n else 0
        return targets[k:] + targets[:k]

    def _cpu(self, t: Target) -> float:
        from bench.procs import tree_cpu

        return tree_cpu(t.charge_pid)

    def nonstream(self) -> None:
        p = self.plan
        scripts = {
            t.key: write_wrk_script(t.key, _body(t.model, stream=False, max_tokens=16), t.headers)
            for t in self.targets
        }
        self.log("non-streaming: warm-up")
        for t in self.targets:
            run_wrk(t.chat_url, scripts[t.key], 16, 1)
        for rnd in range(p.rounds):
            for c in p.nonstream_conc:
                for t in self._order(rnd, conc=c):
                    c0 = self._cpu(t)
                    r: WrkResult = run_wrk(t.chat_url, scripts[t.key], c, p.seconds)
                    cpu = self._cpu(t) - c0
                    pt = Point(
                        t.key, c, r.rps, r.p50_us, r.p90_us, r.p99_us,
                        cpu / r.requests * 1e6 if r.requests else 0.0,
                        cpu / r.seconds if r.seconds else 0.0,
                        r.client_cpu_s / r.seconds if r.seconds else 0.0,
                        r.errors, r.requests,
                    )  # fmt: skip
                    self.results.nonstream.append(pt)
                    if p.slow_cpu_us is not None and pt.cpu_us_per_req > p.slow_cpu_us:
                        self.slow.add(t.key)
                    self.log(
                        f"  round {rnd + 1}/{p.rounds} c={c:<3} {t.label:<34} {r.rps:8.0f} req/s  p50 {r.p50_us / 1000:7.3f} ms"
                        f"  p99 {r.p99_us / 1000:7.2f} ms  CPU {pt.cpu_us_per_req:7.0f} µs/req  errors {r.errors}"
                    )

    def _stream_point(self, t: Target, c: int, body_file: Any) -> Point:
        c0 = self._cpu(t)
        r: StreamResult = run_streams(t.chat_url, body_file, t.headers, c, self.plan.seconds)
        cpu = self._cpu(t) - c0
        return Point(
            t.key, c, r.rps, _pct(r.ttfc_us, 50), _pct(r.ttfc_us, 90), _pct(r.ttfc_us, 99),
            cpu / r.completed * 1e6 if r.completed else 0.0,
            cpu / r.wall_s if r.wall_s else 0.0,
            r.client_cpu_s / r.wall_s if r.wall_s else 0.0,
            r.errors, r.completed, r.events_per_stream, _pct(r.total_us, 50), _pct(r.total_us, 99),
        )  # fmt: skip

    def stream(self) -> None:
        p = self.plan
        files = {}
        for t in self.targets:
            for n in (32, 128):
                path = WORK / "bodies" / f"{t.key}-stream{n}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(_body(t.model, stream=True, max_tokens=n))
                files[t.key, n] = path
        for rnd in range(p.rounds):
            for c in p.stream_conc:
                for t in self._order(rnd, streaming=True, conc=c):
                    pt = self._stream_point(t, c, files[t.key, 32])
                    self.results.stream.append(pt)
                    self.log(
                        f"  round {rnd + 1}/{p.rounds} stream c={c:<3} {t.label:<34} {pt.rps:7.0f} streams/s"
                        f"  TTFC p50 {pt.p50_us / 1000:7.3f} ms  total p50 {pt.total_p50_us / 1000:7.2f} ms"
                        f"  CPU {pt.cpu_us_per_req:7.0f} µs/stream  client CPU {pt.client_cpu_util:4.0%}  errors {pt.errors}"
                    )
            for t in self._order(rnd, streaming=True):
                pt = self._stream_point(t, 32, files[t.key, 128])
                self.results.stream_long.append(pt)
                self.log(
                    f"  round {rnd + 1}/{p.rounds} 128-chunk streams c=32 {t.label:<30} CPU {pt.cpu_us_per_req:7.0f} µs/stream"
                )

    def memory(self) -> None:
        p = self.plan
        assert self.sim is not None
        faults = self.sim.base_url + "/sim/faults"
        _post(faults, {"drip_ms": p.drip_ms})
        try:
            for t in self._order(0, streaming=True):
                path = WORK / "bodies" / f"{t.key}-stream32.json"
                self.results.memory[t.key] = self._held(
                    t, path, 200 if t.key in self.slow else p.held_streams
                )
                m = self.results.memory[t.key]
                self.log(
                    f"  {p.held_streams} open streams via {t.label:<34} RSS +{m['rss_delta_mb']:6.1f} MB"
                    f"  (opened in {m['open_s']:.1f} s, errors {m['errors']:.0f})"
                )
            gw = next((t for t in self.targets if t.key == "gw_bare"), None)
            if gw is not None:
                path = WORK / "bodies" / "gw_bare-stream32.json"
                m = self._held(gw, path, p.many_streams)
                self.results.many_streams = {"target": gw.key, "streams": p.many_streams, **m}
                self.log(
                    f"  {p.many_streams} concurrent streams via one gateway process: {m['completed']:.0f} completed, {m['errors']:.0f} errors"
                )
        finally:
            _post(faults, {"drip_ms": 0})

    def profiles(self) -> None:
        """py-spy profiles of our gateway (one worker) under non-streaming and streaming load."""
        from bench.profiling import profile

        secs = max(3.0, self.plan.seconds)
        for t in self.targets:
            if t.key not in ("gw_bare", "gw_full"):
                continue
            script = WORK / "wrk" / f"{t.key}.lua"
            prof = profile(
                f"{t.key}-nonstream-c16",
                t.charge_pid,
                secs,
                lambda t=t, s=script: run_wrk(t.chat_url, s, 16, secs + 1),
            )
            self.results.profiles.append(asdict(prof))
            self.log(f"  profile {prof.name}: {prof.samples} samples {prof.error}")
            if t.key == "gw_bare":
                body = WORK / "bodies" / f"{t.key}-stream32.json"
                prof = profile(
                    f"{t.key}-stream-c32",
                    t.charge_pid,
                    secs,
                    lambda t=t, b=body: run_streams(t.chat_url, b, t.headers, 32, secs + 1),
                )
                self.results.profiles.append(asdict(prof))
                self.log(f"  profile {prof.name}: {prof.samples} samples {prof.error}")

    def _held(self, t: Target, body_file: Any, n: int) -> dict[str, Any]:
        from bench.procs import tree_rss

        time.sleep(0.5)
        before = tree_rss(t.charge_pid)
        held = HeldStreams(t.chat_url, body_file, t.headers, n)
        try:
            ready = held.wait_ready(timeout=60)
            time.sleep(0.3)
            during = tree_rss(t.charge_pid)
            res = held.finish(timeout=300)
        except Exception as e:
            held.stop()
            self.log(f"  {t.label}: holding {n} streams failed: {e}")
            return {"rss_before_mb": before / 2**20, "rss_delta_mb": float("nan"), "open_s": float("nan"),
                    "errors": float(n), "completed": 0.0, "failed": 1.0}  # fmt: skip
        return {
            "rss_before_mb": before / 2**20,
            "rss_during_mb": during / 2**20,
            "rss_delta_mb": (during - before) / 2**20 * 1000 / n,
            "open_s": ready["open_s"],
            "errors": float(res.errors),
            "completed": float(res.completed),
            "ttfc_p50_ms": _pct(res.ttfc_us, 50) / 1000,
            "ttfc_p99_ms": _pct(res.ttfc_us, 99) / 1000,
            "error_kinds": res.error_kinds,
            "held": float(n),
        }


def run(plan: Plan, log: Log, gateway_ref: str | None = None) -> OverheadResults:
    bench = Bench(plan, log, gateway_ref)
    try:
        bench.start()
        if not bench.targets:
            raise RuntimeError("no target came up")
        log(f"targets: {', '.join(t.label for t in bench.targets)}")
        bench.nonstream()
        bench.stream()
        bench.memory()
        if plan.profile:
            bench.profiles()
    finally:
        bench.stop()
    out = WORK / "overhead.json"
    out.write_text(json.dumps(bench.results.to_json(), indent=1))
    return bench.results


def median_by(points: list[Point], target: str, conc: int, attr: str) -> float:
    vals = [getattr(p, attr) for p in points if p.target == target and p.concurrency == conc]
    return statistics.median(vals) if vals else float("nan")
