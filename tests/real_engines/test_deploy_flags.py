"""Every engine flag in the shipped deploy files (compose's gpu profile, the Kubernetes gpu overlay),
passed through the engines' own argument parsing at the versions the suite installs (parse_flags.py,
in each engine's environment; nothing is started): a flag the engine does not take, a value of the
wrong type, a parser or policy name it does not know fails here, not on a GPU fleet. The shipped
image tags are those versions. tests/deploy/ checks the same files' structure without the engines."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from tests.deploy.manifests import compose, compose_interpolate, engine_argv, engine_flags, kustomize
from tests.real_engines.servers import HERE, OFFLINE_ENV, engine_bin

pytestmark = [
    pytest.mark.processes,
    pytest.mark.timeout(300),
]  # two engine imports (~20-40 s each on a busy machine)

ENGINES = ("vllm", "sglang")
SOURCES = ("compose", "k8s")
#: the Secret's value, as compose and the Kubernetes container would fill it in
ENVIRON = {"ENGINE_API_KEY": "a-deploy-key"}
#: command lines the parsers must refuse, so that a pass above means something: (label, extra flags)
CONTROLS = {
    "vllm": {
        "an unknown flag": ["--no-such-flag"],
        "an unknown reasoning parser": ["--reasoning-parser", "no-such-parser"],
        "an unknown tool-call parser": ["--tool-call-parser", "no-such-parser"],
    },
    "sglang": {
        "an unknown flag": ["--no-such-flag"],
        "an unknown reasoning parser": ["--reasoning-parser", "no-such-parser"],
        "an unknown schedule policy": ["--schedule-policy", "no-such-policy"],
    },
}


def shipped(engine: str) -> dict[str, list[str]]:
    return {source: engine_flags(engine_argv(source, engine, ENVIRON), engine) for source in SOURCES}


@pytest.fixture(scope="module")
def parsed() -> dict[str, dict[str, Any]]:
    """Per engine: its version and a verdict per command line (the shipped ones and the controls,
    each control the compose line with its flags appended: argparse keeps the last value)."""
    runs: dict[str, tuple[subprocess.Popen[str], str]] = {}
    for engine in ENGINES:
        lines = shipped(engine)
        lines |= {label: [*lines["compose"], *extra] for label, extra in CONTROLS[engine].items()}
        proc = subprocess.Popen(
            [str(engine_bin(engine, "python")), str(HERE / "parse_flags.py"), engine],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **OFFLINE_ENV},
        )
        runs[engine] = (proc, json.dumps(lines))
    out: dict[str, dict[str, Any]] = {}
    for engine, (proc, lines) in runs.items():  # both engines import at once
        stdout, stderr = proc.communicate(lines, timeout=240)
        assert proc.returncode == 0, f"parse_flags.py {engine} failed:\n{stderr[-3000:]}"
        out[engine] = json.loads(stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("source", SOURCES)
def test_the_engine_accepts_every_shipped_flag(parsed: dict[str, Any], engine: str, source: str) -> None:
    verdict = parsed[engine]["results"][source]
    assert verdict["ok"], f"{engine} refuses the flags of {source}: {verdict['error']}"


@pytest.mark.parametrize("engine", ENGINES)
def test_the_check_refuses_what_the_engine_refuses(parsed: dict[str, Any], engine: str) -> None:
    for label in CONTROLS[engine]:
        verdict = parsed[engine]["results"][label]
        assert not verdict["ok"], f"{engine} took {label}"
        assert "no-such" in verdict["error"], verdict["error"]


def test_the_images_are_the_versions_the_suite_runs(parsed: dict[str, Any]) -> None:
    services = compose()["services"]
    statefulsets = {d["metadata"]["name"]: d for d in kustomize("gpu") if d["kind"] == "StatefulSet"}
    for engine in ENGINES:
        version = "v" + parsed[engine]["version"].split("+")[0]  # vLLM's CPU build says 0.32.0+cpu
        image = compose_interpolate(services[engine]["image"], {})  # its default tag
        assert image.rsplit(":", 1)[1] == version, image
        (container,) = statefulsets[engine]["spec"]["template"]["spec"]["containers"]
        assert container["image"].rsplit(":", 1)[1] == version, container["image"]
