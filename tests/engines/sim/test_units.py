"""Pure pieces of the simulator: tokenizer, prefix cache, generator, schemas, scheduler, faults, tool rule."""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engines.sim import tokenizer
from engines.sim.config import parse_config
from engines.sim.faults import FaultState
from engines.sim.generator import GenSpec, generate, pieces
from engines.sim.prefix_cache import PrefixCache
from engines.sim.prompt import render_chat
from engines.sim.scheduler import Scheduler
from engines.sim.schema_gen import sample, sample_regex
from engines.sim.tools import choose_calls
from tests.support import examples, one_turn


def test_tokenizer_counts_words_and_punctuation() -> None:
    assert tokenizer.split("Hello, world! it's 42.") == [
        "Hello",
        ",",
        "world",
        "!",
        "it",
        "'",
        "s",
        "42",
        ".",
    ]
    assert tokenizer.count("") == 0
    ids = tokenizer.encode("Hello, world!")
    assert ids == tokenizer.encode("Hello ,   world !") and all(i >= 1000 for i in ids)
    assert tokenizer.decode(ids) == "Hello, world!"


@given(st.text(max_size=200))
@settings(max_examples=examples(60), deadline=None)
def test_pieces_concatenate_back(text: str) -> None:
    assert "".join(pieces(text)) == text


def test_prefix_cache_chains_and_evicts_lru() -> None:
    cache = PrefixCache(block_size=4, capacity_blocks=4)
    a = list(range(1000, 1012))  # 3 blocks
    lease = cache.acquire(a)
    assert lease.cached_tokens == 0 and cache.used_blocks == 3
    cache.release(lease)
    assert cache.acquire([*a[:8], 1, 2, 3, 4]).cached_tokens == 8  # shared prefix only
    other = cache.acquire([5, *a[1:]])  # a different first token breaks the chain
    assert other.cached_tokens == 0
    assert cache.used_blocks <= 4 and cache.evictions > 0


def test_prefix_cache_never_evicts_pinned_blocks() -> None:
    cache = PrefixCache(block_size=2, capacity_blocks=2)
    held = cache.acquire([1, 2, 3, 4])
    extra = cache.acquire([9, 9, 8, 8])
    assert len(extra.keys) == 0 and cache.used_blocks == 2
    cache.release(held)
    assert cache.acquire([9, 9, 8, 8]).keys


def test_prefix_cache_hit_blocks_looks_without_touching() -> None:
    cache = PrefixCache(block_size=4, capacity_blocks=3)
    a, b = list(range(100, 108)), list(range(200, 204))  # 2 blocks, 1 block
    cache.release(cache.acquire(a))
    cache.release(cache.acquire(b))
    keys = PrefixCache.block_keys([*a, 7, 7, 7, 7], 4)
    assert cache.hit_blocks(keys) == 2 and cache.hit_blocks(PrefixCache.block_keys([1, 2, 3, 4], 4)) == 0
    queries, hits = cache.queries_tokens, cache.hit_tokens
    cache.release(cache.acquire([9, 9, 9, 9]))  # evicts the least recently used: a's first block
    assert cache.hit_blocks(keys) == 0  # hit_blocks did not refresh a
    assert (cache.queries_tokens, cache.hit_tokens) == (queries + 4, hits)
    assert PrefixCache(4, 3, enabled=False).hit_blocks(keys) == 0


def test_generator_is_deterministic_and_honours_limits() -> None:
    spec = GenSpec(seed=42)
    assert generate(spec).text == generate(spec).text and generate(spec, 1).text != generate(spec).text
    out = generate(GenSpec(seed=42, max_tokens=3))
    assert out.completion_tokens == 3 and out.finish_reason == "length" and len(out.content) == 3
    assert generate(GenSpec(seed=1, ignore_eos=True, max_tokens=100)).completion_tokens == 100
    assert generate(GenSpec(seed=1, min_tokens=80)).completion_tokens >= 80
    full = generate(GenSpec(seed=9)).text
    word = full.split()[2].strip(".,")
    cut = generate(GenSpec(seed=9, stop=(word,)))
    assert cut.stop_str == word and full.startswith(cut.text) and word not in cut.text
    kept = generate(GenSpec(seed=9, stop=(word,), include_stop_str=True))
    assert kept.text.endswith(word)


def test_reasoning_counts_against_max_tokens() -> None:
    out = generate(GenSpec(seed=3, reasoning=True, max_tokens=5))
    assert len(out.reasoning) == 5 and not out.content and out.finish_reason == "length"


SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 6}},
        "required": ["a"],
    },
    {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 2, "maxItems": 2},
    {"type": ["string", "null"], "pattern": r"^[A-Z]{3}\d$"},
    {
        "$defs": {"p": {"type": "object", "properties": {"n": {"type": "number"}}}},
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/p"}, "b": {"type": "boolean"}},
    },
    {"anyOf": [{"type": "integer"}, {"type": "string"}]},
]


def test_schema_samples_validate() -> None:
    rng = random.Random(0)
    a = sample(SCHEMAS[0], rng)
    assert a["a"] in (5, 6)
    assert all(v in ("x", "y") for v in sample(SCHEMAS[1], rng)) and len(sample(SCHEMAS[1], rng)) == 2
    assert re.fullmatch(r"[A-Z]{3}\d", sample(SCHEMAS[2], rng))
    nested = sample(SCHEMAS[3], rng)
    assert isinstance(nested["p"]["n"], float) and isinstance(nested["b"], bool)
    assert isinstance(sample(SCHEMAS[4], rng), int)


@given(
    st.sampled_from(
        [r"\d{2,4}", r"(ab|cd)+x?", r"[a-f0-9]{8}-[a-f0-9]{4}", r"\w+@\w+\.(com|org)", r"[^,]{3}"]
    ),
    st.integers(0, 1000),
)
@settings(max_examples=examples(50), deadline=None)
def test_regex_samples_match(pattern: str, seed: int) -> None:
    assert re.fullmatch(pattern, sample_regex(pattern, random.Random(seed)))


def test_tool_rule() -> None:
    tools = [{"type": "function", "function": {"name": n}} for n in ("alpha", "beta")]
    user = [{"role": "user", "content": "please"}]
    assert [c[0] for c in choose_calls(user, tools, "auto")] == ["alpha"]
    assert [c[0] for c in choose_calls([{"role": "user", "content": "beta then alpha"}], tools, "auto")] == [
        "alpha",
        "beta",
    ]
    assert [
        c[0] for c in choose_calls([{"role": "user", "content": "beta alpha"}], tools, "auto", False)
    ] == ["alpha"]
    assert choose_calls([{"role": "user", "content": "No tools!"}], tools, "auto") == []
    assert choose_calls([{"role": "user", "content": "No tools!"}], tools, "required")
    assert choose_calls([*user, {"role": "tool", "content": "x"}], tools, "auto") == []
    assert choose_calls(user, tools, "none") == []
    assert [c[0] for c in choose_calls(user, tools, {"type": "function", "function": {"name": "beta"}})] == [
        "beta"
    ]


def test_template_puts_system_and_tools_first() -> None:
    text = render_chat(
        [{"role": "user", "content": "u"}, {"role": "system", "content": "s"}],
        [{"type": "function", "function": {"name": "t"}}],
    )
    assert text.index('"name": "t"') < text.index("<|im_start|>user")
    assert text.endswith("<|im_start|>assistant\n")


async def test_scheduler_queues_and_slows_down() -> None:
    cfg = parse_config(["--max-num-seqs", "2", "--itl-ms", "10", "--load-slowdown", "1"])
    s = Scheduler(cfg)
    idle = s.token_time()
    await s.admit()
    await s.admit()
    assert s.token_time() == 2 * idle and s.running == 2
    waiter = asyncio.create_task(s.admit())
    await one_turn()
    assert s.waiting == 1
    s.finish()
    await waiter
    assert (s.running, s.waiting) == (2, 0)
    cancelled = asyncio.create_task(s.admit())
    await one_turn()
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    assert s.waiting == 0
    assert s.prefill_time(1000) == cfg.ttft_s + 1000 * cfg.prefill_s_per_token


def test_config_fast_and_fault_state() -> None:
    cfg = parse_config(["--engine", "sglang", "--fast", "--fault-rate", "0.25", "--fault-kind", "429"])
    assert (cfg.port, cfg.ttft_s, cfg.itl_s, cfg.prefill_s_per_token) == (30000, 0.0, 0.0, 0.0)
    f = FaultState.from_config(cfg)
    assert [f.draw_error() for _ in range(8)] == [None, None, None, "429"] * 2
    f.update({"reset": True, "drip_ms": 50})
    assert f.fault_rate == 0 and f.drip_s == 0.05


def test_engine_flag_aliases_and_disabled_cache() -> None:
    cfg = parse_config(
        [
            "--engine",
            "sglang",
            "--context-length",
            "1024",
            "--max-running-requests",
            "8",
            "--page-size",
            "4",
            "--no-prefix-caching",
        ]
    )
    assert (cfg.max_model_len, cfg.max_num_seqs, cfg.block_size, cfg.prefix_caching) == (1024, 8, 4, False)
    cache = PrefixCache(4, 100, enabled=cfg.prefix_caching)
    cache.acquire(list(range(1000, 1040)))
    assert cache.acquire(list(range(1000, 1040))).cached_tokens == 0 and cache.used_blocks == 0
