"""Engines started with `--api-key`: the gateway sends each its key, read from an environment
variable or a secret file, picks a rotated one up on reload, never shows it, and answers an engine's
refusal as the operator's error (502), not the client's."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from engines.sim.launcher import SimProcess
from gateway.admission.tokens import mint_token
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.reliability.support import metric
from tests.support import HTTP, GatewayProcess

pytestmark = pytest.mark.processes

SECRET = "engine-keys-suite-secret-" + "e" * 24
ADMIN = {"authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
KEY = "engine-key-0123456789"


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def sim(request: pytest.FixtureRequest) -> Iterator[SimProcess]:
    with fast_sim(request.param, "--api-key", KEY) as s:
        yield s


def config(sim: SimProcess, **pool: Any) -> dict[str, Any]:
    c = single_pool_config(sim.engine, [sim.base_url], auth={"jwt": {"secret": SECRET}})
    c["pools"][0].update(pool)
    return c


def chat(gw: GatewayProcess) -> httpx.Response:
    return HTTP.post(gw.base_url + "/v1/chat/completions", json=CHAT, headers=ADMIN, timeout=10)


def test_the_engine_gets_its_key_from_the_environment_and_it_is_never_shown(sim: SimProcess) -> None:
    unauthorized = HTTP.post(sim.base_url + "/v1/chat/completions", json={**CHAT, "model": "x"}, timeout=10)
    assert unauthorized.status_code == 401  # the engine does want a key
    with GatewayProcess(config(sim, api_key_env="ENGINE_KEY"), env={"ENGINE_KEY": KEY}) as gw:
        r = chat(gw)
        assert r.status_code == 200, r.text
        r = HTTP.post(
            gw.base_url + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=ADMIN, timeout=10
        )
        assert r.status_code == 200 and "[DONE]" in r.text
        assert HTTP.get(gw.base_url + "/readyz", timeout=5).status_code == 200
        shown = HTTP.get(gw.base_url + "/admin/pools", headers=ADMIN, timeout=5).text
        assert KEY not in shown and KEY not in gw.log()


def test_a_refused_key_is_a_502_for_the_operator_and_a_rotated_file_is_read_on_reload(
    sim: SimProcess, tmp_path: Path
) -> None:
    key_file = tmp_path / "engine-key"
    key_file.write_text("an-old-key\n")
    with GatewayProcess(config(sim, api_key_file=str(key_file))) as gw:
        r = chat(gw)
        assert r.status_code == 502, r.text
        error = r.json()["error"]
        assert error["type"] == "server_error" and error["code"] == "upstream_auth"
        assert sim.base_url not in r.text and "an-old-key" not in r.text
        assert "refuses the gateway's key" in gw.server_log()
        metrics = HTTP.get(gw.base_url + "/metrics", timeout=5).text
        assert metric(metrics, "gateway_upstream_errors_total", kind="engine_auth") >= 1
        key_file.write_text(KEY + "\n")  # the secret is rotated
        assert HTTP.post(gw.base_url + "/admin/reload", headers=ADMIN).status_code == 200
        assert chat(gw).status_code == 200


def test_a_key_source_that_is_missing_stops_the_gateway_before_it_starts(
    sim: SimProcess, tmp_path: Path
) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config(sim, api_key_env="NOT_SET_ANYWHERE")))
    env = {k: v for k, v in os.environ.items() if k != "NOT_SET_ANYWHERE"}
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 1
    assert "the environment variable NOT_SET_ANYWHERE (api_key_env) is not set" in done.stderr
