"""Typed settings of one simulator process, parsed once from the command line.

`add_arguments` declares every flag; `SimConfig.from_args` turns the parsed namespace into a frozen
object that the rest of the package reads. Fault settings that can change at run time live in
`faults.FaultState`, seeded from the flags here.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal, cast

Engine = Literal["vllm", "sglang"]
ENGINES: tuple[Engine, ...] = ("vllm", "sglang")
FaultKind = Literal["429", "500", "503", "context"]
CrashMode = Literal["cut", "exit", "error"]

DEFAULT_PORTS: dict[Engine, int] = {"vllm": 8000, "sglang": 30000}


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
    _add(g, "--max-model-len", "--context-length", dest="max_model_len", type=int, default=8192)
    _add(g, "--max-num-seqs", "--max-running-requests", dest="max_num_seqs", type=int, default=256)
    _add(g, "--block-size", "--page-size", dest="block_size", type=int, default=16)
    _add(g, "--num-cache-blocks", type=int, default=4096, help="prefix-cache capacity in blocks")
    _add(g, "--no-prefix-caching", dest="prefix_caching", action="store_false")
    _add(g, "--eos-token-id", type=int, default=2)
    _add(
        g,
        "--embedding-dim",
        type=int,
        default=0,
        help="an embedding model: /v1/embeddings vectors of N floats",
    )

    g = parser.add_argument_group("cost model")
    _add(g, "--ttft-ms", type=float, default=20.0, help="fixed time before the first token")
    _add(g, "--prefill-us-per-token", type=float, default=20.0, help="per uncached prompt token")
    _add(g, "--itl-ms", type=float, default=6.0, help="inter-token latency when idle")
    _add(g, "--load-slowdown", type=float, default=1.0, help="ITL x (1 + this x running/max)")
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
    reasoning_parser: str | None = None
    exclude_tools_when_tool_choice_none: bool = False
    enable_force_include_usage: bool = False
    stream_response_default_include_usage: bool = False
    enable_prompt_tokens_details: bool = False
    enable_cache_report: bool = False
    enable_metrics: bool = False
    max_model_len: int = 8192
    max_num_seqs: int = 256
    block_size: int = 16
    num_cache_blocks: int = 4096
    prefix_caching: bool = True
    eos_token_id: int = 2
    #: > 0: an embedding model serving /v1/embeddings with vectors of this size (engines/sim/embeddings.py)
    embedding_dim: int = 0
    ttft_s: float = 0.020
    prefill_s_per_token: float = 20e-6
    itl_s: float = 0.006
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
        """Build the config from a namespace filled by `add_arguments`."""
        engine = cast(Engine, a.engine)
        fast = bool(a.fast)
        version = a.engine_version or ("0.13.0" if engine == "vllm" else "0.5.6")
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
            reasoning_parser=a.reasoning_parser,
            exclude_tools_when_tool_choice_none=a.exclude_tools_when_tool_choice_none,
            enable_force_include_usage=a.enable_force_include_usage,
            stream_response_default_include_usage=a.stream_response_default_include_usage,
            enable_prompt_tokens_details=a.enable_prompt_tokens_details,
            enable_cache_report=a.enable_cache_report,
            enable_metrics=a.enable_metrics,
            max_model_len=a.max_model_len,
            max_num_seqs=max(1, a.max_num_seqs),
            block_size=max(1, a.block_size),
            num_cache_blocks=max(0, a.num_cache_blocks),
            prefix_caching=a.prefix_caching,
            eos_token_id=a.eos_token_id,
            embedding_dim=max(0, a.embedding_dim),
            ttft_s=0.0 if fast else a.ttft_ms / 1000,
            prefill_s_per_token=0.0 if fast else a.prefill_us_per_token / 1e6,
            itl_s=0.0 if fast else a.itl_ms / 1000,
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


def parse_config(argv: list[str]) -> SimConfig:
    """Parse a command line (without the program name) into a `SimConfig`."""
    parser = argparse.ArgumentParser(prog="python -m engines.sim")
    add_arguments(parser)
    return SimConfig.from_args(parser.parse_args(argv))
