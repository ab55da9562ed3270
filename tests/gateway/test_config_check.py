"""A config's errors as an operator reads them, from `gateway config check`, `gateway serve` and the
settings loader alike: file, line, key, and a suggestion for a near-miss key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.settings import ConfigError, load_settings

BROKEN = """\
server:
  port: eighty
models:
  - name: m
pools:
  - name: p
    dialct: vllm
    models: {m: m}
    backends:
      - {name: b, url: "http://127.0.0.1:1"}
limits:
  tiers:
    pro: {requests_per_minut: 5}
"""
GOOD = """\
models: [{name: m}]
pools: [{name: p, dialect: vllm, models: {m: m}, backends: [{name: b, url: "http://127.0.0.1:1"}]}]
"""


def problems(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_settings(path, environ={})
    return [str(p).removeprefix(f"{path}:") for p in raised.value.problems]


def test_every_error_has_its_line_key_and_a_suggestion(tmp_path: Path) -> None:
    assert problems(tmp_path, BROKEN) == [
        "2: server.port: Input should be a valid integer, unable to parse string as an integer",
        "6: pools[0].dialect: Field required",
        "7: pools[0].dialct: unknown key (did you mean 'dialect'?)",
        "13: limits.tiers.pro.requests_per_minut: unknown key (did you mean 'requests_per_minute'?)",
    ]


def test_an_unknown_key_far_from_any_lists_the_known_ones(tmp_path: Path) -> None:
    (line,) = problems(tmp_path, GOOD + "redis: {zzz: 1}\n")
    assert line.startswith("3: redis.zzz: unknown key (known keys: ") and "url" in line


def test_syntax_errors_and_unreadable_files(tmp_path: Path) -> None:
    (line,) = problems(tmp_path, "server: {port: 1\n")
    assert line.startswith("2: not valid YAML: ")
    with pytest.raises(ConfigError, match="No such file"):
        load_settings(tmp_path / "missing.yaml")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.processes
def test_config_check_and_version_on_the_command_line(tmp_path: Path) -> None:
    bad, good = tmp_path / "bad.yaml", tmp_path / "good.yaml"
    bad.write_text(BROKEN)
    good.write_text(GOOD)
    done = run("config", "check", str(bad), env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines()[0] == "gateway config check: the config has 4 errors:"
    assert f"  {bad}:7: pools[0].dialct: unknown key (did you mean 'dialect'?)" in done.stderr.splitlines()
    done = run("config", "check", str(good), env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{good}: ok: 1 model(s), 1 pool(s), 1 backend(s)")
    done = run("--version")
    assert done.returncode == 0 and done.stdout.startswith("gateway ") and len(done.stdout.split()) == 2
