"""`make soak` → a bounded soak of one gateway process: many concurrent streams, churn and faults.

    .venv/bin/python scripts/soak.py [--minutes 10] [--concurrency 500] [--out bench/soak]

What runs (all on loopback, everything stopped by PID at the end):
- three vLLM-dialect simulators (80 ms per token, 1024 running slots) behind one gateway process
  (auth on: every request carries a JWT);
- `concurrency` client workers, each looping: a streamed chat of 20–80 tokens (1 in 10 abandoned
  after a few events: churn), now and then a non-streamed one;
- a fault cycle every 60 s: at +15 s one simulator is killed (SIGKILL: its in-flight streams are cut)
  and restarted on the same port at +25 s; at +35 s another answers 503 to everything for 5 s;
  at +45 s a third cuts every stream after 5 chunks for 5 s.

Every 5 s it samples the gateway's RSS and open file descriptors, the latency of `GET /healthz`
(event-loop lag: the probe waits behind everything else on the loop), and the outcome counters.

Pass criteria: RSS growth < 10 % from the end of warm-up (first 20 % of the run, at
least 60 s) to the end; no file-descriptor growth (the level once the load has stopped and pooled
connections idled out, compared with the idle level before it started); zero gateway-originated 5xx (a 500 `server_error` from the gateway itself:
engine-caused 503s during a fault are counted apart); every stream either completed, ended with an
error event then `[DONE]`, or was abandoned by the client on purpose — none truncated or hung.
Writes `<out>/latest.json` (figures and the time series) and `<out>/latest.md` (a table): a
measurement, so it lives in bench/ (docs/reliability.md describes the soak). Exit status 1 when a criterion fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engines.sim.launcher import SimProcess, free_port  # noqa: E402
from gateway.admission.tokens import mint_token  # noqa: E402
from gateway.demo import SERVED, sim_flags  # noqa: E402
from gateway.upstream.h1 import KEEPALIVE_S  # noqa: E402
from tests.support import GatewayProcess  # noqa: E402

MODEL = "soak-model"
SECRET = "soak-secret-" + "z" * 32
GATEWAY_BUG = "The server had an error while processing your request"


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Tally:
    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.errors: Counter[str] = Counter()  # cause → count
        self.in_flight = 0


async def one_stream(session: aiohttp.ClientSession, url: str, tally: Tally, rng: random.Random) -> None:
    n = rng.randint(20, 80)
    abandon_after = rng.randint(1, 10) if rng.random() < 0.1 else None
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"soak {rng.random()}"}],
        "max_tokens": n,
        "min_tokens": n,
        "stream": True,
    }
    tally.in_flight += 1
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=120, sock_read=30)) as r:
            tally.statuses[r.status] += 1
            if r.status != 200:
                text = await r.text()
                tally.outcomes["http_error"] += 1
                cause = "gateway_5xx" if GATEWAY_BUG in text else f"status_{r.status}"
                tally.errors[cause] += 1
                return
            events = 0
            error_seen = False
            done = False
            async for line in r.content:
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                events += 1
                if payload.startswith(b'{"error"'):
                    error_seen = True
                    msg = json.loads(payload)["error"].get("message", "")
                    tally.errors["gateway_5xx" if GATEWAY_BUG in msg else "stream_error_event"] += 1
                if abandon_after is not None and events >= abandon_after:
                    tally.outcomes["abandoned"] += 1
                    return
            if done:
                tally.outcomes["error_event_then_done" if error_seen else "completed"] += 1
            else:
                tally.outcomes["truncated"] += 1
                tally.errors["truncated_without_done"] += 1
    except TimeoutError:
        tally.outcomes["hung"] += 1
        tally.errors["client_timeout"] += 1
    except aiohttp.ClientError as exc:
        tally.outcomes["client_error"] += 1
        tally.errors[f"client_{type(exc).__name__}"] += 1
    finally:
        tally.in_flight -= 1


async def one_plain(session: aiohttp.ClientSession, url: str, tally: Tally, rng: random.Random) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "plain"}], "max_tokens": 8}
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=60)) as r:
            text = await r.text()
            tally.statuses[r.status] += 1
            if r.status == 200:
                tally.outcomes["plain_ok"] += 1
            else:
                tally.outcomes["http_error"] += 1
                tally.errors["gateway_5xx" if GATEWAY_BUG in text else f"status_{r.status}"] += 1
    except TimeoutError:
        tally.outcomes["hung"] += 1
        tally.errors["client_timeout"] += 1
    except aiohttp.ClientError as exc:
        tally.outcomes["client_error"] += 1
        tally.errors[f"client_{type(exc).__name__}"] += 1


async def worker(base: str, token: str, tally: Tally, stop: asyncio.Event, seed: int) -> None:
    rng = random.Random(seed)
    url = base + "/v1/chat/completions"
    headers = {"authorization": f"Bearer {token}"}
    connector = aiohttp.TCPConnector(limit=1, force_close=rng.random() < 0.2)
    async with aiohttp.ClientSession(headers=headers, connector=connector) as session:
        await asyncio.sleep(rng.random() * 5)  # ramp up over 5 s
        while not stop.is_set():
            if rng.random() < 0.05:
                await one_plain(session, url, tally, rng)
            else:
                await one_stream(session, url, tally, rng)


async def faults(sims: list[SimProcess], stop: asyncio.Event, log: list[dict[str, Any]], t0: float) -> None:
    loop = asyncio.get_running_loop()

    async def post(sim: SimProcess, body: dict[str, Any]) -> None:
        async with aiohttp.ClientSession() as s:
            await s.post(sim.base_url + "/sim/faults", json=body)

    def note(what: str) -> None:
        log.append({"t": round(loop.time() - t0, 1), "fault": what})

    cycle = 0
    while not stop.is_set():
        start = loop.time()

        async def at(offset: float, start: float = start) -> bool:
            delay = start + offset - loop.time()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                    return False
                except TimeoutError:
                    pass
            return not stop.is_set()

        victim = sims[cycle % len(sims)]
        if not await at(15):
            return
        os.kill(victim.pid, signal.SIGKILL)
        note(f"kill -9 {victim.port}")
        if not await at(25):
            return
        await loop.run_in_executor(None, victim.start)
        note(f"restart {victim.port}")
        storm = sims[(cycle + 1) % len(sims)]
        if not await at(35):
            return
        await post(storm, {"fault_rate": 1, "fault_kind": "503"})
        note(f"503 storm {storm.port}")
        if not await at(40):
            return
        await post(storm, {"reset": True})
        cutter = sims[(cycle + 2) % len(sims)]
        if not await at(45):
            return
        await post(cutter, {"crash_after": 5, "crash_mode": "cut"})
        note(f"mid-stream cuts {cutter.port}")
        if not await at(50):
            return
        await post(cutter, {"reset": True})
        if not await at(60):
            return
        cycle += 1


async def sampler(
    base: str, pid: int, tally: Tally, stop: asyncio.Event, series: list[dict[str, Any]], t0: float
) -> None:
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            lags = []
            for _ in range(5):
                t = loop.time()
                try:
                    async with session.get(base + "/healthz", timeout=aiohttp.ClientTimeout(total=10)) as r:
                        await r.read()
                    lags.append((loop.time() - t) * 1000)
                except (aiohttp.ClientError, TimeoutError):
                    lags.append(10_000.0)
                await asyncio.sleep(0.05)
            series.append(
                {
                    "t": round(loop.time() - t0, 1),
                    "rss_mb": round(rss_mb(pid), 1),
                    "fds": fds(pid),
                    "healthz_ms_p50": round(statistics.median(lags), 2),
                    "healthz_ms_max": round(max(lags), 2),
                    "client_in_flight": tally.in_flight,
                    "outcomes": dict(tally.outcomes),
                }
            )
            s = series[-1]
            print(
                f"t={s['t']:6.1f}s rss={s['rss_mb']:.1f}MB fds={s['fds']} healthz p50={s['healthz_ms_p50']}ms "
                f"max={s['healthz_ms_max']}ms in_flight={s['client_in_flight']} {dict(tally.outcomes)}",
                flush=True,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 5)


@dataclass
class Footprint:
    """The gateway process's descriptors and memory before and after the load, and its log."""

    before_fds: int
    before_rss: float
    after_fds: int = 0
    after_rss: float = 0.0
    log: str = ""


def gateway_config(sims: list[SimProcess]) -> dict[str, Any]:
    return {
        "server": {"graceful_shutdown_s": 5, "log_level": "warning"},
        "models": [{"name": MODEL, "context_length": 8192}],
        "pools": [
            {
                "name": "vllm",
                "dialect": "vllm",
                "models": {MODEL: SERVED["vllm"]},
                "backends": [{"name": f"vllm-{i}", "url": s.base_url} for i, s in enumerate(sims)],
            }
        ],
        "upstream": {
            "health": {"interval_s": 1, "failure_threshold": 3, "open_s": 2},
            "timeouts": {"first_byte_s": 10, "idle_s": 10},
        },
        "routing": {"policy": "least_load", "scrape_interval_s": 1},
        "auth": {"jwt": {"secret": SECRET}},
        "access_log": {"enabled": False},
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    flags = [*sim_flags("vllm"), "--ttft-ms", "50", "--itl-ms", "80", "--max-num-seqs", "1024"]
    flags += ["--load-slowdown", "0", "--request-log-size", "16"]
    sims = [SimProcess("vllm", free_port(), flags) for _ in range(3)]
    for s in sims:
        s.start()
    gw = GatewayProcess(gateway_config(sims)).start()
    tally = Tally()
    series: list[dict[str, Any]] = []
    fault_log: list[dict[str, Any]] = []
    try:
        footprint = await load(args, gw, sims, tally, series, fault_log)
    finally:
        gw.stop()
        for s in sims:
            s.stop()
    return verdict(args, tally, series, fault_log, footprint)


async def load(
    args: argparse.Namespace,
    gw: GatewayProcess,
    sims: list[SimProcess],
    tally: Tally,
    series: list[dict[str, Any]],
    fault_log: list[dict[str, Any]],
) -> Footprint:
    """The soak itself: the workers, the sampler and the fault cycle for `args.minutes`, then the
    streams left end and the idle connections close."""
    duration = args.minutes * 60
    base = gw.base_url
    # The idle steady state: health probes and scrapes keep one pooled connection each per
    # backend, opened in the first seconds; the baseline is taken once they are there.
    await asyncio.sleep(5)
    footprint = Footprint(fds(gw.pid), rss_mb(gw.pid))
    token = mint_token(SECRET, "soak", ttl_s=duration + 3600)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    tasks = [loop.create_task(worker(base, token, tally, stop, i)) for i in range(args.concurrency)]
    side = [
        loop.create_task(sampler(base, gw.pid, tally, stop, series, t0)),
        loop.create_task(faults(sims, stop, fault_log, t0)),
    ]
    await asyncio.sleep(duration)
    stop.set()
    # Let every stream that is running end on its own (bounded: none lasts more than ~10 s).
    _, pending = await asyncio.wait(tasks, timeout=60)
    for t in pending:
        t.cancel()
    await asyncio.gather(*side, return_exceptions=True)
    # Idle pooled connections (upstream keep-alive, clients gone) close; a leak would stay.
    settle_deadline = loop.time() + KEEPALIVE_S + 10
    while fds(gw.pid) > footprint.before_fds + 2 and loop.time() < settle_deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.5)
    footprint.after_fds = fds(gw.pid)
    footprint.after_rss = rss_mb(gw.pid)
    footprint.log = gw.log()
    return footprint


def verdict(
    args: argparse.Namespace,
    tally: Tally,
    series: list[dict[str, Any]],
    fault_log: list[dict[str, Any]],
    footprint: Footprint,
) -> dict[str, Any]:
    """The soak's figures and whether each criterion held."""
    duration = args.minutes * 60
    before_rss, after_rss = footprint.before_rss, footprint.after_rss
    before_fds, after_fds = footprint.before_fds, footprint.after_fds
    warm = max(60.0, duration * 0.2)
    warm_rss = [s["rss_mb"] for s in series if s["t"] >= warm][:3]
    end_rss = [s["rss_mb"] for s in series][-3:]
    rss_warm = statistics.mean(warm_rss) if warm_rss else before_rss
    rss_end = statistics.mean(end_rss) if end_rss else after_rss
    growth = (rss_end - rss_warm) / rss_warm * 100 if rss_warm else 0.0
    lag_p50 = [s["healthz_ms_p50"] for s in series]
    lag_max = [s["healthz_ms_max"] for s in series]
    o = tally.outcomes
    streams = o["completed"] + o["error_event_then_done"] + o["abandoned"] + o["truncated"] + o["hung"]
    figures = {
        "minutes": args.minutes,
        "concurrency": args.concurrency,
        "streams_total": streams,
        "outcomes": dict(o),
        "http_statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "errors_by_cause": dict(tally.errors),
        "rss_mb": {
            "before_load": round(before_rss, 1),
            "after_warmup": round(rss_warm, 1),
            "end": round(rss_end, 1),
            "after_load": round(after_rss, 1),
            "max": max((s["rss_mb"] for s in series), default=0),
        },
        "rss_growth_after_warmup_pct": round(growth, 2),
        "fds": {
            "before_load": before_fds,
            "after_load": after_fds,
            "max": max((s["fds"] for s in series), default=0),
        },
        "healthz_ms": {
            "p50_of_p50": round(statistics.median(lag_p50), 2) if lag_p50 else None,
            "max_p50": max(lag_p50, default=None),
            "max": max(lag_max, default=None),
        },
        "gateway_log_tracebacks": footprint.log.count("Traceback"),
        "faults": fault_log,
    }
    checks = {
        "rss_growth_below_10pct": growth < 10,
        "no_fd_growth": after_fds <= before_fds + 2,
        "zero_gateway_5xx": tally.errors["gateway_5xx"] == 0 and figures["gateway_log_tracebacks"] == 0,
        "no_truncated_or_hung_stream": o["truncated"] == 0 and o["hung"] == 0 and o["client_error"] == 0,
        "faults_ended_streams_with_error_events": o["error_event_then_done"] > 0 or not fault_log,
    }
    figures["checks"] = checks
    figures["passed"] = all(checks.values())
    figures["series"] = series
    return figures


def write(out: Path, figures: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(figures, indent=1) + "\n")
    f = figures
    lines = [
        "# Latest soak (generated by `make soak`; do not edit)",
        "",
        f"{f['minutes']} min, {f['concurrency']} concurrent client workers, one gateway process, three simulators, "
        f"a fault cycle every 60 s (kill -9 + restart, 5 s 503 storm, 5 s mid-stream cuts). "
        f"Result: **{'PASS' if f['passed'] else 'FAIL'}**.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| streams | {f['streams_total']} |",
        f"| outcomes | {', '.join(f'{k} {v}' for k, v in sorted(f['outcomes'].items()))} |",
        f"| HTTP statuses | {', '.join(f'{k}: {v}' for k, v in f['http_statuses'].items())} |",
        f"| errors by cause | {', '.join(f'{k} {v}' for k, v in sorted(f['errors_by_cause'].items())) or 'none'} |",
        f"| RSS (MB) before load / after warm-up / end / max | {f['rss_mb']['before_load']} / {f['rss_mb']['after_warmup']} / {f['rss_mb']['end']} / {f['rss_mb']['max']} |",
        f"| RSS growth after warm-up | {f['rss_growth_after_warmup_pct']} % |",
        f"| open FDs before load / max under load / after load | {f['fds']['before_load']} / {f['fds']['max']} / {f['fds']['after_load']} |",
        f"| event-loop lag (`/healthz` latency, ms): median / worst sample median / worst | {f['healthz_ms']['p50_of_p50']} / {f['healthz_ms']['max_p50']} / {f['healthz_ms']['max']} |",
        f"| tracebacks in the gateway log | {f['gateway_log_tracebacks']} |",
        f"| faults injected | {len(f['faults'])} |",
        "",
        "| check | passed |",
        "|---|---|",
        *[f"| {k} | {'yes' if v else '**no**'} |" for k, v in f["checks"].items()],
        "",
        "RSS and FDs over time (every 5 s): `latest.json` → `series`.",
        "",
    ]
    (out / "latest.md").write_text("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=500)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "soak")
    args = p.parse_args()
    figures = asyncio.run(run(args))
    write(args.out, figures)
    print(json.dumps({k: v for k, v in figures.items() if k not in ("series", "faults")}, indent=1))
    sys.exit(0 if figures["passed"] else 1)


if __name__ == "__main__":
    main()
