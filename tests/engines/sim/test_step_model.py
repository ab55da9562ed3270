"""The batching engine as a pure step model (engines/sim/step_model.py): budgets, chunked prefill,
the waiting queue's order, preemption and retraction, KV capacity, the step cost, block events.
Virtual time only: nothing here sleeps or reads a clock."""

from __future__ import annotations

import pytest

from engines.sim.step_model import (
    Batch,
    BatchConfig,
    ClearedBlocks,
    RemovedBlocks,
    Seq,
    StepCosts,
    StepEngine,
    StoredBlocks,
)

pytestmark = pytest.mark.processes

COSTS = StepCosts(fixed_s=0.010, prefill_token_s=1e-4, decode_seq_s=1e-3, context_token_s=1e-6)


def prompt(tag: int, n: int) -> list[int]:
    return [tag * 10_000 + k for k in range(n)]


def seq(i: int, n: int, out: int = 4, tag: int | None = None, **kw: object) -> Seq:
    return Seq(
        i,
        prompt(i if tag is None else tag, n),
        out,
        output_ids=[900_000 + i * 100 + k for k in range(out)],
        **kw,
    )  # type: ignore[arg-type]


def engine(**kw: object) -> StepEngine:
    base: dict[str, object] = {"block_size": 4, "num_blocks": 256, "costs": COSTS}
    base.update(kw)
    return StepEngine(BatchConfig(**base))  # type: ignore[arg-type]


def run(e: StepEngine, limit: int = 10_000) -> list[tuple[Batch, list[Seq], list[Seq]]]:
    """Step until idle; each step's batch, emitted and finished sequences."""
    out = []
    while e.busy and limit:
        limit -= 1
        b = e.schedule()
        assert b is not None, "a busy engine must schedule something"
        r = e.complete(b)
        out.append((b, r.emitted, r.finished))
    assert not e.busy
    return out


def test_step_cost_is_the_linear_formula() -> None:
    e = engine(max_num_batched_tokens=64)
    e.add(seq(1, 40, out=3))
    b = e.schedule()
    assert b is not None and b.prefill_tokens == 40 and b.decode_seqs == 0 and b.context_tokens == 40
    assert b.duration_s == pytest.approx(0.010 + 40 * 1e-4 + 40 * 1e-6)
    e.complete(b)
    e.add(seq(2, 10, out=3))
    b = e.schedule()  # seq 1 decodes (41 tokens of context after the step), seq 2 prefills 10
    assert b is not None and (b.prefill_tokens, b.decode_seqs, b.context_tokens) == (10, 1, 41 + 10)
    assert b.duration_s == pytest.approx(0.010 + 10 * 1e-4 + 1e-3 + 51 * 1e-6)


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
def test_token_budget_per_step_and_chunked_prefill(flavour: str) -> None:
    """A 200-token prompt on a 64-token budget prefills in chunks 64, 64, 64, 8 and emits its first
    token at the end of the fourth step; no step computes more than the budget."""
    e = engine(flavour=flavour, max_num_batched_tokens=64, chunked_prefill_size=64)
    e.add(seq(1, 200, out=2))
    steps = run(e)
    chunks = [n for b, _, _ in steps for _, n in b.work]
    assert chunks[:4] == [64, 64, 64, 8]
    first = next(k for k, (_, emitted, _) in enumerate(steps) if emitted)
    assert first == 3
    assert all(sum(n for _, n in b.work) <= 64 for b, _, _ in steps)


def test_vllm_without_chunked_prefill_runs_a_long_prompt_whole() -> None:
    e = engine(max_num_batched_tokens=64, chunked_prefill=False)
    e.add(seq(1, 200, out=2))
    b = e.schedule()
    assert b is not None and b.work[0][1] == 200  # alone, past the budget (vLLM would refuse to start)


def test_vllm_runs_decodes_first_then_prefill_chunks_in_the_same_step() -> None:
    """vLLM: running decodes are scheduled before a waiting request's prefill, which takes what is
    left of the budget; the decodes do not wait for it."""
    e = engine(max_num_batched_tokens=32)
    for i in (1, 2):
        e.add(seq(i, 8, out=10))
    e.complete(e.schedule())  # type: ignore[arg-type]  # both prefill (16 tokens) and emit
    e.add(seq(3, 100, out=2))
    b = e.schedule()
    assert b is not None
    assert [(s.id, n) for s, n in b.work] == [(1, 1), (2, 1), (3, 30)]
    assert b.decode_seqs == 2 and b.prefill_tokens == 30


def test_sglang_runs_prefill_batches_alone_and_first() -> None:
    """SGLang (no --enable-mixed-chunk): a step is a prefill batch or a decode batch; while a new
    request prefills, the running ones do not decode."""
    e = engine(flavour="sglang", chunked_prefill_size=32)
    for i in (1, 2):
        e.add(seq(i, 8, out=10))
    e.complete(e.schedule())  # type: ignore[arg-type]
    e.add(seq(3, 100, out=2))
    kinds = []
    while True:
        b = e.schedule()
        assert b is not None
        kinds.append("prefill" if b.prefill_tokens else "decode")
        assert not (b.prefill_tokens and b.decode_seqs)
        result = e.complete(b)
        if any(s.id == 3 for s in result.emitted):
            break
    assert kinds == ["prefill"] * 4  # 32 + 32 + 32 + 4 tokens, the decodes stalled meanwhile
    b = e.schedule()
    assert b is not None and b.decode_seqs == 3


def warm(e: StepEngine, tag: int, n: int) -> None:
    """Run one request with prompt `prompt(tag, n)` to completion (its blocks stay cached)."""
    e.add(Seq(99_000 + tag, prompt(tag, n), 1))
    run(e)


@pytest.mark.parametrize(("policy", "first"), [("lpm", 2), ("fcfs", 1)])
def test_sglang_lpm_admits_the_longest_cached_prefix_first(policy: str, first: int) -> None:
    """With `--schedule-policy lpm` the waiting request whose prompt is cached runs before an earlier
    one that is not; fcfs keeps arrival order. The prefill budget fits one request a step."""
    e = engine(flavour="sglang", chunked_prefill_size=64, max_prefill_tokens=64, schedule_policy=policy)
    warm(e, tag=7, n=60)
    e.add(Seq(1, prompt(1, 60), 2))  # nothing cached
    e.add(Seq(2, prompt(7, 60), 2))  # 56 of its tokens cached
    b = e.schedule()
    assert b is not None and b.work[0][0].id == first


def test_sglang_lpm_is_fcfs_beyond_128_waiting() -> None:
    e = engine(flavour="sglang", chunked_prefill_size=64, max_prefill_tokens=64, schedule_policy="lpm")
    warm(e, tag=7, n=60)
    for i in range(1, 130):
        e.add(Seq(i, prompt(1000 + i, 60), 2))
    e.add(Seq(500, prompt(7, 60), 2))  # cached, but 130 wait: SGLang stops matching prefixes
    b = e.schedule()
    assert b is not None and b.work[0][0].id == 1


def test_kv_capacity_bounds_the_running_batch() -> None:
    """vLLM admits waiting requests while their blocks fit: 10 prompts of 40 tokens (10 blocks of 4)
    in a 48-block pool run 4 at a time (the fifth does not fit)."""
    e = engine(num_blocks=48, max_num_batched_tokens=4096)
    for i in range(10):
        e.add(seq(i, 40, out=2))
    b = e.schedule()
    assert b is not None and len(b.work) == 4 and len(e.waiting) == 6
    assert e.kv_usage == pytest.approx(40 / 48)
    assert max(len(b.work) for b, _, _ in run(e)) <= 4


def test_vllm_preempts_the_newest_running_request() -> None:
    """When a decode needs a block and none is free, the newest running request is preempted
    (recompute: its blocks freed, back to the front of the queue) and later finishes."""
    e = engine(num_blocks=12, max_num_batched_tokens=4096)
    e.add(seq(1, 16, out=12))
    e.add(seq(2, 16, out=12))  # 4 blocks each now, 3 more each as they decode: 14 > 12
    steps = run(e)
    preempted = [s.id for b, _, _ in steps for s in b.preempted]
    assert preempted and set(preempted) == {2}
    assert e.preemptions_total == len(preempted)
    done = [s.id for _, _, fin in steps for s in fin]
    assert sorted(done) == [1, 2] and done[0] == 1  # the older one was never interrupted


def test_sglang_retracts_the_request_with_the_fewest_output_tokens() -> None:
    e = engine(flavour="sglang", num_blocks=14, chunked_prefill_size=4096)
    e.add(seq(1, 16, out=14))
    steps = []
    for _ in range(4):  # seq 1 decodes a few tokens first
        b = e.schedule()
        assert b is not None
        e.complete(b)
    e.add(seq(2, 15, out=14))
    steps = run(e)
    retracted = [s.id for b, _, _ in steps for s in b.preempted]
    assert retracted and set(retracted) == {2}
    assert e.preemptions_total == len(retracted)


def test_prefix_hit_shortens_prefill_and_the_last_token_is_computed() -> None:
    e = engine()
    warm(e, tag=5, n=40)  # 10 full blocks cached
    e.add(Seq(1, prompt(5, 40), 2))
    b = e.schedule()
    assert b is not None and b.work[0][1] == 4  # the last block is computed again (vLLM's rule)
    assert b.work[0][0].cached_tokens == 36
    e.add(Seq(2, prompt(5, 30) + prompt(6, 10), 2))  # shares 7 full blocks
    e.complete(b)
    b = e.schedule()
    assert b is not None and dict((s.id, n) for s, n in b.work)[2] == 40 - 28
    assert e.prompt_tokens_hit == 36 + 28


def test_cached_blocks_count_against_capacity_and_are_evicted_last_released_first() -> None:
    e = engine(num_blocks=16, record_events=True)
    warm(e, tag=1, n=32)  # 8 blocks cached, unpinned
    assert e.cache.used_blocks == 8 and e.cache.free_blocks == 16
    e.add(Seq(2, prompt(2, 48), 1))  # 12 blocks: 8 empty + 4 evicted
    b = e.schedule()
    assert b is not None
    removed = [k for ev in e.complete(b).events if isinstance(ev, RemovedBlocks) for k in ev.keys]
    first_keys = Seq(0, prompt(1, 32), 1)
    engine_keys = [e._key(first_keys, i) for i in range(8)]
    assert removed == engine_keys[::-1][:4]  # the first request's last blocks went first
    e.add(Seq(3, prompt(1, 32), 1))
    b = e.schedule()
    assert b is not None and b.work[0][0].cached_tokens == 16  # its first 4 blocks are still there


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
def test_blocks_are_stored_as_they_fill(flavour: str) -> None:
    """vLLM caches a block (a stored event, published with the step's results) in the step that
    fills it, during decode too; SGLang caches the prompt's blocks after its prefill and the output's
    when the request ends."""
    e = engine(flavour=flavour, record_events=True)
    s = seq(1, 10, out=9)  # prompt: 2 full blocks + 2 tokens; 8 output tokens get KV: 18 tokens
    e.add(s)
    stored: list[tuple[int, list[int]]] = []
    step = 0
    while e.busy:
        b = e.schedule()
        assert b is not None
        for ev in e.complete(b).events:
            assert isinstance(ev, StoredBlocks)
            stored.append((step, ev.keys))
        step += 1
    all_keys = [k for _, keys in stored for k in keys]
    assert len(all_keys) == 18 // 4
    assert stored[0] == (0, all_keys[:2])  # the prompt's full blocks, right after the prefill
    if flavour == "vllm":
        assert [step for step, _ in stored] == [0, 2, 6]  # blocks 3, 4 filled by the 2nd and 6th decode
    else:
        assert [step for step, _ in stored] == [0, 8]  # the output's blocks when it finished
    ev0 = StoredBlocks(all_keys[:2], None, prompt(1, 8), None, None)
    assert stored and ev0.token_ids == s.tokens[:8]


def test_vllm_caches_a_block_when_it_schedules_it() -> None:
    """vLLM caches the full blocks a step will compute when it schedules the step (`allocate_slots`),
    so a request scheduled later in the same step hits them (as the real vLLM 0.32 does:
    tests/real_engines/test_prefix_cache_timing.py); their stored event comes with the step's results.
    SGLang (FCFS) forms its prefill batch from what its tree held before: both compute the prompt."""
    e = engine(record_events=True)
    first, second = Seq(1, prompt(7, 40), 2), Seq(2, prompt(7, 40), 2)
    e.add(first)
    e.add(second)
    b = e.schedule()
    assert b is not None and [(s.id, n) for s, n in b.work] == [(1, 40), (2, 4)]
    assert (first.cached_tokens, second.cached_tokens) == (0, 36)
    stored = [ev for ev in e.complete(b).events if isinstance(ev, StoredBlocks)]
    assert [k for ev in stored for k in ev.keys] == [e._key(first, i) for i in range(10)]  # once

    e = engine(flavour="sglang")
    first, second = Seq(1, prompt(7, 40), 2), Seq(2, prompt(7, 40), 2)
    e.add(first)
    e.add(second)
    b = e.schedule()
    assert b is not None and [(s.id, n) for s, n in b.work] == [(1, 40), (2, 40)]


def test_reset_clears_only_an_idle_engine() -> None:
    e = engine(record_events=True)
    e.add(seq(1, 16, out=20))
    e.complete(e.schedule())  # type: ignore[arg-type]
    assert not e.reset_cache()  # a request runs: vLLM's and SGLang's resets refuse
    run(e)
    assert e.reset_cache() and e.cache.used_blocks == 0
    assert e.take_events() == [ClearedBlocks()]


def test_abort_frees_the_blocks_and_leaves_the_queue() -> None:
    e = engine(num_blocks=15)
    e.add(seq(1, 40, out=5))
    e.add(seq(2, 40, out=5))
    b = e.schedule()
    assert b is not None and len(b.work) == 1 and len(e.waiting) == 1
    running, waiting = e.running[0], e.waiting[0]
    e.abort(waiting)
    e.abort(running)
    assert e.complete(b).emitted == []  # the step it was in does not count for it
    assert not e.busy and e.cache.held_blocks == 0
