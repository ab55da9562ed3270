"""How engine pools compare on the same traffic: latency histograms, their percentiles, and which
pool serves a traffic class better.

Pure (no clock, no I/O): the gateway records what each finished request cost into a `Series` per
model, pool and traffic class (gateway/flow/compare.py), adds the series of a window together, and
asks here what they say.

Histograms. A latency in seconds falls into bucket `floor(log2(x / HIST_BASE_S) * HIST_PER_DOUBLING)`
(clamped to 0 .. HIST_MAX_BUCKET): eight buckets per doubling from 0.1 ms to ~28 min. Counts are kept
sparse (`dict[bucket, count]`), so a series costs what its latencies spread over, not the range.
A percentile is the nearest-rank bucket's geometric middle: within ±4.4 % of the true value, and
the same on every replica, since the bucket boundaries are constants.

Verdicts. Two pools compare on a traffic class when both have at least `MIN_SAMPLES` of it. Errors
first: a pool whose error rate is `ERROR_GAP` or more above the other's serves it worse, however
fast. Then goodput, where requests carry a TTFT target (their priority class's) and both pools
have `MIN_SAMPLES` such streamed answers: the share that met it, when `TARGET_GAP` or more apart.
Otherwise TTFT p90: the lower one serves it better, by the ratio of the two. For a model as a whole
(`pair_verdict`), the classes both pools have enough of are weighed by their requests: the error
rates and target shares over them, then the weighted geometric mean of the per-class TTFT p90
ratios, so a pool is not favoured for serving only the easy classes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

#: the fastest latency told apart, seconds (0.1 ms); anything faster counts in bucket 0
HIST_BASE_S = 1e-4
#: buckets per doubling: a bucket's middle is within 2^(1/16) - 1 = 4.4 % of any value in it
HIST_PER_DOUBLING = 8
#: the last bucket (0.1 ms × 2^(192/8) ≈ 28 min at its top): slower latencies count there
HIST_MAX_BUCKET = 191
#: samples each of two pools needs in a traffic class before they are compared on it: a p90 of
#: 50 rests on its 5 slowest requests; fewer, and one slow request decides
MIN_SAMPLES = 50
#: an error rate this much above the other pool's (5 points) outweighs any latency advantage
ERROR_GAP = 0.05
#: a share of requests meeting their TTFT target this much above the other pool's (5 points) decides
#: before TTFT p90: the target is what the operator asked for; closer shares are within the noise
#: of a few hundred requests
TARGET_GAP = 0.05

Measure = Literal["error_rate", "ttft_target", "ttft_p90"]


def bucket_of(seconds: float) -> int:
    """The histogram bucket of a latency (see the module docstring)."""
    if seconds <= HIST_BASE_S:
        return 0
    index = int(math.log2(seconds / HIST_BASE_S) * HIST_PER_DOUBLING)
    return index if index < HIST_MAX_BUCKET else HIST_MAX_BUCKET


def bucket_value(index: int) -> float:
    """The latency a bucket stands for: its geometric middle, seconds."""
    value: float = HIST_BASE_S * math.pow(2.0, (index + 0.5) / HIST_PER_DOUBLING)
    return value


def percentile(counts: Mapping[int, int], q: float) -> float | None:
    """The `q` quantile (0 < q <= 1, nearest rank) of a histogram, seconds; None when it is empty."""
    total = 0
    for n in counts.values():
        total += n
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for index in sorted(counts):
        seen += counts[index]
        if seen >= rank:
            return bucket_value(index)
    return bucket_value(max(counts))  # pragma: no cover - the ranks add up to `total`


@dataclass(slots=True)
class Series:
    """What the requests of one model on one pool in one traffic class cost (one minute's, or a
    window's once added up): counts and sparse latency histograms."""

    requests: int = 0
    errors: int = 0
    output_tokens: int = 0
    #: time to first token of streamed answers, by bucket
    ttft: dict[int, int] = field(default_factory=dict)
    #: time per output token after the first, of streamed answers with two or more tokens
    tpot: dict[int, int] = field(default_factory=dict)
    #: streamed answers to requests with a TTFT target; of them, those that met it without failing,
    #: and their output tokens (goodput)
    targeted: int = 0
    met: int = 0
    good_tokens: int = 0

    def add(self, other: Series) -> None:
        """Count `other` in this series too."""
        self.requests += other.requests
        self.errors += other.errors
        self.output_tokens += other.output_tokens
        self.targeted += other.targeted
        self.met += other.met
        self.good_tokens += other.good_tokens
        _add_counts(self.ttft, other.ttft)
        _add_counts(self.tpot, other.tpot)


def _add_counts(into: dict[int, int], counts: Mapping[int, int]) -> None:
    for index, n in counts.items():
        into[index] = into.get(index, 0) + n


@dataclass(frozen=True, slots=True)
class Summary:
    """A series as figures: counts, error rate, percentiles (seconds; None without samples)."""

    requests: int
    errors: int
    output_tokens: int
    ttft_samples: int
    ttft_p50: float | None
    ttft_p90: float | None
    ttft_p99: float | None
    tpot_samples: int
    tpot_p50: float | None
    tpot_p90: float | None
    tpot_p99: float | None
    targeted: int = 0
    met: int = 0
    good_tokens: int = 0

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def target_met(self) -> float | None:
        """The share of the streamed answers with a TTFT target that met it; None without any."""
        return self.met / self.targeted if self.targeted else None


def summarize(series: Series) -> Summary:
    ttft, tpot = series.ttft, series.tpot
    return Summary(
        requests=series.requests,
        errors=series.errors,
        output_tokens=series.output_tokens,
        ttft_samples=sum(ttft.values()),
        ttft_p50=percentile(ttft, 0.5),
        ttft_p90=percentile(ttft, 0.9),
        ttft_p99=percentile(ttft, 0.99),
        tpot_samples=sum(tpot.values()),
        tpot_p50=percentile(tpot, 0.5),
        tpot_p90=percentile(tpot, 0.9),
        tpot_p99=percentile(tpot, 0.99),
        targeted=series.targeted,
        met=series.met,
        good_tokens=series.good_tokens,
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """`better` serves the traffic better than `worse`, by `measure`: their values (error rates,
    shares that met their TTFT target, or TTFT p90 seconds; for a model, the weighted figures) and
    `ratio`, how many times slower `worse` is (1.0 for the other measures). `classes` are the
    traffic classes it rests on."""

    better: str
    worse: str
    measure: Measure
    better_value: float
    worse_value: float
    ratio: float
    classes: tuple[str, ...]

    def why(self) -> str:
        """One line for an operator."""
        over = ", ".join(self.classes)
        if self.measure == "error_rate":
            return (
                f"{self.better}: error rate {self.better_value:.1%} against {self.worse}'s "
                f"{self.worse_value:.1%} ({over})"
            )
        if self.measure == "ttft_target":
            return (
                f"{self.better}: {self.better_value:.1%} met their TTFT target against {self.worse}'s "
                f"{self.worse_value:.1%} ({over})"
            )
        return (
            f"{self.better}: TTFT p90 {self.ratio:.2f}x lower than {self.worse}'s "
            f"({_ms(self.better_value)} against {_ms(self.worse_value)}; {over})"
        )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _enough(s: Summary) -> bool:
    return s.requests >= MIN_SAMPLES


def class_verdict(name_a: str, a: Summary, name_b: str, b: Summary, traffic_class: str) -> Verdict | None:
    """Which of two pools serves one traffic class better (module docstring); None while either
    has fewer than `MIN_SAMPLES` requests of it, or no measure tells them apart."""
    if not (_enough(a) and _enough(b)):
        return None
    classes = (traffic_class,)
    counted = _by_counts(name_a, _totals([a]), name_b, _totals([b]), classes)
    if counted is not None:
        return counted
    pa, pb = a.ttft_p90, b.ttft_p90
    if pa is None or pb is None or a.ttft_samples < MIN_SAMPLES or b.ttft_samples < MIN_SAMPLES:
        return None
    if pa <= pb:
        return Verdict(name_a, name_b, "ttft_p90", pa, pb, pb / pa, classes)
    return Verdict(name_b, name_a, "ttft_p90", pb, pa, pa / pb, classes)


def pair_verdict(
    name_a: str,
    a: Mapping[str, Summary],
    name_b: str,
    b: Mapping[str, Summary],
) -> Verdict | None:
    """Which of two pools serves a model's traffic better, over the traffic classes (the maps' keys)
    both have enough of, weighed by their requests (module docstring); None when they share no
    such class."""
    shared: list[str] = []
    for name in sorted(a):
        other = b.get(name)
        if other is not None and _enough(a[name]) and _enough(other):
            shared.append(name)
    if not shared:
        return None
    totals_a, totals_b = _totals(a[n] for n in shared), _totals(b[n] for n in shared)
    counted = _by_counts(name_a, totals_a, name_b, totals_b, tuple(shared))
    if counted is not None:
        return counted
    timed: list[str] = []
    weight = log_ratio = log_a = log_b = 0.0
    for name in shared:
        sa, sb = a[name], b[name]
        pa, pb = sa.ttft_p90, sb.ttft_p90
        if pa is None or pb is None or sa.ttft_samples < MIN_SAMPLES or sb.ttft_samples < MIN_SAMPLES:
            continue
        w = float(sa.requests + sb.requests)
        timed.append(name)
        weight += w
        log_a += w * math.log(pa)
        log_b += w * math.log(pb)
        log_ratio += w * (math.log(pb) - math.log(pa))
    if not timed:
        return None
    ratio = math.exp(log_ratio / weight)
    pa_mean, pb_mean = math.exp(log_a / weight), math.exp(log_b / weight)
    if ratio >= 1.0:
        return Verdict(name_a, name_b, "ttft_p90", pa_mean, pb_mean, ratio, tuple(timed))
    return Verdict(name_b, name_a, "ttft_p90", pb_mean, pa_mean, 1.0 / ratio, tuple(timed))


#: requests, errors, streamed answers with a TTFT target, of them those that met it
_Counts = tuple[int, int, int, int]


def _totals(summaries: Iterable[Summary]) -> _Counts:
    requests = errors = targeted = met = 0
    for s in summaries:
        requests += s.requests
        errors += s.errors
        targeted += s.targeted
        met += s.met
    return requests, errors, targeted, met


def _by_counts(name_a: str, a: _Counts, name_b: str, b: _Counts, classes: tuple[str, ...]) -> Verdict | None:
    """The verdict of the error rates, else of the shares that met their TTFT target (module
    docstring); None when neither tells the pools apart."""
    ea, eb = a[1] / a[0], b[1] / b[0]
    if abs(ea - eb) >= ERROR_GAP:
        if ea < eb:
            return Verdict(name_a, name_b, "error_rate", ea, eb, 1.0, classes)
        return Verdict(name_b, name_a, "error_rate", eb, ea, 1.0, classes)
    if a[2] < MIN_SAMPLES or b[2] < MIN_SAMPLES:
        return None
    ma, mb = a[3] / a[2], b[3] / b[2]
    if abs(ma - mb) < TARGET_GAP:
        return None
    if ma > mb:
        return Verdict(name_a, name_b, "ttft_target", ma, mb, 1.0, classes)
    return Verdict(name_b, name_a, "ttft_target", mb, ma, 1.0, classes)


def best_of(verdicts: Sequence[Verdict]) -> Verdict | None:
    """The most telling of several pairs' verdicts: an error-rate verdict before a TTFT-target one
    before a TTFT p90 one; the largest gap first, else the largest ratio; ties go to the first."""
    best: Verdict | None = None
    for v in verdicts:
        if best is None or _strength(v) > _strength(best):
            best = v
    return best


def _strength(v: Verdict) -> tuple[int, float]:
    if v.measure == "error_rate":
        return (2, v.worse_value - v.better_value)
    if v.measure == "ttft_target":
        return (1, v.better_value - v.worse_value)
    return (0, v.ratio)
