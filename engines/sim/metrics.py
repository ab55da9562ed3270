"""The engines' own Prometheus metrics, with their real names and labels.

Values are plain numbers: prefix-cache queries and hits are counted when a request is admitted
(`admitted`, as the engines count them when they schedule it), the rest once per finished request
(`observe`; a histogram is a list of bucket counts found with `bisect`); the Prometheus families are
built only when `/metrics` is scraped, by a custom collector. That keeps `prometheus_client` off the
request path. Gauges (running, waiting, KV usage) and the preemption counter are read from live state at
scrape time. Inter-token latency is observed once per request with that request's mean gap, weighted by
its number of gaps.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from engines.sim.config import SimConfig

_LAT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 1.0)


@dataclass(frozen=True, slots=True)
class LiveGauges:
    """Callbacks returning the current value of each live gauge."""

    running: Callable[[], float]
    waiting: Callable[[], float]
    kv_usage: Callable[[], float]
    preemptions: Callable[[], float] = lambda: 0.0


class Hist:
    """A cumulative-on-export histogram: per-bucket counts and a sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        """Count `value` `times` times."""
        self.counts[bisect_left(self.bounds, value)] += times
        self.total += value * times

    def family(self, name: str, doc: str, labels: dict[str, str]) -> HistogramMetricFamily:
        """The Prometheus family (`_bucket`, `_count`, `_sum`)."""
        fam = HistogramMetricFamily(name, doc, labels=list(labels))
        acc = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip(self.bounds, self.counts, strict=False):
            acc += count
            buckets.append((repr(float(bound)), acc))
        buckets.append(("+Inf", acc + self.counts[-1]))
        fam.add_metric(list(labels.values()), buckets, self.total)
        return fam


class EngineMetrics:
    """One engine's metrics; `render()` is the `/metrics` body."""

    def __init__(self, cfg: SimConfig, live: LiveGauges) -> None:
        self.cfg = cfg
        self.live = live
        self.vllm = cfg.engine == "vllm"
        if self.vllm:
            self.labels = {"model_name": cfg.served_model_name, "engine": "0"}
        else:
            self.labels = {
                "model_name": cfg.served_model_name,
                "engine_type": "unified",
                "tp_rank": "0",
                "pp_rank": "0",
            }
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.query_tokens = 0
        self.hit_tokens = 0
        self.requests = 0
        self.last_hit_rate = 0.0
        self.finished: dict[str, int] = {}
        self.ttft = Hist(_LAT_BUCKETS)
        self.itl = Hist(_ITL_BUCKETS)
        self.e2e = Hist(_LAT_BUCKETS)
        self.queue = Hist(_LAT_BUCKETS)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)  # type: ignore[arg-type]

    def admitted(self, prompt_tokens: int, cached_tokens: int) -> None:
        """Account one request's prefix-cache lookup (at its first admission)."""
        self.query_tokens += prompt_tokens
        self.hit_tokens += cached_tokens
        self.last_hit_rate = cached_tokens / prompt_tokens if prompt_tokens else 0.0

    def observe(
        self,
        *,
        prompt_tokens: int,
        generation_tokens: int,
        ttft: float,
        itl: float,
        e2e: float,
        queue: float,
        finished_reason: str,
    ) -> None:
        """Account one finished request."""
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generation_tokens
        self.requests += 1
        self.finished[finished_reason] = self.finished.get(finished_reason, 0) + 1
        self.ttft.observe(ttft)
        if generation_tokens > 1:
            self.itl.observe(itl, generation_tokens - 1)
        self.e2e.observe(e2e)
        self.queue.observe(queue)

    def render(self) -> bytes:
        """Prometheus text exposition of every family."""
        return generate_latest(self.registry)

    # ---- the collector ---------------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        """Build the families (called by the registry at scrape time)."""
        yield from self._vllm() if self.vllm else self._sglang()

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=list(self.labels))
        g.add_metric(list(self.labels.values()), value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=list(self.labels))
        c.add_metric(list(self.labels.values()), value)
        return c

    def _vllm(self) -> Iterator[Metric]:
        cfg, lv, lb = self.cfg, self.live, self.labels
        yield self._gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", lv.running()
        )
        yield self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", lv.waiting()
        )
        yield self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", lv.kv_usage()
        )
        yield self._counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of tokens.", self.query_tokens
        )
        yield self._counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of tokens.", self.hit_tokens
        )
        yield self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", lv.preemptions()
        )
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens)
        yield self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", self.generation_tokens
        )
        ok = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*lb, "finished_reason"],
        )
        for reason, count in sorted(self.finished.items()):
            ok.add_metric([*lb.values(), reason], count)
        yield ok
        yield self.ttft.family(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lb
        )
        yield self.itl.family(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", lb
        )
        yield self.e2e.family(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lb
        )
        yield self.queue.family(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", lb
        )
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "cache_dtype", "enable_prefix_caching", "engine", "num_gpu_blocks"],
        )
        info.add_metric(
            [str(cfg.block_size), "auto", str(cfg.prefix_caching), "0", str(cfg.num_cache_blocks)], 1
        )
        yield info

    def _sglang(self) -> Iterator[Metric]:
        cfg, lv, lb = self.cfg, self.live, self.labels
        yield self._gauge("sglang:num_running_reqs", "The number of running requests.", lv.running())
        yield self._gauge(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue.", lv.waiting()
        )
        yield self._gauge("sglang:token_usage", "The token usage.", lv.kv_usage())
        yield self._gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", self.last_hit_rate)
        yield self._gauge(
            "sglang:max_total_num_tokens",
            "Maximum total number of tokens in the KV cache.",
            cfg.block_size * cfg.num_cache_blocks,
        )
        yield self._counter("sglang:cached_tokens", "Number of cached prompt tokens.", self.hit_tokens)
        yield self._counter("sglang:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens)
        yield self._counter(
            "sglang:generation_tokens", "Number of generation tokens processed.", self.generation_tokens
        )
        yield self._counter("sglang:num_requests", "Number of requests processed.", self.requests)
        yield self._counter(
            "sglang:num_retracted_requests", "Total number of retracted requests.", lv.preemptions()
        )
        yield self.ttft.family(
            "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lb
        )
        yield self.itl.family(
            "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", lb
        )
        yield self.e2e.family(
            "sglang:e2e_request_latency_seconds", "Histogram of end-to-end request latency in seconds", lb
        )
        yield self.queue.family("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", lb)
        info = GaugeMetricFamily("sglang:cache_config_info", "Cache configuration", labels=["page_size"])
        info.add_metric([str(cfg.block_size)], 1)
        yield info
