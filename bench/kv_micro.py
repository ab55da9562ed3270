"""KV-event routing's own costs, measured in-process: `python -m bench.kv_micro [--quick] [--section N]`.

Prints three tables (figures for docs/routing.md, *KV events*; not a test, nothing is asserted):

1. Tokenization per request (`gateway.routing.tokens.PromptTokens.blocks` + the block keys a decision
   reads), with a byte-level BPE tokenizer trained here on the standard library's sources (vocab
   8,192, ChatML specials, a hermes-style template with tools; no download): a 2k-token chat's first
   turn with nothing cached, a first turn whose system prompt and tools were seen before, a later
   turn of a conversation, a 16k-token document and a second question about it; the simulators'
   `sim` tokenizer for comparison; rendering (jinja2) alone.
2. The routing decision's CPU time with events (`Router.decide`: pool choice, prefix affinity's
   scoring against the KV index, the state updates of `on_routed`), 8 backends in one pool, the
   index holding what the requests' engines stored; the request's tokens and keys computed before
   the clock starts (they are table 1). Between the decisions, a fixed loop of about 20 us is timed
   the same way: the same work on every call, so its p99 over its p50 is the tail this machine adds
   by itself in that minute (a shared 2-core VM: ~1.9-2.2x), the yardstick for the decisions' p99.
3. The index's memory for 8 backends x N events (default 1M block stores each): with the engines'
   removals delivered (the index follows each engine's capacity) and with every removal lost (the
   index's `max_blocks` bound is all that holds it), by `tracemalloc`, and the ingest cost per block.

5. The fleet as routing sees it, per request (`Fleet.snapshot`, then `WithOthers` adding the other
   processes' in-flight counts on every backend and queued prefill on half of them, as the gateway
   does with shared load), 8 and 32 backends in two pools, one backend's own in-flight count
   changed since the last request (a request started or ended there); against the same views built
   anew on every request (every `BackendView` and `PoolView` constructed), alternated in one run.
CPU times are the thread's (`time.thread_time_ns`), so other processes on the machine do not count;
each figure is over many calls, p50 and p99 of the single calls (their resolution is ~0.1 us).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.routing.tokens import HfTokenizer, PromptTokens, SimTokenizer
from policies.features import FeatureConfig, extract_features
from policies.kv_index import KvIndex, KvIndexConfig
from policies.prefix_affinity import PrefixAffinityConfig
from policies.router import Router
from policies.types import BackendView, FleetSnapshot, PoolView, RequestFeatures

MODEL = "m"
# the index's key group for engines with 16-token blocks (policies.kv_index, *Granularity*): the
# keys a decision reads, computed once a request (the gateway: in its first match)
GROUP = 16 * max(1, -(-KvIndexConfig().min_block_tokens // 16))
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n"
    "{% endif %}# Tools\n\nYou may call one or more functions.\n<tools>{% for tool in tools %}\n"
    "{{ tool | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}{%- if message.role != 'system' %}\n<|im_start|>{{ message.role }}\n"
    "{{ message.content }}<|im_end|>{%- endif %}{%- endfor %}\n"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
]


def build_tokenizer(root: Path) -> HfTokenizer:
    """A byte-level BPE trained on stdlib sources: deterministic, no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    lib = Path(json.__file__).parent.parent
    corpus = [p.read_text(errors="replace") for p in sorted(lib.glob("*.py"))[:120]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=8192, special_tokens=SPECIALS))
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": TEMPLATE, "eos_token": "<|im_end|>"})
    )
    return HfTokenizer(root)


def prose(rng: random.Random, words: int) -> str:
    vocab = [
        "the", "request", "engine", "cache", "block", "token", "router", "latency", "prefix", "model", "a",
        "of", "to", "and", "is", "for", "with", "queue", "batch", "system", "answer", "question", "value",
    ]  # fmt: skip
    return " ".join(
        rng.choice(vocab) if rng.random() < 0.8 else f"x{rng.randrange(10**5)}" for _ in range(words)
    )


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": "Looks up a value in the operator's systems and returns it as JSON.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"],
            },
        },
    }
    for i in range(3)
]


def conversation(rng: random.Random, system: str, turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for t in range(turns):
        role = "user" if t % 2 == 0 else "assistant"
        messages.append({"role": role, "content": prose(rng, 110)})
    return messages


def cpu_ns(fn: Callable[[], Any]) -> int:
    t0 = time.thread_time_ns()
    fn()
    return time.thread_time_ns() - t0


def summary(samples: list[int]) -> str:
    s = sorted(samples)
    p50 = s[len(s) // 2] / 1000
    p99 = s[min(len(s) - 1, int(len(s) * 0.99))] / 1000
    mean = statistics.fmean(s) / 1000
    return f"mean {mean:8.1f} us   p50 {p50:8.1f} us   p99 {p99:8.1f} us   (n={len(s)})"


# -- 1. tokenization ------------------------------------------------------------------------------
def bench_tokenization(tok: HfTokenizer, reps: int) -> None:
    print(f"\n1. Tokenization per request (render + tokens + block keys of {GROUP} tokens), CPU")
    rng = random.Random(1)
    system = prose(rng, 220)
    first_turn: list[int] = []
    first_shared: list[int] = []
    later: list[int] = []
    render: list[int] = []
    sim_first: list[int] = []
    tokens_seen = 0
    for r in range(reps):
        messages = conversation(random.Random(100 + r), system, 13)
        body = {"model": MODEL, "messages": messages, "tools": TOOLS}
        cold = PromptTokens({MODEL: tok})
        first_turn.append(cpu_ns(lambda c=cold, b=body: c.blocks(b, 1).keys(GROUP)))  # type: ignore[union-attr]
        if r == 0:
            p = cold.blocks(body)
            tokens_seen = p.tokens if p is not None else 0
        warm = PromptTokens({MODEL: tok})
        warm.blocks(
            {"model": MODEL, "messages": [messages[0], {"role": "user", "content": "hi"}], "tools": TOOLS}
        )
        first_shared.append(cpu_ns(lambda w=warm, b=body: w.blocks(b, 2).keys(GROUP)))  # type: ignore[union-attr]
        grown = {**body, "messages": [*messages, {"role": "assistant", "content": prose(rng, 60)},
                                      {"role": "user", "content": prose(rng, 40)}]}  # fmt: skip
        later.append(cpu_ns(lambda w=warm, g=grown: w.blocks(g, 2).keys(GROUP)))  # type: ignore[union-attr]
        render.append(cpu_ns(lambda g=grown: tok.render(g)))
        sim = PromptTokens({MODEL: SimTokenizer()})
        sim_first.append(cpu_ns(lambda t=sim, b=body: t.blocks(b, 3).keys(GROUP)))  # type: ignore[union-attr]
    print(f"   chat of {tokens_seen} tokens (system prompt, 3 tools, 13 messages):")
    print(f"     first turn, nothing cached          {summary(first_turn)}")
    print(f"     first turn, system + tools cached   {summary(first_shared)}")
    print(f"     later turn (+2 messages)            {summary(later)}")
    print(f"     of which rendering (jinja2)         {summary(render)}")
    print(f"     'sim' tokenizer, first turn         {summary(sim_first)}")
    doc_first: list[int] = []
    doc_again: list[int] = []
    doc_tokens = 0
    for r in range(max(3, reps // 10)):
        doc = prose(random.Random(500 + r), 12000)
        tokens = PromptTokens({MODEL: tok})
        ask = {"model": MODEL, "messages": [{"role": "user", "content": doc + "\n\nWhat is it about?"}]}
        doc_first.append(cpu_ns(lambda t=tokens, a=ask: t.blocks(a, 9).keys(GROUP)))  # type: ignore[union-attr]
        p = tokens.blocks(ask)
        doc_tokens = p.tokens if p is not None else 0
        again = {"model": MODEL, "messages": [{"role": "user", "content": doc + "\n\nWho wrote it?"}]}
        doc_again.append(cpu_ns(lambda t=tokens, a=again: t.blocks(a, 10).keys(GROUP)))  # type: ignore[union-attr]
    print(f"   document of {doc_tokens} tokens (tokenized up to max_chars, keyed up to max_tokens):")
    print(f"     first question                      {summary(doc_first)}")
    print(f"     another question (pieces cached)    {summary(doc_again)}")


# -- 2. the decision ------------------------------------------------------------------------------
def bench_decision(tok: HfTokenizer, decisions: int, backends: int, match_tokens: int) -> None:
    print(
        f"\n2. Routing decision with events, {backends} backends in one pool, prompts matched on their"
        f" first {match_tokens} tokens, CPU (Router.decide)"
    )
    rng = random.Random(2)
    router = Router([], PrefixAffinityConfig())
    kv = router.kv_index
    assert kv is not None
    names = [f"b{i}" for i in range(backends)]
    for n in names:
        kv.attach(n)
        kv.set_live(n, True)
    tokens = PromptTokens({MODEL: tok}, max_tokens=match_tokens)
    system = prose(rng, 220)
    requests: list[tuple[str, RequestFeatures]] = []
    hashes = iter(range(1, 1 << 62))

    def store(backend: str, ids: list[int]) -> None:
        full = len(ids) // 16
        kv.stored(backend, [next(hashes) for _ in range(full)], None, ids[: full * 16], 16)

    def add(kind: str, body: dict[str, Any], holders: int) -> None:
        features = extract_features(body, FeatureConfig())
        prompt = tokens.blocks(body, features.anchor_hash)
        assert prompt is not None
        prompt.keys(GROUP)  # tokenization's share, done before the clock (table 1)
        for b in rng.sample(names, holders):
            store(b, prompt.token_ids())
        requests.append((kind, _with_prompt(features, prompt)))

    for i in range(200):  # chats: later turns, their history held by one engine
        messages = conversation(random.Random(1000 + i), system, 1 + 2 * rng.randrange(7))
        add("chat turn", {"model": MODEL, "messages": messages, "tools": TOOLS}, 1)
    for i in range(40):  # documents, held by one or two engines
        doc = prose(random.Random(2000 + i), 6000)
        body = {"model": MODEL, "messages": [{"role": "user", "content": doc + f"\n\nQuestion {i}?"}]}
        add("document", body, 1 + i % 2)
    for i in range(100):  # first turns nobody holds
        add(
            "cold",
            {"model": MODEL, "messages": [{"role": "user", "content": prose(random.Random(3000 + i), 80)}]},
            0,
        )
    pool = PoolView("p", "vllm", 1.0, frozenset({MODEL}), True, True,
                    tuple(BackendView(n, in_flight=rng.randrange(3)) for n in names))  # fmt: skip
    snapshot = FleetSnapshot((pool,))
    overhead = min(cpu_ns(lambda: None) for _ in range(1000))
    # the machine's own jitter, timed between the decisions: a fixed loop of about a decision's length
    # (20 us), the same work on every call (its p99 over its p50 is what this machine adds)
    fixed = _fixed_work(20_000)
    gc.collect()
    timed: dict[str, dict[str, list[int]]] = {"with events": {}, "without (prompt not tokenized)": {}}
    jitter: list[int] = []
    for _ in range(max(1, decisions // len(requests))):
        order = list(requests)
        rng.shuffle(order)
        for kind, features in order:
            r = rng.random()
            for label, f in (
                ("with events", features),
                ("without (prompt not tokenized)", _with_prompt(features, None)),
            ):
                t = cpu_ns(lambda f=f, r=r: router.decide(snapshot, f, r)) - overhead
                timed[label].setdefault(kind, []).append(t)
            jitter.append(cpu_ns(fixed) - overhead)
    print(f"   index: {len(kv)} keys; {sum(kv.holds(n) for n in names)} engine blocks")
    for label, by_kind in timed.items():
        print(f"   {label}:")
        for kind, ts in by_kind.items():
            print(f"     {kind:<12} {summary(ts)}")
        print(f"     {'all':<12} {summary([t for ts in by_kind.values() for t in ts])}")
    j = sorted(jitter)
    print(
        f"   the same work every call (a fixed loop, timed between the decisions): {summary(jitter)};"
        f" p99 / p50 {j[int(len(j) * 0.99)] / max(1, j[len(j) // 2]):.2f}: this machine's own tail"
    )
    print(f"   (a timer call, {overhead / 1000:.2f} us, is subtracted)")


def _fixed_work(target_ns: int) -> Callable[[], int]:
    """A function doing the same pure-Python work on every call, taking about `target_ns` (median)."""

    def loop(n: int) -> int:
        s = 0
        for i in range(n):
            s += i
        return s

    n = 1000
    took = sorted(cpu_ns(lambda: loop(n)) for _ in range(301))[150]
    n = max(1, round(n * target_ns / max(1, took)))
    return lambda: loop(n)


def _with_prompt(features: RequestFeatures, prompt: Any) -> RequestFeatures:
    import dataclasses

    return dataclasses.replace(features, prompt=prompt)


# -- 5. the fleet's snapshot per request ------------------------------------------------------------
def bench_snapshot(requests: int) -> None:
    from gateway.core.fleet import Fleet
    from gateway.core.settings import BackendSettings, HealthSettings, PoolSettings
    from policies.shared_load import WithOthers, with_others

    print(
        "\n5. The fleet as routing sees it, per request (Fleet.snapshot + the other processes' figures), CPU"
    )
    for per_pool in (4, 16):
        pools = [
            PoolSettings(
                name=engine,
                dialect=engine,  # type: ignore[arg-type]
                models={MODEL: MODEL},
                backends=[
                    BackendSettings(name=f"{engine}-{i}", url=f"http://127.0.0.1:{9000 + i}")
                    for i in range(per_pool)
                ],
            )
            for engine in ("vllm", "sglang")
        ]
        fleet = Fleet(pools, HealthSettings(), 5.0)
        names = list(fleet.backends)
        rng = random.Random(5)
        others = {n: rng.randrange(1, 5) for n in names}
        prefill = {n: rng.randrange(1, 3000) for n in names[::2]}
        added = WithOthers()

        def remembered(now: float, f: Any = fleet, o: Any = others, q: Any = prefill, a: Any = added) -> Any:
            return a(f.snapshot(now), o, q)

        def anew(now: float, f: Any = fleet, o: Any = others, q: Any = prefill) -> Any:
            return with_others(f.snapshot_anew(now), o, q)

        ways = {"remembered": remembered, "built anew": anew}
        timed: dict[str, list[int]] = {label: [] for label in ways}
        for _ in range(requests):
            backend = fleet.backends[rng.choice(names)]
            backend.in_flight = rng.randrange(4)
            now = time.monotonic()
            for label in rng.sample(list(ways), 2):
                way = ways[label]
                timed[label].append(cpu_ns(lambda w=way, n=now: w(n)))
        print(f"   {2 * per_pool} backends:")
        for label, ts in timed.items():
            print(f"     {label:<11} {summary(ts)}")


# -- 4. the event loop while requests are tokenized -------------------------------------------------
def bench_loop_lag(tok: HfTokenizer, requests: int) -> None:
    """A probe task on the event loop asks for a 1 ms sleep over and over while first turns (new
    3.5k-token chats, and new 10k-token documents) are tokenized by the route stage's call, inline
    (`PromptTokens.blocks`, as before) and with the worker thread (`blocks_async`): how late the
    probe wakes is how long every other stream of the process was held up. Then the cost of the
    async path where it stays inline (a later turn, its pieces cached): CPU per call against
    `blocks`."""
    import asyncio

    print(
        f"\n4. The event loop while first turns are tokenized ({requests} requests at once, half new"
        " chats, half new documents): a probe's lateness on a 1 ms sleep, wall"
    )
    rng = random.Random(4)
    system = prose(rng, 220)

    def bodies(seed: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i in range(requests):
            r = random.Random(seed + i)
            if i % 2:
                doc = prose(r, 12000)
                out.append({"model": MODEL, "messages": [{"role": "user", "content": doc + "\n\nWhy?"}]})
            else:
                out.append({"model": MODEL, "messages": conversation(r, system, 13), "tools": TOOLS})
        return out

    async def run(
        tokens: PromptTokens, batch: list[dict[str, Any]], threaded: bool
    ) -> tuple[list[float], float, int]:
        lags: list[float] = []
        done = False

        async def probe() -> None:
            while not done:
                t0 = time.perf_counter()
                await asyncio.sleep(0.001)
                lags.append(time.perf_counter() - t0 - 0.001)

        async def one(body: dict[str, Any]) -> None:
            await asyncio.sleep(0)
            if threaded:
                await tokens.blocks_async(body, 1)
            else:
                tokens.blocks(body, 1)

        task = asyncio.create_task(probe())
        await asyncio.sleep(0.01)
        cpu0 = time.thread_time_ns()
        t0 = time.perf_counter()
        await asyncio.gather(*(one(b) for b in batch))
        wall = time.perf_counter() - t0
        cpu = time.thread_time_ns() - cpu0
        done = True
        await task
        return lags, wall, cpu

    for label, threaded in (("inline (blocks)", False), ("worker thread (blocks_async)", True)):
        tokens = PromptTokens({MODEL: tok})
        lags, wall, cpu = asyncio.run(run(tokens, bodies(7000 if threaded else 8000), threaded))
        tokens.close()
        lags.sort()
        worst = lags[-1] * 1000
        p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))] * 1000
        print(
            f"   {label:<30} probe late by max {worst:6.2f} ms, p99 {p99:6.2f} ms ({len(lags)} wake-ups);"
            f" all tokenized in {wall * 1000:6.1f} ms wall, {cpu / 1e6:6.1f} ms CPU of the loop's thread"
            f" ({tokens.offloaded} in the worker)"
        )

    # the cached path: a later turn, inline either way; the async call's own cost (two caches in
    # the same state, each asked the same turns, the order alternated)
    base = conversation(random.Random(9), system, 13)
    one, two = PromptTokens({MODEL: tok}), PromptTokens({MODEL: tok})
    for tokens in (one, two):
        tokens.blocks({"model": MODEL, "messages": base, "tools": TOOLS}, 2)
    sync_ns: list[int] = []
    async_ns: list[int] = []

    async def later() -> None:
        for r in range(max(100, requests * 10)):
            grown = {"model": MODEL, "tools": TOOLS, "messages": [*base, {"role": "assistant", "content": "ok"},
                     {"role": "user", "content": prose(random.Random(r), 40)}]}  # fmt: skip
            a, b = (one, two) if r % 2 else (two, one)
            t0 = time.thread_time_ns()
            await a.blocks_async(grown, 2)
            async_ns.append(time.thread_time_ns() - t0)
            t0 = time.thread_time_ns()
            b.blocks(grown, 2)
            sync_ns.append(time.thread_time_ns() - t0)

    asyncio.run(later())
    print(f"   later turn, blocks (inline)           {summary(sync_ns)}")
    print(f"   later turn, blocks_async (inline)     {summary(async_ns)}")
    one.close()
    two.close()


# -- 3. memory ------------------------------------------------------------------------------------
def _feed(index: KvIndex, backends: int, events: int, capacity: int, removals: bool, seed: int = 3) -> None:
    """Each backend's engine serves requests (one of 16 shared 512-token system prompts, then 32-256
    blocks of its own), announcing each as one BlockStored; with `removals` it evicts its oldest
    requests' blocks beyond `capacity` (BlockRemoved), else those removals are lost."""
    rng = random.Random(seed)
    pool = [[rng.randrange(1, 150_000) for _ in range(16)] for _ in range(4096)]  # block contents
    shared = [[t for _ in range(32) for t in rng.choice(pool)] for _ in range(16)]
    next_hash = 1
    for b in range(backends):
        name = f"b{b}"
        index.attach(name)
        index.set_live(name, True)
        held: deque[list[int]] = deque()
        count = stored = 0
        while stored < events:
            head = rng.choice(shared)
            own = [t for _ in range(rng.randrange(32, 257)) for t in rng.choice(pool)]
            n = (len(head) + len(own)) // 16
            hashes = list(range(next_hash, next_hash + n))
            next_hash += n
            index.stored(name, hashes, None, head + own, 16)
            stored += n
            if removals:
                held.append(hashes)
                count += n
                while count > capacity:  # the engine evicts its oldest request's blocks
                    gone = held.popleft()
                    count -= len(gone)
                    index.removed(name, gone)


def bench_memory(events: int, backends: int, capacity: int, max_blocks: int) -> None:
    print(
        f"\n3. Index memory, {backends} backends x {events:,} block stores each (16-token blocks),"
        f" engine capacity {capacity:,} blocks, index bound max_blocks {max_blocks:,}"
    )
    for label, removals in (("engines' removals delivered", True), ("every removal lost", False)):
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        index = KvIndex(KvIndexConfig(max_blocks=max_blocks))
        _feed(index, backends, events, capacity, removals)
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        blocks = sum(index.holds(f"b{b}") for b in range(backends))
        print(
            f"   {label:<30} {used / 2**20:8.1f} MiB for {blocks:,} engine blocks and {len(index):,} keys"
            f" ({used / max(1, blocks):.0f} B a block)"
        )
        del index
    sample = min(events, 200_000)
    index = KvIndex(KvIndexConfig(max_blocks=max_blocks))
    t0 = time.thread_time_ns()
    _feed(index, 1, sample, capacity, True, seed=4)
    cpu = time.thread_time_ns() - t0
    print(
        f"   ingest (the workload's own generation included): {cpu / sample / 1000:.2f} us CPU a block stored"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.kv_micro", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, 100k events per backend")
    ap.add_argument("--backends", type=int, default=8)
    ap.add_argument("--events", type=int, default=None, help="block stores per backend (default 1M)")
    ap.add_argument("--capacity", type=int, default=32768, help="each engine's KV capacity in blocks")
    ap.add_argument("--max-blocks", type=int, default=KvIndexConfig().max_blocks, help="the index's bound")
    ap.add_argument("--match-tokens", type=int, action="append", help="PromptTokens' max_tokens (repeatable)")
    ap.add_argument(
        "--section",
        type=int,
        choices=(1, 2, 3, 4, 5),
        action="append",
        help="run only this table (repeatable; default all): 1 tokenization, 2 the decision, 3 memory,"
        " 4 the loop, 5 the fleet's snapshot",
    )
    args = ap.parse_args(argv)
    events = args.events or (100_000 if args.quick else 1_000_000)
    sections = set(args.section or (1, 2, 3, 4, 5))
    import policies

    compiled = "compiled (mypyc)" if policies.NATIVE else "from their sources"
    print(
        f"bench.kv_micro on Python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M')},"
        f" policies {compiled}"
    )
    if sections & {1, 2, 4}:
        with tempfile.TemporaryDirectory() as tmp:
            tok = build_tokenizer(Path(tmp))
            if 1 in sections:
                bench_tokenization(tok, 30 if args.quick else 200)
            if 2 in sections:
                for match_tokens in args.match_tokens or [PromptTokens({}).max_tokens]:
                    bench_decision(tok, 5_000 if args.quick else 50_000, args.backends, match_tokens)
            if 4 in sections:
                bench_loop_lag(tok, 8 if args.quick else 16)
    if 3 in sections:
        bench_memory(events, args.backends, args.capacity, args.max_blocks)
    if 5 in sections:
        bench_snapshot(2_000 if args.quick else 20_000)


if __name__ == "__main__":
    main()
