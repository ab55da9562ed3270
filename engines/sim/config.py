"""Typed settings of one simulator process, parsed once from the command line.

`add_arguments` declares every flag; `SimConfig.from_args` turns the parsed namespace into a frozen
object that the rest of the package reads. Fault settings that can change at run time live in
`faults.FaultState`, seeded from the flags here.

Cost flags left unset take the scheduler's defaults: `--scheduler batching` (the default) is
calibrated to Llama-3.1-8B on one H100 (docs/simulators.md); `--scheduler serial` keeps the
one-request-at-a-time cost model of before, with its defaults.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Literal, cast

from engines.sim.block_hashes import HASH_ALGOS, HashAlgo
from engines.sim.kv_events import KvEventsConfig, KvEventsConfigError, parse_kv_events_config
from engines.sim.step_model import SCHEDULE_POLICIES, BatchConfig, SchedulePolicy, StepCosts

Engine = Literal["vllm", "sglang"]
ENGINES: tuple[Engine, ...] = ("vllm", "sglang")
FaultKind = Literal["429", "500", "503", "context"]
CrashMode = Literal["cut", "exit", "error"]
SchedulerKind = Literal["batching", "serial"]
SCHEDULERS: tuple[SchedulerKind, ...] = ("batching", "serial")

DEFAULT_PORTS: dict[Engine, int] = {"vllm": 8000, "sglang": 30000}
_BATCH = StepCosts()
# Llama-3.1-8B's KV cache on one H100 80 GB: 0.9 x 80 GiB - 15 GiB of weights - the activation
# reserve ~ 52 GiB at 128 KiB per token (32 layers x 8 KV heads x 128 x K,V x bf16) ~ 27,000 blocks
BATCH_BLOCKS = 27_000
SERIAL_BLOCKS = 4096


def _pick(value: float | None, default: float) -> float:
    return default if value is None else value


def _add(group: argparse._ArgumentGroup, *flags: str, **kw: object) -> None:
    """`group.add_argument` that shows a non-trivial default in the help text."""
    default = kw.get("default")
    if default not in (None, False) and kw.get("action") is None:
        kw["help"] = f"{kw.get('help', '')} (default: %(default)s)".strip()
    group.add_argument(*flags, **kw)  # type: ignore[arg-type]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare every simulator flag on `parser` (used by `python -m engines.sim` and `gateway sim`)."""
    g = parser.add_argument_group("server")
    _add(g, "--engine", choices=ENGINES, default="vllm", help="wire dialect to reproduce")
    _add(g, "--host", default="127.0.0.1")
    _add(g, "--port", type=int, default=None, help="default 8000 (vllm) / 30000 (sglang)")
    _add(g, "--model", default="sim-model", help="model path; also the served name by default")
    _add(g, "--served-model-name", default=None, help="name reported by /v1/models")
    _add(g, "--engine-version", default=None, help="reported version (default 0.13.0 vllm, 0.5.6 sglang)")
    _add(g, "--log-level", default="warning")

    g = parser.add_argument_group("engine features (same flags as the real engines)")
    _add(g, "--enable-auto-tool-choice", action="store_true", help="vLLM: allow tool_choice=auto")
    _add(g, "--api-key", default=None, help="require `Authorization: Bearer <key>` as the engine does")
    _add(g, "--tool-call-parser", default=None, help="e.g. hermes, qwen25; enables tool parsing")
    _add(g, "--reasoning-parser", default=None, help="e.g. qwen3, deepseek_r1; enables reasoning")
    _add(g, "--exclude-tools-when-tool-choice-none", action="store_true", help="vLLM")
    _add(g, "--enable-force-include-usage", action="store_true", help="vLLM: usage in every stream")
    _add(
        g, "--stream-response-default-include-usage", action="store_true", help="SGLang: usage on by default"
    )
    _add(g, "--enable-prompt-tokens-details", action="store_true", help="vLLM: cached_tokens")
    _add(g, "--enable-cache-report", action="store_true", help="SGLang: cached_tokens")
    _add(g, "--enable-metrics", action="store_true", help="SGLang: serve /metrics")
    _add(g, "--enable-lora", action="store_true", help="vLLM: serve LoRA adapters (--lora-modules)")
    _add(
        g,
        "--lora-modules",
        nargs="+",
        default=[],
        help="vLLM: adapters as name=path (or vLLM's JSON form), each served as its own model name",
    )
    _add(g, "--max-lora-rank", type=int, default=16, help="vLLM (accepted; the simulator has no weights)")
    _add(g, "--max-loras", type=int, default=1, help="vLLM (accepted; the simulator has no weights)")
    _add(g, "--max-model-len", "--context-length", dest="max_model_len", type=int, default=8192)
    _add(g, "--eos-token-id", type=int, default=2)
    _add(
        g,
        "--embedding-dim",
        type=int,
        default=0,
        help="an embedding model: /v1/embeddings vectors of N floats",
    )
    _add(g, "--reranker", action="store_true", help="a cross-encoder: rerank and score")
    _add(g, "--speech-to-text", action="store_true", help="a Whisper-like model: /v1/audio/*")

    g = parser.add_argument_group("scheduler and KV cache (the engines' own flag names)")
    _add(
        g,
        "--scheduler",
        choices=SCHEDULERS,
        default="batching",
        help="batching: continuous batching in steps; serial: one request at a time per slot",
    )
    _add(
        g,
        "--max-num-seqs",
        "--max-running-requests",
        dest="max_num_seqs",
        type=int,
        default=None,
        help="running sequences (default vllm 1024, sglang 256; serial: 256 slots)",
    )
    _add(g, "--max-num-batched-tokens", type=int, default=8192, help="vLLM: token budget of one step")
    _add(
        g,
        "--enable-chunked-prefill",
        dest="chunked_prefill",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="vLLM: chunk long prefills to the step budget",
    )
    _add(
        g,
        "--chunked-prefill-size",
        type=int,
        default=8192,
        help="SGLang: new tokens per prefill batch; -1 off",
    )
    _add(g, "--max-prefill-tokens", type=int, default=16384, help="SGLang: tokens per prefill batch")
    _add(g, "--schedule-policy", choices=SCHEDULE_POLICIES, default="fcfs", help="waiting-queue order")
    _add(g, "--block-size", "--page-size", dest="block_size", type=int, default=16)
    _add(
        g,
        "--num-gpu-blocks-override",
        "--num-cache-blocks",
        dest="num_cache_blocks",
        type=int,
        default=None,
        help=f"KV cache in blocks (default {BATCH_BLOCKS}; serial: {SERIAL_BLOCKS}, the prefix cache only)",
    )
    _add(g, "--max-total-tokens", type=int, default=None, help="SGLang: KV cache in tokens")
    _add(
        g,
        "--no-prefix-caching",
        "--no-enable-prefix-caching",
        "--disable-radix-cache",
        dest="prefix_caching",
        action="store_false",
    )
    _add(g, "--prefix-caching-hash-algo", choices=HASH_ALGOS, default="sha256", help="vLLM: block hashes")
    _add(g, "--kv-events-config", default=None, help="JSON: publish KV-cache events over ZMQ")

    g = parser.add_argument_group("cost model (batching: t_step = a + b*prefill + c*decodes + d*context)")
    _add(
        g,
        "--ttft-ms",
        type=float,
        default=None,
        help="fixed time before the first token (default batching 0, serial 20)",
    )
    _add(
        g,
        "--prefill-us-per-token",
        type=float,
        default=None,
        help=f"b: per uncached prompt token (default batching {_BATCH.prefill_token_s * 1e6:g}, serial 20)",
    )
    _add(
        g,
        "--itl-ms",
        type=float,
        default=None,
        help=f"a: fixed time of a step (default {_BATCH.fixed_s * 1e3:g}); serial: ITL when idle (6)",
    )
    _add(
        g,
        "--decode-us-per-seq",
        type=float,
        default=None,
        help=f"c: per decoding sequence in a step (default {_BATCH.decode_seq_s * 1e6:g} x itl-ms / {_BATCH.fixed_s * 1e3:g})",
    )
    _add(
        g,
        "--context-ns-per-token",
        type=float,
        default=None,
        help=f"d: per token of context in a step (default {_BATCH.context_token_s * 1e9:g} x itl-ms / {_BATCH.fixed_s * 1e3:g})",
    )
    _add(g, "--load-slowdown", type=float, default=1.0, help="serial: ITL x (1 + this x running/max)")
    _add(g, "--min-output-tokens", type=int, default=30, help="natural length range, low end")
    _add(g, "--max-output-tokens", type=int, default=60, help="natural length range, high end")
    _add(g, "--fast", action="store_true", help="zero latencies (benchmarks)")
    _add(g, "--request-log-size", type=int, default=256, help="bodies kept for /sim/requests")

    g = parser.add_argument_group("faults (also settable at run time: POST /sim/faults)")
    _add(g, "--fault-rate", type=float, default=0.0, help="fraction of requests that fail")
    _add(g, "--fault-kind", choices=("429", "500", "503", "context"), default="500")
    _add(g, "--crash-after", type=int, default=None, help="stream: fail after K chunks")
    _add(
        g,
        "--crash-mode",
        choices=("cut", "exit", "error"),
        default="cut",
        help="cut the connection, exit the process, or send an error event",
    )
    _add(g, "--stall", action="store_true", help="accept requests, never send a byte")
    _add(g, "--drip-ms", type=float, default=0.0, help="extra delay between stream chunks")
    _add(g, "--startup-delay", type=float, default=0.0, help="503 on everything for S seconds")
    _add(g, "--listen-delay", type=float, default=0.0, help="open the port only after S seconds")
    _add(g, "--refuse", action="store_true", help="close every accepted connection at once")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything a simulator needs to know about itself; immutable after start-up."""

    engine: Engine = "vllm"
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "sim-model"
    served_model_name: str = "sim-model"
    engine_version: str = "0.13.0"
    log_level: str = "warning"
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    #: `--api-key`: requests on the paths the engine guards need it as a bearer token
    api_key: str | None = None
    reasoning_parser: str | None = None
    exclude_tools_when_tool_choice_none: bool = False
    enable_force_include_usage: bool = False
    stream_response_default_include_usage: bool = False
    enable_prompt_tokens_details: bool = False
    enable_cache_report: bool = False
    enable_metrics: bool = False
    max_model_len: int = 8192
    #: vLLM's LoRA adapters (`--lora-modules`): name -> path, in the order given (ids 1, 2, ...)
    lora_modules: dict[str, str] = field(default_factory=dict)
    #: vLLM's `VLLM_MAX_COMPLETION_PROMPTS` (its default): most prompts in one completions batch
    max_completion_prompts: int = 1024
    eos_token_id: int = 2
    #: > 0: an embedding model serving /v1/embeddings with vectors of this size (engines/sim/embeddings.py)
    embedding_dim: int = 0
    #: a cross-encoder serving rerank and score (engines/sim/scoring.py)
    reranker: bool = False
    #: a speech-to-text model serving /v1/audio/* (engines/sim/audio.py)
    speech_to_text: bool = False
    scheduler: SchedulerKind = "batching"
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    schedule_policy: SchedulePolicy = "fcfs"
    block_size: int = 16
    num_cache_blocks: int = BATCH_BLOCKS
    prefix_caching: bool = True
    hash_algo: HashAlgo = "sha256"
    kv_events: KvEventsConfig | None = None
    ttft_s: float = 0.0
    prefill_s_per_token: float = _BATCH.prefill_token_s
    itl_s: float = _BATCH.fixed_s
    decode_s_per_seq: float = _BATCH.decode_seq_s
    context_s_per_token: float = _BATCH.context_token_s
    load_slowdown: float = 1.0
    min_output_tokens: int = 30
    max_output_tokens: int = 60
    request_log_size: int = 256
    fault_rate: float = 0.0
    fault_kind: FaultKind = "500"
    crash_after: int | None = None
    crash_mode: CrashMode = "cut"
    stall: bool = False
    drip_s: float = 0.0
    startup_delay_s: float = 0.0
    listen_delay_s: float = 0.0
    refuse: bool = False

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> SimConfig:
        """Build the config from a namespace filled by `add_arguments` (raises `ValueError` on an
        invalid `--kv-events-config`)."""
        engine = cast(Engine, a.engine)
        fast = bool(a.fast)
        version = a.engine_version or ("0.13.0" if engine == "vllm" else "0.5.6")
        scheduler = cast(SchedulerKind, a.scheduler)
        serial = scheduler == "serial"
        block_size = max(1, a.block_size)
        blocks = a.num_cache_blocks
        if blocks is None and a.max_total_tokens is not None:
            blocks = -(-a.max_total_tokens // block_size)
        if blocks is None:
            blocks = SERIAL_BLOCKS if serial else BATCH_BLOCKS
        seqs = a.max_num_seqs
        if seqs is None:
            seqs = 256 if serial or engine == "sglang" else 1024
        kv_events = None
        if a.kv_events_config:
            try:
                kv_events = parse_kv_events_config(a.kv_events_config, engine)
            except KvEventsConfigError as exc:
                raise ValueError(str(exc)) from None
        zero = 0.0 if fast else None
        itl_ms = _pick(zero if fast else a.itl_ms, 6.0 if serial else _BATCH.fixed_s * 1e3)
        # c and d keep their H100 proportion to the step's fixed time unless given: --itl-ms 0 is an
        # engine with no latency at all, --itl-ms 65 a GPU ten times slower
        scale = itl_ms / (_BATCH.fixed_s * 1e3)
        return cls(
            engine=engine,
            host=a.host,
            port=a.port if a.port is not None else DEFAULT_PORTS[engine],
            model=a.model,
            served_model_name=a.served_model_name or a.model,
            engine_version=version,
            log_level=a.log_level,
            enable_auto_tool_choice=a.enable_auto_tool_choice,
            tool_call_parser=a.tool_call_parser,
            api_key=a.api_key,
            reasoning_parser=a.reasoning_parser,
            exclude_tools_when_tool_choice_none=a.exclude_tools_when_tool_choice_none,
            enable_force_include_usage=a.enable_force_include_usage,
            stream_response_default_include_usage=a.stream_response_default_include_usage,
            enable_prompt_tokens_details=a.enable_prompt_tokens_details,
            enable_cache_report=a.enable_cache_report,
            enable_metrics=a.enable_metrics,
            max_model_len=a.max_model_len,
            lora_modules=_lora_modules(engine, a.enable_lora, a.lora_modules),
            eos_token_id=a.eos_token_id,
            embedding_dim=max(0, a.embedding_dim),
            reranker=a.reranker,
            speech_to_text=a.speech_to_text,
            scheduler=scheduler,
            max_num_seqs=max(1, seqs),
            max_num_batched_tokens=max(1, a.max_num_batched_tokens),
            chunked_prefill=a.chunked_prefill,
            chunked_prefill_size=a.chunked_prefill_size,
            max_prefill_tokens=max(1, a.max_prefill_tokens),
            schedule_policy=cast(SchedulePolicy, a.schedule_policy),
            block_size=block_size,
            num_cache_blocks=max(0, blocks),
            prefix_caching=a.prefix_caching,
            hash_algo=cast(HashAlgo, a.prefix_caching_hash_algo),
            kv_events=kv_events if kv_events is not None and kv_events.publishing else None,
            ttft_s=_pick(zero if fast else a.ttft_ms, 20.0 if serial else 0.0) / 1000,
            prefill_s_per_token=_pick(
                zero if fast else a.prefill_us_per_token, 20.0 if serial else _BATCH.prefill_token_s * 1e6
            )
            / 1e6,
            itl_s=itl_ms / 1000,
            decode_s_per_seq=_pick(zero if fast else a.decode_us_per_seq, _BATCH.decode_seq_s * 1e6 * scale)
            / 1e6,
            context_s_per_token=_pick(
                zero if fast else a.context_ns_per_token, _BATCH.context_token_s * 1e9 * scale
            )
            / 1e9,
            load_slowdown=a.load_slowdown,
            min_output_tokens=max(1, a.min_output_tokens),
            max_output_tokens=max(a.min_output_tokens, a.max_output_tokens, 1),
            request_log_size=max(1, a.request_log_size),
            fault_rate=a.fault_rate,
            fault_kind=cast(FaultKind, a.fault_kind),
            crash_after=a.crash_after,
            crash_mode=cast(CrashMode, a.crash_mode),
            stall=a.stall,
            drip_s=a.drip_ms / 1000,
            startup_delay_s=a.startup_delay,
            listen_delay_s=a.listen_delay,
            refuse=a.refuse,
        )

    def batch_config(self) -> BatchConfig:
        """The step model's settings (`--scheduler batching`)."""
        return BatchConfig(
            flavour=self.engine,
            num_blocks=self.num_cache_blocks,
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            chunked_prefill=self.chunked_prefill,
            chunked_prefill_size=self.chunked_prefill_size,
            max_prefill_tokens=self.max_prefill_tokens,
            schedule_policy=self.schedule_policy,
            prefix_caching=self.prefix_caching,
            costs=StepCosts(
                fixed_s=self.itl_s,
                prefill_token_s=self.prefill_s_per_token,
                decode_seq_s=self.decode_s_per_seq,
                context_token_s=self.context_s_per_token,
            ),
            record_events=self.kv_events is not None,
        )


def _lora_modules(engine: str, enabled: bool, given: list[str]) -> dict[str, str]:
    """vLLM's `--lora-modules`: `name=path` or `{"name": ..., "path": ...}` each (vLLM refuses them
    without `--enable-lora`)."""
    if not given:
        return {}
    if engine != "vllm":
        raise ValueError("--lora-modules is vLLM's flag (SGLang's adapters are not simulated)")
    if not enabled:
        raise ValueError("--lora-modules needs --enable-lora")
    out: dict[str, str] = {}
    for item in given:
        if item.lstrip().startswith("{"):
            try:
                spec = json.loads(item)
                name, path = spec["name"], spec["path"]
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"--lora-modules: not a LoRA module: {item!r}") from None
        else:
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"--lora-modules: expected name=path, got {item!r}")
        out[str(name)] = str(path)
    return out


def parse_config(argv: list[str]) -> SimConfig:
    """Parse a command line (without the program name) into a `SimConfig`."""
    parser = argparse.ArgumentParser(prog="python -m engines.sim")
    add_arguments(parser)
    return SimConfig.from_args(parser.parse_args(argv))
