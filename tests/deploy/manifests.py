"""Readers for the deployment files: the repository's paths, multi-document YAML, the Dockerfile's
instructions by stage, `kubectl kustomize` renderings of the Kubernetes overlays, and the engines'
command lines as their containers would run them."""

from __future__ import annotations

import functools
import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_DIR = DEPLOY / "compose"
K8S = DEPLOY / "k8s"
OVERLAYS = ("sim", "gpu")


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())


def load_all(path: Path) -> list[Any]:
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def compose() -> dict[str, Any]:
    (doc,) = load_all(COMPOSE_DIR / "compose.yaml")
    assert isinstance(doc, dict)
    return doc


@functools.cache
def kustomize(overlay: str) -> tuple[dict[str, Any], ...]:
    """The rendered overlay, by `kubectl kustomize` (kustomize is built into kubectl, offline)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise RuntimeError("kubectl is not installed (it renders the Kustomize overlays; Debian: kubectl)")
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if out.returncode != 0:
        raise AssertionError(f"kubectl kustomize overlays/{overlay} failed:\n{out.stderr}")
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


#: the words before the flags in each engine's shipped command line
LAUNCHERS = {"vllm": ["vllm", "serve"], "sglang": ["python3", "-m", "sglang.launch_server"]}
#: `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?error}`, `${VAR?error}`
_COMPOSE_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")
_K8S_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def compose_interpolate(text: str, environ: Mapping[str, str]) -> str:
    """`text` as compose interpolates it from `environ` (a required variable that is unset raises)."""

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        value = environ.get(name)
        unset = value is None or (op.startswith(":") and value == "")
        if unset and op.endswith("?"):
            raise KeyError(f"compose needs {name}: {arg}")
        if unset and op.endswith("-"):
            return arg
        return value or ""

    return _COMPOSE_VAR.sub(one, text.replace("$$", "\0")).replace("\0", "$")


def engine_argv(source: str, engine: str, environ: Mapping[str, str]) -> list[str]:
    """`engine`'s command line in `source` ("compose": the gpu profile's service; "k8s": the gpu
    overlay's StatefulSet), its variables filled in from `environ` as compose, or the container's
    `$(VAR)` expansion from its env (a Secret's value from `environ`), would."""
    if source == "compose":
        service = compose()["services"][engine]
        words = [*service.get("entrypoint", []), *service["command"]]
        return [compose_interpolate(str(w), environ) for w in words]
    (container,) = by_kind(kustomize("gpu"), "StatefulSet")[engine]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", environ.get(e["name"])) for e in container.get("env", [])}

    def one(m: re.Match[str]) -> str:
        value = env.get(m.group(1))
        if value is None:  # Kubernetes would leave `$(VAR)` as it is
            raise KeyError(f"{engine} expands {m.group(0)}, which its env does not give")
        return value

    return [_K8S_VAR.sub(one, w) for w in [*container["command"], *container["args"]]]


def engine_flags(argv: list[str], engine: str) -> list[str]:
    """The flags after `engine`'s launcher."""
    launcher = LAUNCHERS[engine]
    assert argv[: len(launcher)] == launcher, argv
    return argv[len(launcher) :]


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of `flag` (`--flag value` or `--flag=value`), None when absent."""
    for i, word in enumerate(argv):
        if word == flag:
            return argv[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def by_kind(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_templates(docs: tuple[dict[str, Any], ...]) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
            yield f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]


# ------------------------------------------------------------------ Dockerfile


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, instruction: str) -> list[str]:
        return [arg for ins, arg in self.instructions if ins == instruction]


def dockerfile_stages(path: Path = ROOT / "Dockerfile") -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages). Continuation lines joined, comments and parser directives
    dropped; `${VAR}` in FROM resolved from the ARGs before the first FROM."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or not stripped:
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        rest = rest.strip()
        if instruction == "FROM":
            words = rest.split()
            base = words[0]
            for k, v in args.items():
                base = base.replace("${" + k + "}", v).replace("$" + k, v)
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif not stages:
            assert instruction == "ARG", f"{instruction} before the first FROM"
            key, _, value = rest.partition("=")
            args[key] = value
        else:
            stages[-1].instructions.append((instruction, rest))
    return args, stages


def exec_form(arg: str) -> list[str]:
    value = json.loads(arg)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), arg
    return value


def pip_commands(text: str) -> list[list[str]]:
    """Every `pip install …` in a shell text, as argument lists after `install`."""
    found: list[list[str]] = []
    for part in text.replace("&&", "\n").replace(";", "\n").splitlines():
        words = shlex.split(part.strip())
        for i, w in enumerate(words):
            if w.endswith("pip") and i + 1 < len(words) and words[i + 1] == "install":
                found.append(words[i + 2 :])
                break
    return found
