"""The compiled policies (`scripts/build_policies.py`, mypyc): built from the sources as they are, used
by this process unless `GATEWAY_POLICIES=python`, and deciding exactly as the sources do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import policies
import policies.prefix_affinity

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


def test_the_build_is_the_sources_and_is_in_use() -> None:
    assert policies.native_built(), "policies/_native/ is missing or older than the sources: `make native`"
    compiled = policies.prefix_affinity.__file__ or ""
    if os.environ.get("GATEWAY_POLICIES") == "python":
        assert not policies.NATIVE and compiled.endswith(".py")
    else:
        assert policies.NATIVE and compiled.endswith(".so"), compiled


def _replay(mode: str) -> str:
    """Two workloads of the replay (the real routers, two processes, KV events 5 ms late, the shared
    store), with every decision's reason counted, in a process whose policies are `mode`'s."""
    args = ["long_document_qa", "shared_prefix", "--load", "0.8", "--replicas", "2", "--seconds", "4"]
    args += ["--seeds", "1", "--events", "5", "--shared", "--reasons"]
    env = {**os.environ, "GATEWAY_POLICIES": mode}
    done = subprocess.run(
        [sys.executable, "-m", "bench.replay", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_compiled_and_source_policies_route_alike() -> None:
    native, python = _replay("native"), _replay("python")
    assert "affinity:hit" in native and "of oracle" in native
    assert native == python
