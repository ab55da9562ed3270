"""scripts/lint_docs.py, the rule `make lint` applies to the whole tree: no development-process words
in a tracked file, no page of the manual over its budget. The samples below are assembled from parts,
as the script's own patterns are, so that this file passes the rule it tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lint_docs", ROOT / "scripts" / "lint_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["lint_docs"] = module
    spec.loader.exec_module(module)
    return module


lint = _load()


def _tree(tmp_path: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return tmp_path


def test_the_tree_keeps_the_rule() -> None:
    assert lint.problems(ROOT) == []


@pytest.mark.parametrize(
    "line",
    [
        "as measured at " + "sto" + "p 47",
        "Review of " + "sto" + "ps 45-46",
        "see " + "Iss" + "ue #18",
        "in " + "pha" + "se C of the work",
        "(" + "fif" + "th " + "ses" + "sion)",
        "the next " + "ses" + "sion will",
        "Tex" + "t only",
        "tried and " + "not " + "kept",
        "the " + "scr" + "atch model read 2,718",
    ],
)
def test_each_diary_pattern_is_found_in_any_text_file(tmp_path: Path, line: str) -> None:
    root = _tree(tmp_path, {"gateway/x.py": f"# fine\n# {line}\n"})
    (found,) = lint.problems(root)
    assert found.startswith("gateway/x.py:2: ")


@pytest.mark.parametrize(
    "line",
    [
        "a stop event",
        "the issue tracker",
        "phase E",
        "a user's session ends",
        "the first sessions",
        "plain text, only",
        "kept, not deleted",
        "scratch space",
    ],
)
def test_product_words_pass(tmp_path: Path, line: str) -> None:
    assert lint.problems(_tree(tmp_path, {"docs/a.md": line + "\n"})) == []


def test_binary_files_are_not_read(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"bench/plots/a.png": b"\x89PNG\0\0" + ("sto" + "p 4").encode()})
    assert lint.problems(root) == []


def test_pages_over_their_budgets_fail(tmp_path: Path) -> None:
    kib = b"x" * 1024
    root = _tree(
        tmp_path,
        {
            "docs/big.md": kib * 31,
            "docs/ok.md": kib * 30,
            **{f"docs/part{i}.md": kib * 30 for i in range(3)},
            "README.md": kib * 9,
            "CONTRIBUTING.md": kib * 4,
            "bench/BENCHMARKS.md": kib * 41,
            "bench/other.md": kib * 50,
        },
    )
    found = lint.problems(root)
    assert [line.split(":")[0] for line in found] == [
        "docs/big.md",
        "docs/",
        "README.md",
        "bench/BENCHMARKS.md",
    ]


def test_main_prints_each_problem_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(tmp_path, {"a.txt": "sto" + "p 3 and " + "sto" + "p 4\n"})
    assert lint.main([str(root)]) == 1
    assert capsys.readouterr().out.count("a.txt:1:") == 2
    assert lint.main([str(_tree(tmp_path / "clean", {"a.txt": "fine\n"}))]) == 0
