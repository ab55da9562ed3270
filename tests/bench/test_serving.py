"""bench/serving.py's figures, bench/tracerunner.py's reading of a stream, and the report's serving
table, on made-up records: no servers, no clocks."""

from __future__ import annotations

import itertools
import math

import orjson
import pytest

from bench.report import serving_md
from bench.serving import Sla, figures, percentile, tpot_s
from bench.tracerunner import EventClock
from policies.budgets import Price

SLA = Sla(ttft_ms=500, tpot_ms=50)
PRICE = Price.per_million(prompt=1.0, completion=4.0, cached_prompt=0.5)


def record(sent: float, ttft: float, total: float, tokens: int, usage: list[int] | None) -> dict[str, object]:
    gap = (total - ttft) / (tokens - 1) if tokens > 1 else 0.0
    out: dict[str, object] = {"sent": sent, "ttft": ttft, "total": total, "itl": [gap] * (tokens - 1)}
    out["tokens"] = tokens
    if usage is not None:
        out["usage"] = usage
    return out


def test_percentile_is_the_nearest_rank() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(101)), 99) == 99
    assert math.isnan(percentile([], 50))


def test_figures_of_a_run() -> None:
    records = [
        record(0.0, 0.2, 0.2 + 9 * 0.04, 10, [1000, 10, 600]),  # meets the SLA: TTFT 200, TPOT 40
        record(0.5, 0.8, 0.8 + 9 * 0.04, 10, [1000, 10, 0]),  # its first token too late
        record(1.0, 0.1, 0.1 + 9 * 0.08, 10, [1000, 10, 0]),  # its tokens too slow
        record(1.5, 0.3, 0.3, 1, [1000, 1, 0]),  # one token: judged by its TTFT alone
        {"sent": 2.0, "error": "ClientConnectionError"},  # not completed: not counted
    ]
    got = figures(records, SLA, PRICE)
    assert got["ttft_p50_ms"] == pytest.approx(300) and got["ttft_p99_ms"] == pytest.approx(800)
    assert tpot_s(records[3]) is None
    assert got["tpot_p50_ms"] == pytest.approx(40) and got["tpot_p99_ms"] == pytest.approx(80)
    assert got["itl_p50_ms"] == pytest.approx(40) and got["itl_p99_ms"] == pytest.approx(80)
    assert got["e2e_p99_ms"] == pytest.approx(1160)
    span = 1.0 + 0.1 + 9 * 0.08  # the first send to the last byte
    assert got["output_tps"] == pytest.approx(31 / span)
    assert got["goodput_rps"] == pytest.approx(2 / span) and got["goodput_share"] == 0.5
    # 4,000 prompt tokens (600 cached at half price) and 31 completion tokens, at $1 / $0.5 / $4 per M
    usd = (3400 * 1.0 + 600 * 0.5 + 31 * 4.0) / 1e6
    assert got["usd_per_mtok"] == pytest.approx(usd / 4031 * 1e6, rel=1e-6)


def test_tokens_come_from_the_usage_and_else_from_the_events() -> None:
    with_usage = record(0.0, 0.1, 0.5, 5, [10, 9, 0])  # the engine counted 9 tokens in 5 events
    assert tpot_s(with_usage) == pytest.approx(0.4 / 8)
    without = record(0.0, 0.1, 0.5, 5, None)
    assert tpot_s(without) == pytest.approx(0.1)
    assert math.isnan(figures([without], SLA, PRICE)["usd_per_mtok"])


def event(chunk: object) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def test_the_trace_client_times_token_events_and_reads_the_usage() -> None:
    role = event({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    token = event({"choices": [{"delta": {"content": "hi"}}]})
    thought = event({"choices": [{"delta": {"reasoning_content": "hm"}}]})
    usage = event({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3,
                                            "prompt_tokens_details": {"cached_tokens": 8}}})  # fmt: skip
    stream = role + token + thought + token + usage + b"data: [DONE]\n\n"
    # four reads, each ending inside an event: the token events complete in reads 1, 2 and 3
    cuts = [0, len(role) + 3, len(role + token) + 5, len(role + token + thought) + 2, len(stream)]
    clock = EventClock()
    for k, (a, b) in enumerate(itertools.pairwise(cuts)):
        clock.feed(stream[a:b], float(k))
    got = clock.record()
    assert got["tokens"] == 3 and got["usage"] == [12, 3, 8]
    assert got["itl"] == [1.0, 1.0]


def test_the_report_shows_ours_beside_its_baselines_goodput_and_cost() -> None:
    def row(router: str, load: float, goodput: float, cost: float) -> dict[str, object]:
        x: dict[str, object] = {
            f"{m}_p{q}_ms": 10.0 for m in ("ttft", "tpot", "itl", "e2e") for q in (50, 90, 99)
        }
        x.update(workload="shared_prefix", load=load, router=router, output_tps=123.0, goodput_rps=goodput,
                 goodput_share=goodput / 5, usd_per_mtok=cost)  # fmt: skip
        return x

    r = {
        "rows": [
            row("ours (prefix_affinity)", 0.5, 1.0, 0.5),  # not the highest load: left out
            row("ours (prefix_affinity)", 0.8, 4.5, 0.1234),
            row("ours (round_robin)", 0.8, 2.0, 0.1500),
            row("sglang-router cache_aware", 0.8, 3.0, 0.1400),  # not a verdict's baseline
        ],
        "serving": {
            "sla": {"ttft_ms": 500, "tpot_ms": 50},
            "price": {"prompt": 0.15, "cached_prompt": 0.075, "completion": 0.6},
            "sim_argv": {"vllm": ["--itl-ms", "40"], "sglang": ["--itl-ms", "40"]},
        },
        "machine": {"date": "today", "commit": "abc1234", "nproc": 2, "cpu": "a CPU", "python": "3.11"},
    }
    text = "\n".join(serving_md(r))
    (line,) = [x for x in text.splitlines() if x.startswith("| shared_prefix")]
    assert line.startswith("| shared_prefix | 80% | 10 / 10 / 10 |")
    assert "4.5 (90 %) vs 2.0 (40 %)" in line and "0.1234 vs 0.1500" in line
    assert "TTFT ≤ 500 ms and TPOT ≤ 50 ms" in text and "commit abc1234" in text
    assert "3.0" not in text and "0.5000" not in text
    assert serving_md({"rows": [{"workload": "uniform", "load": 0.8, "router": "x"}]}) == []
