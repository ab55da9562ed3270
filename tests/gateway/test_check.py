"""`gateway check`: every pool and backend checked through the gateway, a table, and an exit status
that says whether the deploy works — against running gateways and simulators, and from a config."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from engines.sim.launcher import SimProcess
from gateway.admission.tokens import mint_token
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.support import GatewayProcess

pytestmark = pytest.mark.processes

SECRET = "check-suite-secret-" + "c" * 24
ADMIN = mint_token(SECRET, "ops", roles=["admin"])


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, SimProcess]]:
    with contextlib.ExitStack() as stack:
        yield {
            "good": stack.enter_context(fast_sim("vllm")),
            "no-tools": stack.enter_context(fast_sim("sglang", "--tool-call-parser", "")),
            "locked": stack.enter_context(fast_sim("vllm", "--api-key", "engine-key")),
        }


def rows(stdout: str) -> dict[str, list[str]]:
    """backend -> its cells (pool, engine, backend, model, chat, stream, reasoning, tools, json, cache, kv)."""
    return {
        line.split()[2]: line.split() for line in stdout.splitlines()[1:] if line and len(line.split()) == 11
    }


def test_a_healthy_fleet_passes_with_a_table_naming_each_pool_and_engine(sims: dict[str, SimProcess]) -> None:
    config = single_pool_config("vllm", [sims["good"].base_url], auth={"jwt": {"secret": SECRET}})
    with GatewayProcess(config) as gw:
        done = run("--url", gw.base_url, "--admin-token", ADMIN)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].split() == [
        "pool",
        "engine",
        "backend",
        "model",
        "chat",
        "stream",
        "reasoning",
        "tools",
        "json",
        "cache",
        "kv",
    ]
    assert rows(done.stdout)["vllm-0"] == [
        "vllm",
        "vllm",
        "vllm-0",
        MODEL,
        "ok",
        "ok",
        "warn",
        "ok",
        "ok",
        "ok",
        "-",
    ]


def test_each_failure_fails_the_check_and_says_what_to_fix(
    sims: dict[str, SimProcess], tmp_path: Path
) -> None:
    config = single_pool_config("sglang", [sims["no-tools"].base_url], auth={"jwt": {"secret": SECRET}})
    config["pools"].append(
        {
            "name": "locked",
            "dialect": "vllm",
            "models": {MODEL: "meta-llama/Llama-3.1-8B-Instruct"},
            "backends": [{"name": "locked-0", "url": sims["locked"].base_url}],
        }
    )
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    done = run("--config", str(path))  # a gateway of its own, started in the check's process
    assert done.returncode == 1, done.stdout + done.stderr
    table = rows(done.stdout)
    assert table["sglang-0"][7] == "FAIL" and table["sglang-0"][4] == "ok"
    assert table["locked-0"][4] == "FAIL"
    assert (
        "sglang/sglang-0 tools: the tool call stayed in the text: start vLLM with --enable-auto"
        in done.stdout
    )
    assert "locked/locked-0 chat: 502: the engine refuses the gateway's key" in done.stdout


def test_a_gateway_that_cannot_be_asked_is_exit_status_2() -> None:
    done = run("--url", "http://127.0.0.1:9", "--admin-token", ADMIN)
    assert done.returncode == 2 and "the gateway does not answer" in done.stderr
    done = run("--url", "http://127.0.0.1:9")
    assert done.returncode == 1 and "--admin-token" in done.stderr
