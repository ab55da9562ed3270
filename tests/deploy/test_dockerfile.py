"""The Dockerfile, read as instructions (Docker cannot build here): stages, a slim non-root runtime,
the health check, entrypoint and stop signal, the same pip install as `make test`, and a build
context (.dockerignore) that holds everything the COPY lines need."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gateway.settings import load_settings
from tests.deploy.manifests import ROOT, Stage, dockerfile_stages, exec_form, pip_commands
from tests.support import GatewayProcess, free_port

pytestmark = pytest.mark.processes

ARGS, STAGES = dockerfile_stages()
RUNTIME = STAGES[-1]
BUILDER = next(s for s in STAGES if s.name == "builder")


def _env(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for arg in stage.all("ENV"):
        for key, value in re.findall(r'(\w+)=("[^"]*"|\S+)', arg):
            env[key] = value.strip('"')
    return env


def test_multi_stage_with_a_slim_runtime() -> None:
    assert len(STAGES) >= 2
    assert RUNTIME.base.startswith("python:3.11") and RUNTIME.base.endswith("-slim"), RUNTIME.base
    assert BUILDER.base.startswith("python:3.11")
    # the runtime takes the installed venv from the builder and installs nothing itself
    assert any(c.startswith("--from=builder") for c in RUNTIME.all("COPY"))
    for run in RUNTIME.all("RUN"):
        assert not re.search(r"\b(apt-get|apk|pip|gcc|make|build-essential)\b", run), run


def test_runs_as_a_non_root_user() -> None:
    users = RUNTIME.all("USER")
    assert users, "the runtime stage sets no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    # numeric, so Kubernetes' runAsNonRoot can check it, and the k8s manifests use the same uid
    assert user.isdigit()
    deployment = (ROOT / "deploy/k8s/base/gateway-deployment.yaml").read_text()
    assert f"runAsUser: {user}" in deployment


def test_entrypoint_cmd_stopsignal_port() -> None:
    assert exec_form(RUNTIME.all("ENTRYPOINT")[-1]) == ["gateway"]
    assert exec_form(RUNTIME.all("CMD")[-1]) == ["serve", "--config", "/etc/gateway/gateway.yaml"]
    assert RUNTIME.all("STOPSIGNAL") == ["SIGTERM"]
    assert RUNTIME.all("EXPOSE") == ["8080"]


def test_environment_names_real_settings() -> None:
    """The image's GATEWAY_* variables override real fields of the config the image ships."""
    env = _env(RUNTIME)
    gateway_env = {k: v for k, v in env.items() if k.startswith("GATEWAY_")}
    assert {"GATEWAY_SERVER__HOST", "GATEWAY_SERVER__PORT", "GATEWAY_SERVER__WORKERS"} <= set(gateway_env)
    secret = {"GATEWAY_JWT_SECRET": "s" * 32}  # the operator's secret, which the image never carries
    settings = load_settings(ROOT / "deploy/gateway.example.yaml", environ={**gateway_env, **secret})
    assert settings.server.host == "0.0.0.0"
    assert settings.server.port == int(gateway_env["GATEWAY_SERVER__PORT"])
    assert settings.server.workers == int(gateway_env["GATEWAY_SERVER__WORKERS"])
    assert "/opt/venv/bin" in env["PATH"]


def _recipe(target: str) -> str:
    """The Makefile's recipe for `target` (its rule's line up to the next blank line)."""
    makefile = (ROOT / "Makefile").read_text()
    return makefile.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]


def test_pip_install_matches_the_makefile() -> None:
    """The image installs the project exactly as `make demo` does (the runtime install `make test`
    also runs), but not editable: same pyproject, same dependency resolution."""
    make_cmds = pip_commands(_recipe("$(RUNTIME)"))
    # (the builder's one other pip command installs mypy for the compiled policies: the test below)
    docker_cmds = [
        c for run in BUILDER.all("RUN") if "build_policies.py" not in run for c in pip_commands(run)
    ]
    assert len(make_cmds) == 2 and len(docker_cmds) == 2, (make_cmds, docker_cmds)

    def runtime_form(args: list[str]) -> list[str]:
        out = [a for a in args if a != "-e"]
        return [re.sub(r"^\.\[dev\]$", ".", a) for a in out]

    assert [runtime_form(c) for c in make_cmds] == docker_cmds
    assert docker_cmds[0][-2:] == ["--upgrade", "pip"] and docker_cmds[1][-1] == "."


def test_the_image_compiles_the_policies_as_make_native_does() -> None:
    """The builder compiles the installed `policies` with scripts/build_policies.py and the mypy the
    [dev] extra pins (the tools `make native` installs), uninstalls mypy and what it brought in the same
    layer, and checks the compiled router imports from the venv (not from /src's sources); the
    runtime requires the compiled modules (GATEWAY_POLICIES=native fails the import without them)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dev = pyproject["project"]["optional-dependencies"]["dev"]
    (mypy_pin,) = [d for d in dev if re.match(r"mypy\b", d)]
    runs = [run for run in BUILDER.all("RUN") if "build_policies.py" in run]
    assert len(runs) == 1, runs
    run = runs[0]
    (install,) = pip_commands(run)
    assert mypy_pin in install and any(a.startswith("setuptools") for a in install), install
    assert pip_commands(_recipe("$(NATIVE)")) == [install], "make native compiles with other tools"
    steps = [step.strip() for step in run.split("&&")]
    build = steps.index("/opt/venv/bin/python scripts/build_policies.py --installed")
    uninstall = next(i for i, step in enumerate(steps) if "pip uninstall" in step)
    assert build < uninstall and "mypy" in steps[uninstall].split()
    check = steps[-1]
    assert (
        check.startswith("GATEWAY_POLICIES=native /opt/venv/bin/python -I -c") and '.endswith(".so")' in check
    )
    assert any(c.split()[0] == "scripts/build_policies.py" for c in BUILDER.all("COPY"))
    assert _env(RUNTIME)["GATEWAY_POLICIES"] == "native"
    assert "--installed" in (ROOT / "scripts/build_policies.py").read_text()


def test_every_package_is_copied_and_data_files_are_declared() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]]
    copied = {c.split()[0] for c in BUILDER.all("COPY")}
    for package in packages:
        assert package in copied, f"the builder does not COPY the package {package}"
    # a non-editable install ships only .py files unless package data is declared: a .lua or .json
    # beside the code would work under `make test` (editable) and be missing in the image
    data = [
        p.relative_to(ROOT)
        for package in packages
        for p in (ROOT / package).rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc", ".pyi") and "__pycache__" not in p.parts
    ]
    declared = pyproject["tool"]["setuptools"].get("package-data")
    assert not data or declared, f"package data not declared in pyproject.toml: {data}"


def _pattern(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore semantics: the last matching pattern wins, `!` re-includes, and a pattern that
    matches a directory covers everything inside it."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _pattern(pattern.removeprefix("!").rstrip("/"))
        if any(regex.fullmatch(p) for p in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_what_copy_needs_and_nothing_else() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = [c.split()[0] for s in STAGES for c in s.all("COPY") if not c.startswith("--from")]
    assert sources
    for src in sources:
        path = src.rstrip("/")
        assert (ROOT / path).exists(), f"COPY {src}: no such file"
        assert not _ignored(path, patterns), f"COPY {src} is excluded by .dockerignore"
        if (ROOT / path).is_dir():
            for f in (ROOT / path).rglob("*.py"):
                if "__pycache__" not in f.parts:
                    assert not _ignored(str(f.relative_to(ROOT)), patterns), f
    for secretish in (".env", "deploy/compose/sim.env", "tests/support.py", ".venv/bin/python", ".git/HEAD"):
        assert _ignored(secretish, patterns), f"{secretish} would be sent to the Docker daemon"


def _healthcheck_argv() -> list[str]:
    (healthcheck,) = RUNTIME.all("HEALTHCHECK")
    options, _, command = healthcheck.partition("CMD ")
    assert "--interval" in options and "--timeout" in options
    argv = exec_form(command)
    assert "/healthz" in " ".join(argv)
    assert argv[0] == "python", "slim images have no curl: the check must use the image's python"
    return argv


def test_healthcheck_passes_against_a_live_gateway_and_fails_without_one() -> None:
    """The HEALTHCHECK command itself, run here against a real gateway on the port the image's
    environment names."""
    argv = [sys.executable, *_healthcheck_argv()[1:]]
    dead = subprocess.run(
        argv, env={**os.environ, "GATEWAY_SERVER__PORT": str(free_port())}, capture_output=True, timeout=20
    )
    assert dead.returncode != 0
    config = {
        "models": [{"name": "m"}],
        "pools": [{"name": "p", "dialect": "vllm", "models": {"m": "m"}, "backends": []}],
    }
    with GatewayProcess(config, ready=False) as gw:
        alive = subprocess.run(
            argv, env={**os.environ, "GATEWAY_SERVER__PORT": str(gw.port)}, capture_output=True, timeout=20
        )
        assert alive.returncode == 0, alive.stderr


@pytest.mark.parametrize("path", ["Dockerfile", ".dockerignore"])
def test_files_exist(path: str) -> None:
    assert (ROOT / path).is_file()
    assert Path(ROOT / path).read_text().strip()
