"""The routing suite's verdicts: the TTFT ratios are taken over every round of the two routers
they compare, pooled, and fall back to the single round when a run has no repeats (quick mode)."""

from __future__ import annotations

from typing import Any

from bench.routing import pool_rounds
from bench.verdicts import compared, routing_verdicts

OURS, RR, LL = "ours (prefix_affinity)", "ours (round_robin)", "ours (least_load)"


def _row(workload: str, router: str, p99: float, hit: float = 0.97) -> dict[str, Any]:
    return {"workload": workload, "load": 0.5, "router": router, "ttft_p99_ms": p99, "hit_vs_oracle": hit}


def _verdict(verdicts: list[Any], text: str) -> Any:
    (v,) = [v for v in verdicts if text in v.target]
    return v


def test_compared_pairs() -> None:
    assert compared("multi_turn_chat") == (OURS, RR)
    assert compared("uniform") == (OURS, LL)


def test_pool_rounds_pools_first_tokens_and_keeps_each_round() -> None:
    samples = {
        ("multi_turn_chat", 0.5, OURS): [
            ([float(i) for i in range(100)], 0.96),
            ([float(i) for i in range(100, 200)], 0.94),
        ],
        ("multi_turn_chat", 0.5, RR): [([1.0] * 10, 0.6)],
        ("multi_turn_chat", 0.5, "sglang-router cache_aware"): [([1.0], 0.9)],  # not compared: left out
    }
    reps = {x["router"]: x for x in pool_rounds(samples)}
    assert set(reps) == {OURS, RR}
    ours = reps[OURS]
    assert ours["rounds"] == 2
    assert ours["ttft_p99_ms"] == 197.0  # the p99 of the 200 pooled first tokens, not of either round
    assert ours["ttft_p99_ms_each"] == [98.0, 198.0]
    assert ours["hit_vs_oracle_each"] == [0.96, 0.94]


def test_verdict_uses_the_pooled_rounds_and_names_each_round() -> None:
    result = {
        "workloads": ["multi_turn_chat"],
        # round 0 alone would miss (0.52x) ...
        "rows": [_row("multi_turn_chat", OURS, 520.0), _row("multi_turn_chat", RR, 1000.0, 0.6)],
        # ... the three rounds pooled meet it
        "repeats": [
            {"workload": "multi_turn_chat", "load": 0.5, "router": OURS, "rounds": 3, "ttft_p99_ms": 450.0,
             "ttft_p99_ms_each": [520.0, 400.0, 430.0], "hit_vs_oracle_each": [0.97, 0.90, 0.91]},
            {"workload": "multi_turn_chat", "load": 0.5, "router": RR, "rounds": 3, "ttft_p99_ms": 1000.0,
             "ttft_p99_ms_each": [1000.0, 800.0, 1100.0], "hit_vs_oracle_each": [0.6, 0.6, 0.6]},
        ],
    }  # fmt: skip
    verdicts = routing_verdicts(result)
    ttft = _verdict(verdicts, "multi_turn_chat @ 50%: TTFT p99")
    assert ttft.met is True
    assert ttft.measured == "0.45× (3 rounds pooled; each round 0.52, 0.50, 0.39)"
    hit = _verdict(verdicts, "multi_turn_chat: hit rate")
    assert hit.met is False  # the mean of the rounds, 92.7 %, not round 0's 97 %
    assert hit.measured == "93% (worst load)"


def test_verdict_without_repeats_uses_the_row() -> None:
    result = {
        "workloads": ["shared_prefix", "uniform"],
        "rows": [
            _row("shared_prefix", OURS, 530.0),
            _row("shared_prefix", RR, 1000.0, 0.3),
            _row("uniform", OURS, 100.0),
            _row("uniform", LL, 100.0),
        ],
    }
    verdicts = routing_verdicts(result)
    ttft = _verdict(verdicts, "shared_prefix @ 50%: TTFT p99")
    assert (ttft.met, ttft.measured) == (False, "0.53×")
    uniform = _verdict(verdicts, "uniform @ 50%")
    assert (uniform.met, uniform.measured) == (True, "1.00× least-load")
