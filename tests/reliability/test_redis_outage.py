"""Redis stopped and restarted under traffic, with both limiter policies side by side.

Two gateways share one Redis (append-only file on, as in production): `open` (limits.on_redis_error
fail_open) and `closed` (fail_closed). Traffic runs on both the whole time. While Redis is down:
`open` keeps answering 200 (its own limiter decides), `closed` answers 503 in OpenAI's shape,
admin reads show the last known fleet overrides, a weight change applies on the replica asked;
/readyz stays ready on `open` (it serves) and says not ready on `closed`. When Redis is back (same port, same data), both recover without a restart:
`closed` serves 200 again, an admin change goes through and reaches the other replica.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from collections import Counter
from typing import Any

import httpx
import pytest

from tests.conftest import fast_sim, single_pool_config
from tests.reliability.support import SECRET, bearer, chat, token
from tests.support import HTTP, GatewayProcess, free_port, wait_until

pytestmark = pytest.mark.processes


class PersistentRedis:
    """redis-server with an append-only file in a temp dir: a restart keeps the data."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = tempfile.mkdtemp(prefix="redis-rel-")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (make test installs it)"
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                self.dir,
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def up() -> bool:
            try:
                return (
                    subprocess.run(
                        ["redis-cli", "-p", str(self.port), "ping"], capture_output=True, timeout=2
                    ).stdout.strip()
                    == b"PONG"
                )
            except (OSError, subprocess.TimeoutExpired):
                return False

        wait_until(up, timeout=10, what="redis up")  # redis-cli comes with redis-server

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _gateway(sim_url: str, redis_url: str, policy: str) -> GatewayProcess:
    config = single_pool_config(
        "vllm",
        [sim_url],
        redis={"url": redis_url},
        auth={"jwt": {"secret": SECRET}},
        limits={
            "tiers": {"default": {"requests_per_minute": 100000, "concurrent_requests": 100}},
            "on_redis_error": policy,
        },
        upstream={"health": {"interval_s": 3600}},
    )
    return GatewayProcess(config)


class Traffic:
    """Non-stop requests to one gateway from a thread; statuses counted per phase."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.phase = "before"
        self.seen: dict[str, Counter[int]] = {}
        self.sequence: dict[str, list[int]] = {}
        self.bodies: list[str] = []
        self.started: Counter[str] = Counter()  # requests sent, by phase
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        headers = bearer(token("alice"))
        with httpx.Client(base_url=self.base_url, timeout=10) as http:
            i = 0
            while not self._stop.is_set():
                phase = self.phase
                self.started[phase] += 1
                r = http.post("/v1/chat/completions", json=chat(i, stream=i % 2 == 0), headers=headers)
                self.seen.setdefault(phase, Counter())[r.status_code] += 1
                self.sequence.setdefault(phase, []).append(r.status_code)
                if r.status_code != 200:
                    self.bodies.append(r.text)
                i += 1

    def switch(self, phase: str) -> None:
        """Label the requests sent from now on `phase`, and return once one has been sent: the
        request in flight at the switch (labelled with the phase before) has had its answer. Without
        the wait, a "before" request admitted only after Redis had been stopped was refused (CI, on a
        loaded machine)."""
        self.phase = phase
        wait_until(lambda: self.started[phase] > 0, timeout=15, what=f"a request in phase {phase!r}")

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)
        assert not self._thread.is_alive(), "a request hung"


def _weight(gw: GatewayProcess, admin: dict[str, str]) -> float:
    pools = HTTP.get(gw.base_url + "/admin/pools", headers=admin, timeout=5).json()["pools"]
    return float(pools[0]["weight"])


def _pending(gw: GatewayProcess, admin: dict[str, str]) -> list[Any]:
    return list(HTTP.get(gw.base_url + "/admin/pools", headers=admin, timeout=5).json()["not_persisted"])


def _set_weight(gw: GatewayProcess, admin: dict[str, str], w: float) -> httpx.Response:
    return HTTP.put(gw.base_url + "/admin/pools/vllm/weight", json={"weight": w}, headers=admin, timeout=5)


def test_redis_stopped_and_restarted_under_traffic() -> None:
    redis = PersistentRedis()
    redis.start()
    admin = bearer(token("root", admin=True))
    try:
        sim = fast_sim("vllm")
        gw_open = _gateway(sim.base_url, redis.url, "fail_open")
        gw_closed = _gateway(sim.base_url, redis.url, "fail_closed")
        with sim, gw_open, gw_closed:
            pids = (gw_open.pid, gw_closed.pid)
            assert _set_weight(gw_open, admin, 0.25).status_code == 200
            wait_until(lambda: _weight(gw_closed, admin) == 0.25, timeout=3, what="weight shared")

            with Traffic(gw_open.base_url) as t_open, Traffic(gw_closed.base_url) as t_closed:
                for t in (t_open, t_closed):
                    wait_until(
                        lambda t=t: t.seen.get("before", Counter()).total() >= 5, what="traffic before"
                    )
                t_open.switch("down")
                t_closed.switch("down")
                redis.stop()
                # the outage is seen: the fail_closed replica refuses (and leaves the load balancer)
                wait_until(lambda: t_closed.seen.get("down", Counter())[503] > 0, what="the outage refused")
                wait_until(
                    lambda: t_open.seen.get("down", Counter()).total() >= 5, what="traffic in the outage"
                )

                # Shared admin state: the last known values; a weight applies on the replica asked,
                # marked as not persisted (tests/reliability/test_admin_outage.py has the rest).
                for gw in (gw_open, gw_closed):
                    assert _weight(gw, admin) == 0.25
                    r = _set_weight(gw, admin, 0.5)
                    assert r.status_code == 200 and r.json()["persisted"] is False, r.text
                    assert _weight(gw, admin) == 0.5
                    assert HTTP.get(gw.base_url + "/healthz", timeout=5).status_code == 200
                # Readiness: fail_open keeps serving (stays in the load balancer), fail_closed leaves it.
                assert HTTP.get(gw_open.base_url + "/readyz", timeout=5).status_code == 200
                assert HTTP.get(gw_closed.base_url + "/readyz", timeout=5).status_code == 503

                t_open.phase = t_closed.phase = "restarting"
                redis.start()
                wait_until(
                    lambda: HTTP.get(gw_closed.base_url + "/readyz", timeout=5).status_code == 200,
                    timeout=5,
                    what="readyz after Redis restart",
                )
                t_open.phase = t_closed.phase = "after"
                wait_until(
                    lambda: t_closed.seen.get("after", Counter())[200] >= 5, timeout=5, what="recovery"
                )

            # The outage's changes are written; one made after them reaches the other replica.
            for gw in (gw_open, gw_closed):
                wait_until(lambda gw=gw: _pending(gw, admin) == [], timeout=5, what="outage changes written")
            assert _set_weight(gw_closed, admin, 0.75).status_code == 200
            wait_until(lambda: _weight(gw_open, admin) == 0.75, timeout=3, what="weight shared again")
            assert (gw_open.pid, gw_closed.pid) == pids and all(
                g.proc is not None and g.proc.poll() is None for g in (gw_open, gw_closed)
            )

        print(f"\nredis outage: fail_open {dict(t_open.seen)}; fail_closed {dict(t_closed.seen)}")
        # fail_open never refused anybody; fail_closed refused only while Redis was away.
        for phase, counts in t_open.seen.items():
            assert set(counts) == {200}, (phase, counts, t_open.bodies[:3])
        assert set(t_closed.seen["before"]) == {200}
        assert set(t_closed.seen["down"]) == {503} or set(t_closed.seen["down"]) == {200, 503}
        assert t_closed.seen["down"][503] > 0
        assert t_closed.seen["after"][200] >= 5 and set(t_closed.seen["after"]) <= {200, 503}
        # Once recovered (the limiter's own probe saw Redis again), it stayed recovered.
        after = t_closed.sequence["after"]
        assert 503 not in after[after.index(200) :], after
        for body in t_closed.bodies:
            err: dict[str, Any] = httpx.Response(503, content=body).json()["error"]
            assert err["type"] == "server_error" and "Traceback" not in body and "redis://" not in body
    finally:
        redis.cleanup()
