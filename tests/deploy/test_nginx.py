"""deploy/compose/nginx.conf, run for real (Debian's nginx) in front of two gateway processes on
loopback: the only change is the upstream addresses (compose's DNS name `gateway` → the two
loopback ports) and the listen address. Streams pass through unbuffered, both replicas take
traffic, and a killed replica is skipped without a failed request.

`make test` installs nginx (scripts/ensure-services.sh); where it is missing anyway, this module
fails — it is never skipped."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engines.sim.launcher import SimProcess
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.deploy.manifests import COMPOSE_DIR
from tests.support import HTTP, GatewayProcess, free_port, wait_until

pytestmark = pytest.mark.processes

NGINX = shutil.which("nginx") or (Path("/usr/sbin/nginx") if Path("/usr/sbin/nginx").exists() else None)
if NGINX is None:  # a failure, never a skip: `make test` installs nginx (scripts/ensure-services.sh)
    raise RuntimeError("nginx is not installed: run `make test` (it installs it) or apt-get install nginx")

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "count"}], "max_tokens": 1}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with fast_sim("vllm", "--itl-ms", "50") as s:  # 50 ms between tokens: buffering would show
        yield s


@pytest.fixture(scope="module")
def stack(sim: SimProcess) -> Iterator[tuple[str, list[GatewayProcess]]]:
    gateways = [GatewayProcess(single_pool_config("vllm", [sim.base_url])) for _ in range(2)]
    prefix = Path(tempfile.mkdtemp(prefix="nginx-test-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        for gw in gateways:
            gw.start()
        port = free_port()
        conf = (COMPOSE_DIR / "nginx.conf").read_text()
        servers = "\n".join(f"server 127.0.0.1:{g.port} max_fails=1 fail_timeout=5s;" for g in gateways)
        conf, n = re.subn(r"server gateway:8080 [^;]*;", servers, conf)
        assert n == 1
        conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{port};")
        (prefix / "logs").mkdir()
        (prefix / "nginx.conf").write_text(conf)
        check = subprocess.run(
            [str(NGINX), "-t", "-p", str(prefix), "-c", str(prefix / "nginx.conf")],
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert check.returncode == 0, check.stderr
        proc = subprocess.Popen(
            [str(NGINX), "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return HTTP.get(base + "/nginx-health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 10, what="nginx")
        yield base, gateways
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGQUIT)
            proc.wait(10)
        for gw in gateways:
            gw.stop()
        shutil.rmtree(prefix, ignore_errors=True)


def test_health_and_metrics_paths(stack: tuple[str, list[GatewayProcess]]) -> None:
    base, _ = stack
    assert HTTP.get(base + "/nginx-health", timeout=5).text == "ok\n"
    assert HTTP.get(base + "/metrics", timeout=5).status_code == 404


def test_streams_pass_through_unbuffered(stack: tuple[str, list[GatewayProcess]]) -> None:
    base, _ = stack
    body = {**BODY, "max_tokens": 20, "stream": True, "ignore_eos": True}
    t0 = time.monotonic()
    arrivals: list[float] = []
    with HTTP.stream("POST", base + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-gateway-pool"] == "vllm"
        text = ""
        for chunk in r.iter_text():
            arrivals.append(time.monotonic() - t0)
            text += chunk
    assert text.rstrip().endswith("data: [DONE]")
    # 20 tokens 50 ms apart arrive spread over the stream, not at its end. (nginx forwards like this
    # even with proxy_buffering on while the client keeps up; `proxy_buffering off`, which matters
    # for slow readers, is asserted in test_compose.py.)
    assert len(arrivals) >= 10
    assert arrivals[-1] - arrivals[0] >= 0.5


def test_both_replicas_serve_and_a_killed_one_is_skipped(stack: tuple[str, list[GatewayProcess]]) -> None:
    base, gateways = stack

    def served(gw: GatewayProcess) -> float:
        text = HTTP.get(gw.base_url + "/metrics", timeout=5).text
        return sum(
            float(v)
            for v in re.findall(r'^gateway_requests_total\{[^}]*status="200"[^}]*\} (\S+)$', text, re.M)
        )

    before = [served(g) for g in gateways]
    for _ in range(10):
        assert HTTP.post(base + "/v1/chat/completions", json=BODY, timeout=10).status_code == 200
    after = [served(g) for g in gateways]
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)

    assert gateways[0].proc is not None
    gateways[0].proc.kill()
    gateways[0].proc.wait(5)
    codes = [HTTP.post(base + "/v1/chat/completions", json=BODY, timeout=10).status_code for _ in range(20)]
    assert codes == [200] * 20
