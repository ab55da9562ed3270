"""`gateway check` against the real vLLM and SGLang servers: a gateway started from a config in the
check's own process, every check run against the engine itself (tests/gateway/test_check.py has the
simulators' version, with each failure and its advice)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.real_engines.rig import ENGINE_KEY, ENGINE_KEY_ENV, real_pool_config
from tests.real_engines.servers import EngineServer

pytestmark = pytest.mark.timeout(300)  # the first test may wait for a server's startup


def test_the_check_reaches_the_real_engine(real_engine: EngineServer, tmp_path: Path) -> None:
    config = real_pool_config(real_engine.engine, [real_engine.base_url], real_engine.served_model_name)
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, ENGINE_KEY_ENV: ENGINE_KEY}
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert done.returncode in (0, 1), done.stderr
    row = next(line.split() for line in done.stdout.splitlines() if line.startswith(f"{real_engine.engine} "))
    assert row[:3] == [real_engine.engine, real_engine.engine, f"{real_engine.engine}-0"]
    # chat and stream with usage, JSON by its grammar, cached tokens (the suite's engines report them);
    # whether a random-weight model makes a valid tool call is the model's luck, not the check's
    chat, stream, _, _, json, cache = row[4:10]
    assert (chat, stream, json, cache) == ("ok", "ok", "ok", "ok"), done.stdout
