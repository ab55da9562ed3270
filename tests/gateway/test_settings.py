"""The settings: few enough to hold in one's head, and each one documented in docs/configuration.md
(`gateway.settings.setting_paths` is the list; the page's tables are checked against it both ways)."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.removed_settings import REMOVED
from gateway.settings import setting_paths

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
#: the most settings the gateway may have (each settings class's fields counted once)
BUDGET = 120

_HEADING = re.compile(r"^#{2,4} `([^`]+)`")
_ROW = re.compile(r"^\| *(`[^|]*)\|")


def documented(text: str) -> list[str]:
    """The settings the page's tables name: a heading's backticked path, then each row's backticked
    names (the first cell) below it, relative to that path."""
    prefix = ""
    out: list[str] = []
    for line in text.splitlines():
        heading = _HEADING.match(line)
        if heading:
            prefix = heading.group(1)
            continue
        row = _ROW.match(line)
        if row:
            out += [f"{prefix}.{name}" for name in re.findall(r"`([^`]+)`", row.group(1))]
    return out


def test_the_settings_stay_within_their_budget() -> None:
    assert len(setting_paths()) <= BUDGET


def test_every_setting_is_documented_and_every_documented_setting_exists() -> None:
    paths = setting_paths()
    rows = documented(PAGE.read_text(encoding="utf-8"))
    assert not sorted(set(paths) - set(rows)), "settings missing from docs/configuration.md"
    assert not sorted(set(rows) - set(paths)), "rows of docs/configuration.md that name no setting"
    assert len(rows) == len(set(rows)), "a setting documented twice"


def test_the_check_reads_headings_and_rows() -> None:
    page = (
        "## `a`\n| setting | default |\n|---|---|\n| `x`, `y` | `1` |\n### `a.b[]`\n| `z` | no `w` here |\n"
    )
    assert documented(page) == ["a.x", "a.y", "a.b[].z"]


def test_a_removed_setting_is_not_a_setting() -> None:
    assert not set(REMOVED) & set(setting_paths())
