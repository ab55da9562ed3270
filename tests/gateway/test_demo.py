"""`gateway demo`, run as a user runs it: the banner's tokens work against both pools, its limits show
(the user token's `x-ratelimit-*` headers, the tight token's 429), and Ctrl-C or SIGTERM stops the
gateway and every simulator it started."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from engines.sim.launcher import free_port
from gateway.demo import MODEL
from tests.engines.sim.helpers import wav
from tests.support import HTTP, wait_until

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> set[int]:
    """PIDs whose parent is `pid` (from /proc)."""
    out: set[int] = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.add(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rpartition(")")[2].split()[0] != "Z"


class Demo:
    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.log = log_dir / "demo.log"
        self._out = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("GATEWAY_JWT_SECRET", None)
        env.pop("REDIS_URL", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "demo", "--port", str(self.port)],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
        )
        wait_until(lambda: "Ctrl-C" in self.text() or self.proc.poll() is not None, 60, what="the banner")
        assert self.proc.poll() is None, self.text()

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def token(self, label: str) -> str:
        match = re.search(rf"^\s*{label}\s+(\S+)$", self.text(), re.M)
        assert match, self.text()
        return match.group(1)

    def stop(self) -> None:
        """Ctrl-C, as a user stops it; SIGKILL (the demo and its simulators) if that does not do."""
        sims = _children(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for pid in sims:  # a SIGKILLed demo leaves its simulators behind (their parent is gone)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        self._out.close()


@pytest.fixture()
def demo(tmp_path: Path) -> Iterator[Demo]:
    d = Demo(tmp_path)
    try:
        yield d
    finally:
        d.stop()


def test_the_banner_tokens_answer_on_both_pools(demo: Demo) -> None:
    base = re.search(r"base URL\s+(\S+)", demo.text())
    assert base and base.group(1) == f"http://127.0.0.1:{demo.port}/v1"
    model = re.search(r"^\s*model\s+(\S+)\s+embeddings: (\S+)$", demo.text(), re.M)
    assert model
    user = OpenAI(base_url=base.group(1), api_key=demo.token("user token"), max_retries=0)
    admin = OpenAI(base_url=base.group(1), api_key=demo.token("admin token"), max_retries=0)
    wait_until(lambda: _ready(demo.port), READY_S, what="a healthy backend")
    console = re.search(r"^\s*console\s+(\S+)", demo.text(), re.M)
    assert console and console.group(1) == f"http://127.0.0.1:{demo.port}/admin/ui"
    assert HTTP.get(console.group(1), timeout=5).headers["content-type"].startswith("text/html")
    reply = user.chat.completions.create(model=model.group(1), messages=[{"role": "user", "content": "Hi"}])
    assert reply.choices[0].message.content
    for pool in ("vllm", "sglang"):
        raw = admin.chat.completions.with_raw_response.create(
            model=model.group(1),
            messages=[{"role": "user", "content": "Hi"}],
            extra_headers={"x-gateway-pool": pool},
        )
        assert raw.headers["x-gateway-pool"] == pool
        assert raw.parse().choices[0].message.content
    vectors = user.embeddings.create(model=model.group(2), input=["Hello!", "How are you?"])
    assert len(vectors.data) == 2 and vectors.data[0].embedding
    also = re.search(r"^\s*also\s+rerank and score: (\S+)\s+speech to text: (\S+)", demo.text(), re.M)
    assert also, demo.text()
    rerank = re.search(r"curl -s (\S+/v1/rerank) .*?-d '([^']+)'", demo.text(), re.S)
    assert rerank, demo.text()
    headers = {"authorization": f"Bearer {demo.token('user token')}"}
    ranked = HTTP.post(rerank.group(1), content=rerank.group(2), headers=headers, timeout=10)
    assert ranked.status_code == 200 and ranked.json()["results"][0]["index"] == 0
    heard = user.audio.transcriptions.create(model=also.group(2), file=("a.wav", wav(1.0)))
    assert heard.text
    # the post-deploy check passes on the demo, every chat backend checked
    url, admin_token = f"http://127.0.0.1:{demo.port}", demo.token("admin token")
    check = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check", "--url", url, "--admin-token", admin_token],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    for backend in ("vllm-0", "vllm-1", "sglang-0", "sglang-1"):
        assert re.search(rf"^\S+\s+\S+\s+{backend}\s+{model.group(1)}\s+ok\s+ok", check.stdout, re.M), (
            check.stdout
        )


#: the demo's simulators and gateway start beside the rest of the suite: on a machine loaded beyond
#: its cores their first health probes took over 30 s
READY_S = 90


def _ready(port: int) -> bool:
    try:
        return HTTP.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_stops_the_gateway_and_every_simulator(demo: Demo, sig: signal.Signals) -> None:
    sims = _children(demo.proc.pid)
    assert len(sims) == 10, demo.text()  # two chat simulators per dialect, one per side model each
    demo.proc.send_signal(sig)
    try:
        demo.proc.wait(30)
    except subprocess.TimeoutExpired:
        raise AssertionError(demo.text()) from None
    wait_until(lambda: not any(_alive(p) for p in sims), what="the simulators' exit with the demo's")


def test_the_demo_enforces_limits_and_reports_spend(demo: Demo) -> None:
    """The user token's tier shows in `x-ratelimit-*`; the tight token's 4th quick request is a 429;
    the banner's spend query answers with this process's own ledgers (the demo runs without Redis)."""
    banner = demo.text()
    assert "tier default: 60 requests/min, 100,000 tokens/min, 8 concurrent" in banner
    assert "tier tight:   3 requests/min" in banner and "the 4th quick request gets 429" in banner
    tight = re.search(r"tight token  tier tight: .*\n\s+(\S+)", banner)
    assert tight, banner
    base = f"http://127.0.0.1:{demo.port}"
    wait_until(lambda: _ready(demo.port), READY_S, what="a healthy backend")
    body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}
    user = {"authorization": f"Bearer {demo.token('user token')}"}
    r = HTTP.post(base + "/v1/chat/completions", json=body, headers=user)
    assert r.status_code == 200, r.text
    limits = (r.headers["x-ratelimit-limit-requests"], r.headers["x-ratelimit-limit-tokens"])
    assert limits == ("60", "100000")
    assert r.headers["x-ratelimit-remaining-requests"] == "59"
    statuses = []
    for _ in range(5):
        t = HTTP.post(
            base + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {tight.group(1)}"}
        )
        statuses.append(t.status_code)
    assert statuses == [200, 200, 200, 429, 429], statuses
    assert t.json()["error"]["code"] == "rate_limit_exceeded" and int(t.headers["retry-after"]) >= 1
    assert f"{base}/admin/spend?user=demo-user" in banner
    batch = re.search(r"batch token  tier batch: .*class batch.*\n\s+(\S+)", banner)
    assert batch, banner
    b = HTTP.post(
        base + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {batch.group(1)}"}
    )
    assert b.status_code == 200 and b.headers["x-ratelimit-limit-requests"] == "100000", b.text
    spend = HTTP.get(
        base + "/admin/spend",
        params={"user": "demo-user"},
        headers={"authorization": f"Bearer {demo.token('admin token')}"},
    ).json()
    assert spend["shared"] is False
    assert [(p["period"], p["requests"]) for p in spend["periods"]] == [("day", 1), ("month", 1)]
    assert spend["periods"][0]["usd"] > 0 and spend["periods"][0]["models"][MODEL]["requests"] == 1
