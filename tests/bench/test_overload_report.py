"""bench/overload_report.py on made-up results: the verdicts, each missed on its own figure, and the
report's section, with flow on and without it."""

from __future__ import annotations

from typing import Any

import pytest

from bench.overload_report import OUTCOMES, overload_md, overload_verdicts


def point(load: float, flow: str, p99: float | None, goodput: float, ratios: tuple[float, float], lost: int = 0,
          replicas: int = 1, p50: float = 50.0) -> dict[str, Any]:  # fmt: skip
    batch = dict.fromkeys(OUTCOMES, 0) | {"served": 10, "503": 2, "lost": lost}
    return {
        "load": load, "flow": flow, "replicas": replicas, "runs": 3, "ttft_p50_ms": p50, "ttft_p90_ms": p99,
        "ttft_p99_ms": p99, "goodput_tps": goodput, "output_tps": goodput,
        "outcomes": {"interactive": dict.fromkeys(OUTCOMES, 0) | {"served": 100}, "batch": batch},
        "shares": {
            "docs-a": {"ratio": ratios[0], "backlogged": load > 1},
            "docs-b": {"ratio": ratios[1], "backlogged": load > 1},
        },
    }  # fmt: skip


def result(on: bool = True, on_p99: float = 300.0, on_ratios: tuple[float, float] = (0.95, 1.04),
           added_ms: float = 0.02, on_lost: int = 0) -> dict[str, Any]:  # fmt: skip
    pts = [
        point(0.5, "off", 250.0, 300.0, (1.0, 1.0)),
        point(1.5, "off", 4000.0, 250.0, (0.6, 1.4), lost=30),
        point(2.0, "off", None, 200.0, (0.5, 1.5), lost=90),
    ]
    if on:
        pts += [
            point(0.5, "on", 250.0, 300.0, (1.0, 1.0)),
            point(1.5, "on", on_p99, 400.0, on_ratios) | {"queued": 40, "queue_p50_ms": 350.0},
            point(2.0, "on", on_p99, 380.0, on_ratios, lost=on_lost),
            point(2.0, "on", on_p99, 380.0, on_ratios, replicas=2),
        ]
    probe = {"on_p50_us": [610.0] * 3, "off_p50_us": [590.0] * 3, "on_p50_ms": 0.61, "off_p50_ms": 0.59,
             "added_ms": added_ms} if on else None  # fmt: skip
    return {"points": pts, "probe": probe}


def verdicts(res: dict[str, Any]) -> dict[str, Any]:
    out = overload_verdicts(res)
    assert len(out) == 5
    keys = ("ttft", "share", "answered", "goodput", "added")
    return dict(zip(keys, out, strict=True))


def test_verdicts_all_met() -> None:
    v = verdicts(result())
    assert all(x.met is True for x in v.values())
    assert v["ttft"].measured == "on: 1.5× 1.20×, 2× 1.20× (of 250 ms); off: 1.5× 16.00×, 2× lost (of 250 ms)"
    # flow off's shares are in the section's table; the tenants not backlogged are not judged
    assert v["share"].measured == "1.5× docs-a -5 %, docs-b +4 %; 2× docs-a -5 %, docs-b +4 %"
    assert v["answered"].measured == "on: 0 of 448 lost or failed; off: 120 of 456 lost or failed"
    assert v["goodput"].measured == "on vs off: 1.5× 400 vs 250, 2× 380 vs 200 tok/s"
    assert v["added"].measured == "+0.020 ms (median of 3 paired rounds)"


@pytest.mark.parametrize(
    ("change", "missed"),
    [
        ({"on_p99": 400.0}, "ttft"),  # 1.6x the p99 at half load
        ({"on_p99": None}, "ttft"),  # lost at the p99
        ({"on_ratios": (0.85, 1.15)}, "share"),
        ({"on_lost": 1}, "answered"),  # one lost request, in one point
        ({"added_ms": 0.15}, "added"),
    ],
)
def test_each_verdict_misses_on_its_own_figure(change: dict[str, Any], missed: str) -> None:
    v = verdicts(result(**change))
    assert v[missed].met is False
    assert all(x.met is True for k, x in v.items() if k != missed)


def test_goodput_below_off_misses() -> None:
    res = result()
    for p in res["points"]:
        if p["flow"] == "on" and p["load"] == 2.0:
            p["goodput_tps"] = 150.0
    assert verdicts(res)["goodput"].met is False


def test_without_flow_control_every_verdict_is_not_measured_and_shows_off() -> None:
    v = verdicts(result(on=False))
    assert all(x.met is None for x in v.values())
    assert v["ttft"].measured == "flow on not measured; off: 1.5× 16.00×, 2× lost (of 250 ms)"
    assert v["share"].measured == v["goodput"].measured == "flow on not measured"
    assert v["answered"].measured == "flow on not measured; off: 120 of 456 lost or failed"
    assert v["added"].measured == "flow on not measured"


def test_share_verdict_with_nobody_backlogged_is_not_measured() -> None:
    res = result()
    for p in res["points"]:
        for s in p["shares"].values():
            s["backlogged"] = False
    v = verdicts(res)["share"]
    assert v.met is None
    assert v.measured == "1.5× none backlogged; 2× none backlogged"


#: what the section reads of a run besides its points
RUN = {
    "machine": {"date": "2026-01-02 03:04 UTC", "commit": "abc1234"}, "capacity": {"rps": 14.7},
    "elapsed_s": 450.0, "seeds": [1, 2, 3], "arrival_s": 10.0, "lost_grace_s": 1.0,
}  # fmt: skip


def test_section_has_a_line_per_point() -> None:
    lines = overload_md(result() | RUN)
    assert lines[2] == (
        "`--suite overload`, 2026-01-02 03:04 UTC, commit abc1234, 7.5 min; setup: bench/overload.py; capacity "
        "14.7 req/s; 10 s of arrivals a run; seeds 1, 2, 3 pooled; on ×2: two replicas sharing Redis, seed 1."
    )
    rows = [x for x in lines if x.startswith("| ") and "×" in x.split("|")[1]]
    assert len(rows) == 7
    table = "\n".join(rows)
    assert "| 2× | on ×2 |" in table
    assert "| 2× | off | 50/lost | docs-a 0.50, docs-b 1.50 | 110/0/2/90/0 | 0 | 200 |" in table
    assert "| 0.5× | on | 50/250 | — |" in table
    assert "| 1.5× | on | 50/300 | docs-a 0.95, docs-b 1.04 | 110/0/2/0/0 | 40 (350) | 400 |" in table
    assert rows[0] == "| 0.5× | off | 50/250 | — | 110/0/2/0/0 | 0 | 300 |"


def test_section_without_flow_control_says_what_was_not_measured() -> None:
    unavailable = {"unavailable": {"flow on": "the gateway under test has no flow control"}}
    lines = overload_md(result(on=False) | RUN | unavailable)
    assert "replicas" not in lines[2]
    assert lines[2].endswith(
        "seeds 1, 2, 3 pooled. Not measured: flow on (the gateway under test has no flow control)."
    )
    rows = [x for x in lines if x.startswith("| ") and "×" in x.split("|")[1]]
    assert [x.split("|")[2].strip() for x in rows] == ["off", "off", "off"]
