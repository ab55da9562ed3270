#!/usr/bin/env python3
"""Keeps the tree a product, not a lab notebook: `make lint` runs this.

    python scripts/lint_docs.py [ROOT]

Fails (exit 1, one line a problem) on
- development-process words in any git-tracked text file: a work item's number ("stop" or "issue"
  with a number), a plan's phase letter, an ordinal work session, and the notes of unfinished
  experiments (see `PATTERNS`): the history of the work belongs in git, not in the tree;
- a page of the manual over its budget (`BUDGETS`): docs/ pages, docs/ in all, README.md,
  CONTRIBUTING.md and the generated bench/BENCHMARKS.md.

Standard library only. The patterns are assembled from parts so that this file does not match them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

KIB = 1024


def _words(*parts: str) -> str:
    return "".join(parts)


#: the diary patterns, matched case-insensitively
PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        _words(r"\bsto", r"ps? [0-9]+\b"),
        _words(r"\biss", r"ue #[0-9]+"),
        _words(r"\bpha", r"se [A-D]\b"),
        _words(r"\b(first|second|third|fourth|fifth|last|next) ", r"sess", r"ion\b"),
        _words(r"\bText ", r"only\b"),
        _words(r"\bnot ", r"kept\b"),
        _words(r"\bscr", r"atch (model|switch|A/B|run)"),
    )
)

#: (what, the most bytes it may hold)
PAGE_BUDGET = 30 * KIB
BUDGETS: dict[str, int] = {
    "docs/": 150 * KIB,
    "README.md": 8 * KIB,
    "CONTRIBUTING.md": 4 * KIB,
    "bench/BENCHMARKS.md": 40 * KIB,
}


def tracked(root: Path) -> list[str]:
    """The files git tracks under `root`, relative to it (every file, outside dot-directories, when
    `root` is no git work tree)."""
    p = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=False)
    if p.returncode == 0:
        return [f for f in p.stdout.decode().split("\0") if f]
    return sorted(
        str(f.relative_to(root))
        for f in root.rglob("*")
        if f.is_file() and not any(part.startswith(".") for part in f.relative_to(root).parts)
    )


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def diary(root: Path, files: Iterable[str]) -> list[str]:
    """`path:line: "match"` for every diary pattern found in the text files among `files`."""
    out: list[str] = []
    for name in files:
        path = root / name
        if not path.is_file():  # deleted in the work tree, not yet in the index
            continue
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for pattern in PATTERNS:
                for m in pattern.finditer(line):
                    out.append(f'{name}:{number}: "{m.group(0)}": development-process words')
    return out


def sizes(root: Path, files: Iterable[str]) -> list[str]:
    """Every budget of `BUDGETS` and `PAGE_BUDGET` that the files exceed."""
    out: list[str] = []
    present = [f for f in files if (root / f).is_file()]
    docs = [f for f in present if f.startswith("docs/")]
    for f in docs:
        size = (root / f).stat().st_size
        if f.endswith(".md") and size > PAGE_BUDGET:
            out.append(f"{f}: {size:,} bytes, over the {PAGE_BUDGET // KIB} KiB a docs page may hold")
    total = sum((root / f).stat().st_size for f in docs)
    if total > BUDGETS["docs/"]:
        out.append(f"docs/: {total:,} bytes in all, over its {BUDGETS['docs/'] // KIB} KiB")
    for f, budget in BUDGETS.items():
        if f != "docs/" and f in present and (size := (root / f).stat().st_size) > budget:
            out.append(f"{f}: {size:,} bytes, over its {budget // KIB} KiB")
    return out


def problems(root: Path) -> list[str]:
    files = tracked(root)
    return diary(root, files) + sizes(root, files)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else Path(__file__).resolve().parent.parent
    found = problems(root)
    for line in found:
        print(line)
    if found:
        print(f"lint_docs: {len(found)} problem(s)", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
