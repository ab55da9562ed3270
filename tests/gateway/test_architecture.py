"""The house rules of `gateway/` (docs/architecture.md), checked on the source with `ast`.

    gateway/*.py            the root: wires the wings (app assembly, pipeline, settings, server, CLI, demo)
    gateway/<wing>/         one concern each; uses the ground floor, its own modules, `engines`, `policies`
    gateway/core/           the ground floor: shared types (context, responses, fleet, settings types)
                            and shared plumbing (Redis connection, task helpers); imports only itself

A wing may use another wing only through that wing's package interface (`from gateway.admission
import ApiKeys`, the names its `__init__` exports) and only where `SIDEWAYS` below allows it. Nothing
below the root imports the root, `engines` and `policies` never import `gateway`, and no import
circle exists anywhere in the three packages, counting imports inside functions and under
`TYPE_CHECKING`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: wing -> the other wings whose package interface it may import (the design's only sideways edges)
SIDEWAYS: dict[str, frozenset[str]] = {
    # the admin API creates, lists and revokes API keys (gateway/admission/__init__.py exports them)
    "control": frozenset({"admission"}),
}
GROUND = "core"


def module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(base: Path, package: str) -> dict[str, Path]:
    return {module_name(p, base): p for p in sorted((base / package).rglob("*.py"))}


def imports_of(path: Path, name: str, known: set[str]) -> list[tuple[str, int]]:
    """Every module of `known` that `path` imports (anywhere in the file), with the line number."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base_name = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base_name = node.module or ""
            # `from gateway.core import context` imports a module; `from gateway.x import Name` a name
            targets = [f"{base_name}.{a.name}" for a in node.names if f"{base_name}.{a.name}" in known]
            targets = targets or [base_name]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target:
                found.append((target, node.lineno))
    return found


def floor(name: str, packages: set[str]) -> str:
    """'root', 'core' or the wing's name, for a module of the gateway package."""
    parts = name.split(".")
    if len(parts) == 1 or (len(parts) == 2 and name not in packages):
        return "root"  # gateway/__init__.py and the modules beside it
    return parts[1]


def violations(base: Path) -> list[str]:
    """What breaks the house rules in the tree under `base` (a checkout); empty when all hold."""
    gw = modules(base, "gateway")
    others = {**modules(base, "engines"), **modules(base, "policies")}
    packages = {n for n, p in gw.items() if p.name == "__init__.py"}
    known = set(gw) | set(others)
    out: list[str] = []
    graph: dict[str, set[str]] = {n: set() for n in known}
    for name, path in others.items():
        for target, line in imports_of(path, name, known):
            if target in gw:
                out.append(f"{name}:{line} imports {target}: engines/ and policies/ never import gateway/")
            elif target != name:
                graph[name].add(target)
    for name, path in gw.items():
        here = floor(name, packages)
        for target, line in imports_of(path, name, known):
            if target == name:
                continue
            graph[name].add(target)
            if target not in gw:
                continue
            there = floor(target, packages)
            where = f"{name}:{line} imports {target}"
            if here == "root" or there == here:
                continue
            if there == "root":
                out.append(f"{where}: only the root may use the root (hand it in instead)")
            elif here == GROUND:
                out.append(f"{where}: the ground floor imports only itself")
            elif there == GROUND:
                continue
            elif there not in SIDEWAYS.get(here, frozenset()):
                out.append(f"{where}: wing {here!r} may not use wing {there!r}")
            elif target != f"gateway.{there}":
                out.append(f"{where}: use wing {there!r} through its interface (gateway.{there})")
    out.extend(f"import circle: {' -> '.join(c)}" for c in circles(graph))
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each as a closed path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append([*sorted(component), sorted(component)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_gateway_keeps_the_house_rules() -> None:
    assert violations(ROOT) == []


def test_every_wing_and_the_ground_floor_is_a_package_with_its_interface_documented() -> None:
    wings = [p for p in (ROOT / "gateway").iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert {w.name for w in wings} >= {"core", "edge", "admission", "upstream", "routing", "control"}
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for wing in wings:
        init = wing / "__init__.py"
        assert init.exists(), f"{wing} is not a package"
        assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), f"{init} has no docstring"
        for module in wing.glob("*.py"):
            if module.name != "__init__.py":
                assert f"{wing.name}/{module.name}" in doc, (
                    f"docs/architecture.md does not list {wing.name}/{module.name}"
                )


# -- the checker itself, on small trees that break one rule each -------------------------------------
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in {"engines/__init__.py": "", "policies/__init__.py": "", **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (  # the circle the flat tree had: the admin API imported the app, which imports it
            {
                "gateway/__init__.py": "",
                "gateway/app.py": "from gateway.admin import build\n",
                "gateway/admin.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway.app import Gateway\n",
            },
            "import circle: gateway.admin -> gateway.app -> gateway.admin",
        ),
        (
            {
                "gateway/__init__.py": "",
                "gateway/core/__init__.py": "",
                "gateway/core/context.py": "from gateway.upstream.fleet import Backend\n",
                "gateway/upstream/__init__.py": "",
                "gateway/upstream/fleet.py": "",
            },
            "the ground floor imports only itself",
        ),
        (
            {
                "gateway/__init__.py": "",
                "gateway/admission/__init__.py": "",
                "gateway/admission/limits.py": "from ..upstream import proxy\n",
                "gateway/upstream/__init__.py": "",
                "gateway/upstream/proxy.py": "",
            },
            "wing 'admission' may not use wing 'upstream'",
        ),
        (
            {
                "gateway/__init__.py": "",
                "gateway/control/__init__.py": "",
                "gateway/control/admin.py": "def f():\n    from gateway.admission.api_keys import ApiKeys\n",
                "gateway/admission/__init__.py": "",
                "gateway/admission/api_keys.py": "",
            },
            "use wing 'admission' through its interface (gateway.admission)",
        ),
        (
            {
                "gateway/__init__.py": "",
                "gateway/settings.py": "",
                "gateway/upstream/__init__.py": "",
                "gateway/upstream/proxy.py": "from gateway.settings import Settings\n",
            },
            "only the root may use the root",
        ),
        (
            {"gateway/__init__.py": "", "gateway/app.py": "", "policies/router.py": "import gateway.app\n"},
            "engines/ and policies/ never import gateway/",
        ),
        (  # the circle the simulator had: its engine builds the runs, a run imported the engine
            {
                "engines/sim/__init__.py": "",
                "engines/sim/engine.py": "from engines.sim.batch_runner import BatchRun\n",
                "engines/sim/batch_runner.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engines.sim.engine import Engine\n",
            },
            "import circle: engines.sim.batch_runner -> engines.sim.engine -> engines.sim.batch_runner",
        ),
        (
            {
                "policies/router.py": "def decide():\n    from . import features\n",
                "policies/features.py": "from policies.router import Decision\n",
            },
            "import circle: policies.features -> policies.router -> policies.features",
        ),
    ],
)
def test_the_checker_finds_each_kind_of_break(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    found = violations(_tree(tmp_path, files))
    assert any(expected in v for v in found), found


def test_the_checker_accepts_what_the_rules_allow(tmp_path: Path) -> None:
    files = {
        "gateway/__init__.py": "",
        "gateway/app.py": "from gateway.control.admin import build\nfrom gateway.core.context import C\n",
        "gateway/core/__init__.py": "",
        "gateway/core/context.py": "from engines.base import Usage\n",
        "gateway/control/__init__.py": "",
        "gateway/control/admin.py": "from gateway.admission import ApiKeys\nfrom gateway.core import context\n",
        "gateway/admission/__init__.py": "from gateway.admission.api_keys import ApiKeys\n",
        "gateway/admission/api_keys.py": "from .limits import x\n",
        "gateway/admission/limits.py": "",
    }
    assert violations(_tree(tmp_path, files)) == []
