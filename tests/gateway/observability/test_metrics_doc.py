"""docs/metrics.md names every metric family the gateway defines, as Prometheus exposes it (counters
with `_total`), and no family the gateway does not define."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
_DEFINED = re.compile(r"\b(Counter|Gauge|Histogram)\(\s*\"(gateway_[a-z0-9_]+)\"")


def _families() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "gateway").rglob("*.py"):
        for kind, name in _DEFINED.findall(path.read_text(encoding="utf-8")):
            found.add(name + "_total" if kind == "Counter" else name)
    return found


def test_docs_list_every_metric_family_and_no_other() -> None:
    families = _families()
    assert len(families) > 30  # the scan found the definitions
    doc = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(gateway_[a-z0-9_]+)`", doc))
    assert families - named == set(), "families docs/metrics.md does not list"
    assert named - families == set(), "names docs/metrics.md lists that the gateway does not define"
