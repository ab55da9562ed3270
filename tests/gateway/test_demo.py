"""`gateway demo` as a user runs it: a real process (four simulators and a gateway), its banner, its
limits — the user token's `x-ratelimit-*` headers, the tight token's 429 — and Ctrl-C stopping it all."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx

from engines.sim.launcher import free_port, port_open
from gateway.demo import MODEL
from tests.support import wait_until


def test_demo_banner_tokens_and_limits() -> None:
    port = free_port()
    env = {**os.environ, "GATEWAY_JWT_SECRET": "demo-test-secret-" + "d" * 40}
    env.pop("REDIS_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "demo", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    assert proc.stdout is not None
    out = b""
    try:
        deadline = time.monotonic() + 60
        while b"Ctrl-C stops everything" not in out:
            assert time.monotonic() < deadline and proc.poll() is None, out.decode(errors="replace")
            out += proc.stdout.readline()
        banner = out.decode()
        user = re.search(r"user token\s+(\S+)", banner)
        tight = re.search(r"tight token  tier tight: .*\n\s+(\S+)", banner)
        assert user and tight, banner
        assert "tier default: 60 requests/min, 100,000 tokens/min, 8 concurrent" in banner
        assert "tier tight:   3 requests/min" in banner and "the 4th quick request gets 429" in banner
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: port_open("127.0.0.1", port), 30, what="the demo gateway")
        wait_until(lambda: httpx.get(base + "/readyz", timeout=2).status_code == 200, 30, what="ready")
        body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}
        r = httpx.post(
            base + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {user.group(1)}"}
        )
        assert r.status_code == 200, r.text
        assert (r.headers["x-ratelimit-limit-requests"], r.headers["x-ratelimit-limit-tokens"]) == (
            "60",
            "100000",
        )
        assert r.headers["x-ratelimit-remaining-requests"] == "59"
        statuses = []
        for _ in range(5):
            t = httpx.post(
                base + "/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {tight.group(1)}"},
            )
            statuses.append(t.status_code)
        assert statuses == [200, 200, 200, 429, 429], statuses
        assert t.json()["error"]["code"] == "rate_limit_exceeded" and int(t.headers["retry-after"]) >= 1
        # the banner's spend query: this process's own ledgers (the demo runs without Redis)
        admin = re.search(r"admin token\s+(\S+)", banner)
        assert admin and f"{base}/admin/spend?user=demo-user" in banner
        spend = httpx.get(
            base + "/admin/spend",
            params={"user": "demo-user"},
            headers={"authorization": f"Bearer {admin.group(1)}"},
        ).json()
        assert spend["shared"] is False
        assert [(p["period"], p["requests"]) for p in spend["periods"]] == [("day", 1), ("month", 1)]
        assert spend["periods"][0]["usd"] > 0 and spend["periods"][0]["models"][MODEL]["requests"] == 1
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
            raise
    assert not port_open("127.0.0.1", port)
