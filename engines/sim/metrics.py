"""The engines' own Prometheus metrics, with their real names and labels, on a private registry.

`EngineMetrics.for_engine` builds the vLLM or the SGLang set. Gauges (running, waiting, KV usage) are
read from live state at scrape time; counters and histograms are fed once per finished request by
`observe`. Inter-token latency is observed once per request with the request's mean gap (a cheap
stand-in for the engines' per-token observations).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engines.sim.config import SimConfig

try:
    from prometheus_client import disable_created_metrics

    disable_created_metrics()  # type: ignore[no-untyped-call]
except ImportError:  # pragma: no cover - very old prometheus_client
    pass

_LAT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 1.0)


@dataclass(frozen=True, slots=True)
class LiveGauges:
    """Callbacks returning the current value of each live gauge."""

    running: Callable[[], float]
    waiting: Callable[[], float]
    kv_usage: Callable[[], float]


class EngineMetrics:
    """One engine's metric families; `render()` is the `/metrics` body."""

    def __init__(self, cfg: SimConfig, live: LiveGauges) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        vllm = cfg.engine == "vllm"
        p = "vllm:" if vllm else "sglang:"
        labels: dict[str, str]
        if vllm:
            labels = {"model_name": cfg.served_model_name, "engine": "0"}
        else:
            labels = {
                "model_name": cfg.served_model_name,
                "engine_type": "unified",
                "tp_rank": "0",
                "pp_rank": "0",
            }
        names = list(labels)

        def gauge(name: str, doc: str, fn: Callable[[], float]) -> None:
            Gauge(p + name, doc, names, registry=r).labels(**labels).set_function(fn)

        def counter(name: str, doc: str) -> Counter:
            return Counter(p + name, doc, names, registry=r).labels(**labels)

        def hist(name: str, doc: str, buckets: tuple[float, ...] = _LAT_BUCKETS) -> Histogram:
            return Histogram(p + name, doc, names, buckets=buckets, registry=r).labels(**labels)

        self._vllm = vllm
        self._hit_rate = 0.0
        if vllm:
            gauge("num_requests_running", "Number of requests in model execution batches.", live.running)
            gauge("num_requests_waiting", "Number of requests waiting to be processed.", live.waiting)
            gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", live.kv_usage)
            self.queries = counter("prefix_cache_queries", "Prefix cache queries, in terms of tokens.")
            self.hits = counter("prefix_cache_hits", "Prefix cache hits, in terms of tokens.")
            self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
            self.gen_tokens = counter("generation_tokens", "Number of generation tokens processed.")
            self.success = Counter(
                p + "request_success",
                "Count of successfully processed requests.",
                [*names, "finished_reason"],
                registry=r,
            )
            self.ttft = hist("time_to_first_token_seconds", "Histogram of time to first token in seconds.")
            self.itl = hist(
                "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL_BUCKETS
            )
            self.e2e = hist("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.")
            self.queue = hist("request_queue_time_seconds", "Histogram of time spent in WAITING phase.")
            info = Gauge(
                p + "cache_config_info",
                "Information of the LLMEngine CacheConfig",
                ["block_size", "num_gpu_blocks", "enable_prefix_caching", "cache_dtype", "engine"],
                registry=r,
            )
            info.labels(
                block_size=str(cfg.block_size),
                num_gpu_blocks=str(cfg.num_cache_blocks),
                enable_prefix_caching=str(cfg.prefix_caching),
                cache_dtype="auto",
                engine="0",
            ).set(1)
        else:
            gauge("num_running_reqs", "The number of running requests.", live.running)
            gauge("num_queue_reqs", "The number of requests in the waiting queue.", live.waiting)
            gauge("token_usage", "The token usage.", live.kv_usage)
            gauge("cache_hit_rate", "The prefix cache hit rate.", lambda: self._hit_rate)
            self.hits = counter("cached_tokens", "Number of cached prompt tokens.")
            self.queries = counter("num_requests", "Number of requests processed.")
            self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
            self.gen_tokens = counter("generation_tokens", "Number of generation tokens processed.")
            self.success = Counter(
                p + "num_so_requests", "Number of structured-output requests.", names, registry=r
            )
            self.ttft = hist("time_to_first_token_seconds", "Histogram of time to first token in seconds.")
            self.itl = hist(
                "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL_BUCKETS
            )
            self.e2e = hist(
                "e2e_request_latency_seconds", "Histogram of end-to-end request latency in seconds"
            )
            self.queue = hist("queue_time_seconds", "Histogram of queueing time in seconds.")
            Gauge(p + "cache_config_info", "Cache configuration", ["page_size"], registry=r).labels(
                page_size=str(cfg.block_size)
            ).set(1)
            total = Gauge(
                p + "max_total_num_tokens",
                "Maximum total number of tokens in the KV cache.",
                names,
                registry=r,
            )
            total.labels(**labels).set(cfg.block_size * cfg.num_cache_blocks)
        self._labels = labels
        self._success_children: dict[str, Counter] = {}

    def observe(
        self,
        *,
        prompt_tokens: int,
        cached_tokens: int,
        generation_tokens: int,
        ttft: float,
        itl: float,
        e2e: float,
        queue: float,
        finished_reason: str,
    ) -> None:
        """Account one finished request."""
        self.prompt_tokens.inc(prompt_tokens)
        self.gen_tokens.inc(generation_tokens)
        self.hits.inc(cached_tokens)
        self.ttft.observe(ttft)
        if generation_tokens > 1:
            self.itl.observe(itl)
        self.e2e.observe(e2e)
        self.queue.observe(queue)
        if self._vllm:
            self.queries.inc(prompt_tokens)
            child = self._success_children.get(finished_reason)
            if child is None:
                child = self.success.labels(**self._labels, finished_reason=finished_reason)
                self._success_children[finished_reason] = child
            child.inc()
        else:
            self.queries.inc()
            self._hit_rate = cached_tokens / prompt_tokens if prompt_tokens else 0.0

    def render(self) -> bytes:
        """Prometheus text exposition of every family."""
        return generate_latest(self.registry)
