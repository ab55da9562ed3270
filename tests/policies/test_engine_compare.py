"""Latency histograms, their percentiles, and which of two pools serves a traffic class better."""

from __future__ import annotations

import math

import pytest

from policies.engine_compare import (
    ERROR_GAP,
    HIST_BASE_S,
    HIST_MAX_BUCKET,
    MIN_SAMPLES,
    TARGET_GAP,
    Series,
    Summary,
    best_of,
    bucket_of,
    bucket_value,
    class_verdict,
    pair_verdict,
    percentile,
    summarize,
)

#: a bucket's middle is within 2^(1/16) - 1 of any value in it
WITHIN = 2 ** (1 / 16) - 1 + 1e-9


@pytest.mark.parametrize("seconds", [0.00015, 0.001, 0.0123, 0.2, 1.0, 7.5, 95.0])
def test_a_bucket_stands_for_its_values_within_four_and_a_half_percent(seconds: float) -> None:
    assert abs(bucket_value(bucket_of(seconds)) / seconds - 1) <= WITHIN


def test_buckets_are_clamped_at_both_ends() -> None:
    assert bucket_of(0.0) == bucket_of(HIST_BASE_S / 10) == 0
    assert bucket_of(1e9) == HIST_MAX_BUCKET
    assert bucket_of(0.01) < bucket_of(0.011) < bucket_of(0.1)


def histogram(values: list[float]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for v in values:
        counts[bucket_of(v)] = counts.get(bucket_of(v), 0) + 1
    return counts


def test_percentiles_are_the_nearest_rank_buckets() -> None:
    values = [0.001 * (i + 1) for i in range(100)]  # 1 ms .. 100 ms
    counts = histogram(values)
    for q, exact in ((0.5, 0.050), (0.9, 0.090), (0.99, 0.099), (1.0, 0.100)):
        got = percentile(counts, q)
        assert got is not None and abs(got / exact - 1) <= WITHIN, (q, got)
    assert percentile({}, 0.5) is None
    assert percentile({bucket_of(0.2): 1}, 0.01) == bucket_value(bucket_of(0.2))


def test_series_add_up_and_summarize() -> None:
    a = Series(requests=3, errors=1, output_tokens=30, ttft=histogram([0.01, 0.02]), tpot={})
    b = Series(requests=2, output_tokens=5, ttft=histogram([0.02]), tpot=histogram([0.005]))
    a.add(b)
    s = summarize(a)
    assert (s.requests, s.errors, s.output_tokens, s.ttft_samples, s.tpot_samples) == (5, 1, 35, 3, 1)
    assert s.error_rate == pytest.approx(0.2)
    assert s.ttft_p50 == bucket_value(bucket_of(0.02))
    assert s.tpot_p99 == bucket_value(bucket_of(0.005))
    empty = summarize(Series())
    assert empty.ttft_p90 is None and empty.error_rate == 0.0


def summary(
    requests: int, p90: float | None, errors: int = 0, timed: int | None = None, met: float | None = None
) -> Summary:
    """`met`: the share of the streamed answers that met their TTFT target (None: no target)."""
    timed = requests if timed is None else timed
    targeted = 0 if met is None else timed
    hits = round(targeted * (met or 0.0))
    return Summary(requests, errors, 0, timed, p90, p90, p90, 0, None, None, None, targeted, hits, hits * 10)


def test_the_faster_pool_serves_a_class_better_by_the_ratio_of_p90s() -> None:
    v = class_verdict("a", summary(60, 0.050), "b", summary(60, 0.010), "plain")
    assert v is not None
    assert (v.better, v.worse, v.measure, v.classes) == ("b", "a", "ttft_p90", ("plain",))
    assert v.ratio == pytest.approx(5.0)
    assert "5.00x lower" in v.why() and "10.0 ms against 50.0 ms" in v.why()


def test_errors_outweigh_speed() -> None:
    errors = int(60 * ERROR_GAP) + 1
    v = class_verdict("fast", summary(60, 0.01, errors=errors), "slow", summary(60, 0.1), "tools")
    assert v is not None and (v.better, v.measure) == ("slow", "error_rate")
    # below the gap, speed decides
    v = class_verdict("fast", summary(60, 0.01, errors=1), "slow", summary(60, 0.1), "tools")
    assert v is not None and (v.better, v.measure) == ("fast", "ttft_p90")


def test_no_verdict_below_the_minimum_samples() -> None:
    assert class_verdict("a", summary(MIN_SAMPLES - 1, 0.01), "b", summary(500, 0.1), "plain") is None
    # enough requests but too few streamed: no latency verdict
    assert class_verdict("a", summary(100, 0.01, timed=10), "b", summary(100, 0.1), "plain") is None


def test_a_models_verdict_weighs_the_shared_classes_by_requests() -> None:
    a = {"plain": summary(300, 0.010), "tools": summary(100, 0.040), "reasoning": summary(5, 9.0)}
    b = {"plain": summary(300, 0.020), "tools": summary(100, 0.020)}
    v = pair_verdict("a", a, "b", b)
    assert v is not None and v.classes == ("plain", "tools")  # reasoning: too few on a, none on b
    # plain favours a 2x on 600 requests, tools favours b 2x on 200: a by 2^((600-200)/800) = 2^0.5
    assert (v.better, v.worse) == ("a", "b")
    assert v.ratio == pytest.approx(math.sqrt(2))
    assert pair_verdict("a", {"plain": summary(10, 0.1)}, "b", {"plain": summary(100, 0.1)}) is None


def test_the_most_telling_verdict_of_several_pairs() -> None:
    slow = class_verdict("a", summary(60, 0.05), "c", summary(60, 0.5), "plain")
    close = class_verdict("a", summary(60, 0.05), "b", summary(60, 0.06), "plain")
    failing = class_verdict("a", summary(60, 0.05), "d", summary(60, 0.05, errors=30), "plain")
    assert slow is not None and close is not None and failing is not None
    assert best_of([close, slow]) is slow
    assert best_of([close, slow, failing]) is failing
    assert best_of([]) is None


def test_the_share_that_met_its_ttft_target_decides_before_ttft_p90() -> None:
    # a is faster at p90 but misses the target more often: its tail is where the target lies
    v = class_verdict("a", summary(100, 0.010, met=0.80), "b", summary(100, 0.020, met=0.95), "plain")
    assert v is not None
    assert (v.better, v.worse, v.measure) == ("b", "a", "ttft_target")
    assert (v.better_value, v.worse_value, v.ratio) == (0.95, 0.80, 1.0)
    assert v.why() == "b: 95.0% met their TTFT target against a's 80.0% (plain)"
    # shares closer than the gap: TTFT p90 decides
    close = 0.95 - TARGET_GAP / 2
    v = class_verdict("a", summary(100, 0.010, met=close), "b", summary(100, 0.020, met=0.95), "plain")
    assert v is not None and (v.better, v.measure) == ("a", "ttft_p90")
    # too few answers with a target on one pool: TTFT p90 decides
    few = summary(100, 0.010, timed=MIN_SAMPLES - 1, met=0.5)
    v = class_verdict("a", few, "b", summary(100, 0.020, met=0.95), "plain")
    assert v is None  # (and too few streamed answers for a p90 verdict as well)
    # errors still come first
    failing = summary(100, 0.020, errors=int(100 * ERROR_GAP) + 1, met=0.99)
    v = class_verdict("a", summary(100, 0.010, met=0.5), "b", failing, "plain")
    assert v is not None and (v.better, v.measure) == ("a", "error_rate")


def test_a_models_target_shares_add_up_over_the_shared_classes() -> None:
    a = {"plain": summary(300, 0.010, met=0.99), "tools": summary(100, 0.040, met=0.40)}
    b = {"plain": summary(300, 0.020, met=0.90), "tools": summary(100, 0.020, met=0.90)}
    v = pair_verdict("a", a, "b", b)
    # a: (297 + 40) / 400 = 84.25 %; b: (270 + 90) / 400 = 90 %
    assert v is not None and (v.better, v.measure, v.classes) == ("b", "ttft_target", ("plain", "tools"))
    assert (v.better_value, v.worse_value) == (pytest.approx(0.9), pytest.approx(0.8425))


def test_verdicts_rank_errors_then_target_shares_then_ttft_ratios() -> None:
    slow = class_verdict("a", summary(60, 0.05), "c", summary(60, 0.5), "plain")
    missing = class_verdict("a", summary(60, 0.05, met=0.9), "e", summary(60, 0.05, met=0.5), "plain")
    failing = class_verdict("a", summary(60, 0.05), "d", summary(60, 0.05, errors=30), "plain")
    assert slow is not None and missing is not None and failing is not None
    assert missing.measure == "ttft_target"
    assert best_of([slow, missing]) is missing
    assert best_of([slow, missing, failing]) is failing
