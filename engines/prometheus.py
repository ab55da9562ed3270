"""A small, forgiving reader of the Prometheus text format, for the few engine gauges routing needs.

Only lines whose metric name is asked for are parsed; comments, unknown metrics, malformed lines,
`NaN` and infinities are skipped. Series of one metric are combined by the caller's choice (sum or
max), so multi-engine (data-parallel) servers are read correctly. A scrape of a real engine's
`/metrics` (a few hundred lines) takes well under a millisecond.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

Series = list[tuple[str, float]]  # (label text without braces, value)


def samples(text: str, names: Iterable[str]) -> dict[str, Series]:
    """The samples of the metrics named in `names`, by name. Never raises."""
    wanted = frozenset(names)
    firsts = tuple({n[0] for n in wanted if n})
    out: dict[str, Series] = {}
    for line in text.splitlines():
        if not line or not line.startswith(firsts):
            continue
        brace = line.find("{")
        if brace >= 0:
            name = line[:brace]
            close = line.rfind("}")
            if close < brace or name not in wanted:
                continue
            labels = line[brace + 1 : close]
            rest = line[close + 1 :]
        else:
            name, _, rest = line.partition(" ")
            if name not in wanted:
                continue
            labels = ""
        parts = rest.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        if math.isnan(value) or math.isinf(value):
            continue
        out.setdefault(name, []).append((labels, value))
    return out


def combine(
    series: Series | None, how: Callable[[list[float]], float], keep: str | None = None
) -> float | None:
    """`how` (sum, max…) over the values, keeping only series whose labels contain `keep` if given
    (or that have no such label at all)."""
    if not series:
        return None
    if keep is None:
        values = [v for _, v in series]
    else:
        label = keep.partition("=")[0] + "="
        values = [v for lab, v in series if keep in lab or label not in lab]
    return how(values) if values else None
