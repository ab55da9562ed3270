"""The batching engine: continuous batching in steps, as a pure model (no asyncio, no clock).

    engine = StepEngine(BatchConfig(flavour="vllm", ...))
    engine.add(Seq(0, prompt_ids, out_len=16))
    batch = engine.schedule()          # what the next step runs and how long it takes (None: idle)
    ...                                # wait batch.duration_s: real time (batch_runner.py) or virtual
    result = engine.complete(batch)    # (bench/replay.py); the step's tokens, finished sequences, events

One implementation drives the simulators (real time) and the offline replay (virtual time).

**A step** runs a batch of sequences, each computing some tokens: a decode computes one, a prefill
chunk up to the token budget. It takes `StepCosts.seconds(prefill_tokens, decode_seqs,
context_tokens)` = a + b·prefill tokens + c·decode sequences + d·context tokens (every scheduled
sequence's tokens in KV after the step). A sequence emits its next token at the end of the step in
which its KV reaches its prompt plus the tokens it has emitted (so the last prefill chunk emits the
first token), and finishes after `out_len` tokens.

**vLLM flavour** (`vllm/v1/core/sched/scheduler.py`, `schedule`): each step has a budget of
`max_num_batched_tokens`. Running sequences first, in order: a decode takes one token, an unfinished
prefill the rest of its prompt up to the budget; when the KV pool has no free block for one of them,
the newest running sequence is preempted (recompute: its blocks are freed, its computed blocks stay
cached, it goes back to the front of the queue), again until it fits. Then, unless something was
preempted this step, waiting sequences in FCFS order while fewer than `max_num_seqs` run and budget
is left: prefix-cache lookup, the uncached part chunked to the budget (chunked prefill), admitted if
its blocks fit. A block is cached (and a KV event recorded) when a step that fills it is scheduled,
during decode too, as vLLM's `KVCacheManager.allocate_slots` does: a request scheduled later in the
same step hits it (measured on the real vLLM 0.32, tests/real_engines); the events are published with
the step's results, after it ran, as vLLM's `update_from_output` does.

**SGLang flavour** (`sglang/srt/managers/scheduler.py`, `schedule_policy.py`): a step is either a
prefill batch or a decode batch, never both (SGLang's default, without `--enable-mixed-chunk`), and a
prefill batch goes first whenever one can be formed. The waiting queue is ordered by
`--schedule-policy` (`fcfs`; `lpm`: longest cached prefix first, FCFS beyond 128 waiting requests,
with SGLang's in-batch rule that defers a request sharing ≥ 32 uncached tokens with one ahead of it).
A prefill batch takes at most `chunked_prefill_size` new tokens (the one request that does not fit is
chunked and continues first next time) and `max_prefill_tokens`, and admits a request only if the
free pool covers its uncached prompt plus a reserve for every running and new request's remaining
output (`min(max_new_tokens - generated, 4096) × new_token_ratio`; the ratio starts at 0.7 and
decays to 0.7 × 0.14 over 600 decode steps). A decode batch advances every running request by one
token; when the pool cannot hold the new tokens, requests are retracted (fewest output tokens first,
then longest input) to the end of the queue, and the ratio becomes (tokens decoded + 20 per kept
request) / their `max_new_tokens`. Prompt blocks are
cached after each prefill chunk, output blocks when the request finishes (`release_kv_cache`).

A sequence that alone needs more blocks than the whole pool still runs, alone (the pool runs over
capacity); the real engines refuse to start when `max_model_len` does not fit their KV cache.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from engines.sim.prefix_cache import LoraRequest, PrefixCache, chain_seed, next_key, usable_hit

Flavour = Literal["vllm", "sglang"]
SchedulePolicy = Literal["fcfs", "lpm"]
SCHEDULE_POLICIES: tuple[SchedulePolicy, ...] = ("fcfs", "lpm")
State = Literal["waiting", "running", "finished", "aborted"]

LPM_MAX_QUEUE = 128  # SGLang WAITING_QUEUE_PREFIX_MATCH_MAX: beyond it lpm falls back to fcfs
LPM_IN_BATCH_TOKENS = 32  # SGLang IN_BATCH_PREFIX_CACHING_CHECK/DEPRIORITIZE_THRESHOLD
CLIP_MAX_NEW_TOKENS = 4096  # SGLang SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS


@dataclass(frozen=True, slots=True)
class StepCosts:
    """t = fixed + prefill_token × prefill tokens + decode_seq × decode sequences + context_token ×
    context tokens (seconds). Defaults: Llama-3.1-8B on one H100 (docs/simulators.md, with sources)."""

    fixed_s: float = 6.5e-3
    prefill_token_s: float = 22.8e-6
    decode_seq_s: float = 20e-6
    context_token_s: float = 39e-9

    def seconds(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        """Duration of one step."""
        return (
            self.fixed_s
            + self.prefill_token_s * prefill_tokens
            + self.decode_seq_s * decode_seqs
            + self.context_token_s * context_tokens
        )


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """The engine's scheduling knobs, named after the engines' flags."""

    flavour: Flavour = "vllm"
    num_blocks: int = 27_000  # vLLM num_gpu_blocks; SGLang max_total_num_tokens / page_size
    block_size: int = 16
    max_num_seqs: int = 256  # SGLang --max-running-requests
    max_num_batched_tokens: int = 8192  # vLLM: the per-step token budget
    chunked_prefill: bool = True  # vLLM --enable-chunked-prefill
    chunked_prefill_size: int = 8192  # SGLang; <= 0 disables chunking
    max_prefill_tokens: int = 16384  # SGLang
    schedule_policy: SchedulePolicy = "fcfs"
    prefix_caching: bool = True
    new_token_ratio: float = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
    costs: StepCosts = field(default_factory=StepCosts)
    record_events: bool = False  # collect KV-cache events (stored / removed / cleared blocks)


class Seq:
    """One request inside the engine. `tokens` holds the prompt and then the output token ids (at
    least `out_len - 1` of them, for the blocks the output fills); `tag` is the driver's handle."""

    __slots__ = (
        "admitted",
        "cache_salt",
        "cached_tokens",
        "computed",
        "generated",
        "held",
        "id",
        "keys",
        "lora",
        "max_new",
        "order",
        "out_len",
        "preemptions",
        "private",
        "prompt_len",
        "session_id",
        "state",
        "tag",
        "tokens",
    )

    def __init__(
        self,
        seq_id: int,
        prompt: list[int],
        out_len: int,
        *,
        output_ids: list[int] | None = None,
        max_new: int | None = None,
        cache_salt: str | None = None,
        lora: LoraRequest | None = None,
        session_id: str | None = None,
        tag: object = None,
    ) -> None:
        self.id = seq_id
        self.prompt_len = len(prompt)
        self.out_len = max(1, out_len)
        outs = list(output_ids or [])
        if len(outs) < self.out_len:
            outs += [0] * (self.out_len - len(outs))  # the blocks the output fills need token ids
        self.tokens = prompt + outs
        self.max_new = max_new if max_new is not None else self.out_len
        self.cache_salt = cache_salt
        self.lora = lora
        self.session_id = session_id
        self.tag = tag
        self.state: State = "waiting"
        self.computed = 0  # tokens whose KV is computed
        self.generated = 0  # output tokens emitted
        self.held = 0  # leading blocks held as pinned cache keys
        self.private = 0  # blocks held without a key (being computed, or the partial last block)
        self.keys: list[int] = []  # chained keys of the full blocks of `tokens`, extended lazily
        self.cached_tokens = 0  # usable prefix hit at its first admission
        self.admitted = False
        self.preemptions = 0
        self.order = 0

    @property
    def target(self) -> int:
        """Tokens that must be in KV before the next token is emitted."""
        return self.prompt_len + self.generated

    @property
    def blocks(self) -> int:
        return self.held + self.private


@dataclass(frozen=True, slots=True)
class StoredBlocks:
    """Full blocks just cached: `keys[i]` holds `token_ids[i*bs:(i+1)*bs]`; `parent` is the key of
    the block before the first (None: the request's first block)."""

    keys: list[int]
    parent: int | None
    token_ids: list[int]
    cache_salt: str | None
    session_id: str | None
    lora: LoraRequest | None = None


@dataclass(frozen=True, slots=True)
class RemovedBlocks:
    """Cached blocks evicted (or dropped by a cache reset while requests run)."""

    keys: list[int]


@dataclass(frozen=True, slots=True)
class ClearedBlocks:
    """The whole prefix cache was reset."""


BlockEvent = StoredBlocks | RemovedBlocks | ClearedBlocks


@dataclass(slots=True)
class Batch:
    """One scheduled step: every `(sequence, tokens it computes)`, and what it costs."""

    work: list[tuple[Seq, int]]
    prefill_tokens: int
    decode_seqs: int
    context_tokens: int
    duration_s: float
    admitted: list[Seq]  # sequences scheduled for the first time (their queue time ends)
    preempted: list[Seq]  # preempted (vLLM) or retracted (SGLang) while scheduling it


@dataclass(slots=True)
class StepResult:
    """What a completed step produced."""

    emitted: list[Seq]  # one more token each (`generated` already counts it)
    finished: list[Seq]
    events: list[BlockEvent]


class StepEngine:
    """The scheduler, the KV block pool (`PrefixCache`) and the sequences of one engine."""

    def __init__(self, cfg: BatchConfig) -> None:
        self.cfg = cfg
        self.block_size = cfg.block_size
        self.cache = PrefixCache(cfg.block_size, cfg.num_blocks, cfg.prefix_caching)
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self._events: list[BlockEvent] = []
        if cfg.record_events:
            self.cache.on_evict = self._evicted
        self._order = 0
        self._ratio = cfg.new_token_ratio
        self._min_ratio = cfg.new_token_ratio * MIN_NEW_TOKEN_RATIO_FACTOR
        self._ratio_decay = (cfg.new_token_ratio - self._min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self._chunked: Seq | None = None  # SGLang: the request whose prefill continues next
        self.steps = 0
        self.preemptions_total = 0
        self.prompt_tokens_queried = 0  # prefix-cache queries, in tokens (at first admission)
        self.prompt_tokens_hit = 0

    # ---- the public surface --------------------------------------------------------------------
    def add(self, seq: Seq) -> None:
        """Queue a new sequence."""
        self._order += 1
        seq.order = self._order
        seq.state = "waiting"
        self.waiting.append(seq)

    def abort(self, seq: Seq) -> None:
        """Drop a sequence (its client went away): out of the queue, or its blocks freed."""
        if seq.state == "waiting":
            self.waiting.remove(seq)
        elif seq.state == "running":
            self.running.remove(seq)
            if self._chunked is seq:
                self._chunked = None
            self._release(seq, commit_output=False)
        seq.state = "aborted"

    @property
    def busy(self) -> bool:
        """Anything running or waiting."""
        return bool(self.running or self.waiting)

    @property
    def kv_usage(self) -> float:
        """Blocks held by running sequences over the pool, 0–1 (cached but unpinned blocks are free,
        as vLLM's `kv_cache_usage_perc` and SGLang's `token_usage` count them)."""
        cap = self.cache.capacity
        return min(1.0, self.cache.held_blocks / cap) if cap else 0.0

    @property
    def running_tokens(self) -> int:
        """Tokens in KV of the running sequences (SGLang `/get_load` `num_tokens`)."""
        return sum(s.computed for s in self.running)

    def schedule(self) -> Batch | None:
        """Plan the next step (allocating its blocks); None when there is nothing to run."""
        if self.cfg.flavour == "vllm":
            return self._schedule_vllm()
        return self._schedule_sglang()

    def complete(self, batch: Batch) -> StepResult:
        """Apply a step's effects: computed tokens, cached blocks, emitted tokens, finished sequences."""
        self.steps += 1
        vllm = self.cfg.flavour == "vllm"
        caching = self.cache.enabled
        bs = self.block_size
        emitted: list[Seq] = []
        finished: list[Seq] = []
        for seq, n in batch.work:
            if seq.state != "running":
                continue  # aborted while the step ran
            seq.computed += n
            if caching and not vllm and seq.computed <= seq.prompt_len:
                self._commit(seq, seq.computed // bs)  # vLLM cached them when it scheduled them
            if seq.computed == seq.target:
                seq.generated += 1
                emitted.append(seq)
                if seq.generated >= seq.out_len:
                    finished.append(seq)
        if not vllm and batch.decode_seqs:
            self._ratio = max(self._min_ratio, self._ratio - self._ratio_decay)
        for seq in finished:
            self.running.remove(seq)
            if self._chunked is seq:
                self._chunked = None
            self._release(seq, commit_output=not vllm)
            seq.state = "finished"
        events, self._events = self._events, []
        return StepResult(emitted, finished, events)

    def reset_cache(self) -> bool:
        """Reset the prefix cache (vLLM `/reset_prefix_cache`, SGLang `/flush_cache`): only when no
        request is running or waiting, as both engines do; returns whether it was reset. The
        simulator's `/sim/reset` uses `drop_unpinned` instead when busy."""
        if self.busy:
            return False
        self.cache.clear()
        if self.cfg.record_events:
            self._events.append(ClearedBlocks())
        return True

    def drop_unpinned(self) -> None:
        """Drop every cached block no running request holds (a busy `/sim/reset`)."""
        if not self.busy:
            self.reset_cache()
            return
        dropped = self.cache.clear()
        if dropped and self.cfg.record_events:
            self._events.append(RemovedBlocks(dropped))

    def take_events(self) -> list[BlockEvent]:
        """Events recorded outside a step (a cache reset)."""
        events, self._events = self._events, []
        return events

    # ---- blocks --------------------------------------------------------------------------------
    def _evicted(self, key: int) -> None:
        self._events.append(RemovedBlocks([key]))

    def _key(self, seq: Seq, i: int) -> int:
        """Key of the sequence's block `i` (its tokens must be known)."""
        keys = seq.keys
        bs = self.block_size
        while len(keys) <= i:
            j = len(keys)
            parent = keys[-1] if keys else chain_seed(seq.cache_salt, seq.lora)
            keys.append(next_key(parent, seq.tokens[j * bs : (j + 1) * bs]))
        return keys[i]

    def _commit(self, seq: Seq, full: int) -> None:
        """Cache the sequence's blocks up to `full` (full, and computed or being computed); each run of
        newly cached blocks is one stored event (a block another sequence cached meanwhile is not
        stored again)."""
        cache = self.cache
        record = self.cfg.record_events
        run: list[int] = []
        start = seq.held
        while seq.held < full:
            i = seq.held
            key = self._key(seq, i)
            if cache.commit(key):
                if not run:
                    start = i
                run.append(key)
            elif run and record:
                self._stored(seq, start, run)
                run = []
            seq.private -= 1
            seq.held += 1
        if run and record:
            self._stored(seq, start, run)

    def _stored(self, seq: Seq, start: int, keys: list[int]) -> None:
        bs = self.block_size
        parent = seq.keys[start - 1] if start else None
        tokens = seq.tokens[start * bs : (start + len(keys)) * bs]
        self._events.append(StoredBlocks(keys, parent, tokens, seq.cache_salt, seq.session_id, seq.lora))

    def _allocate(self, seq: Seq, n: int, force: bool = False) -> bool:
        """Blocks for `n` more tokens of `seq` (beyond those it holds)."""
        need = math.ceil((seq.computed + n) / self.block_size) - seq.blocks
        if need <= 0:
            return True
        if not self.cache.allocate(need, force):
            return False
        seq.private += need
        return True

    def _release(self, seq: Seq, commit_output: bool) -> None:
        cache = self.cache
        if commit_output and cache.enabled:
            self._commit(seq, seq.computed // self.block_size)
        cache.unpin(seq.keys[: seq.held])
        cache.free(seq.private)
        seq.held = seq.private = 0

    def _lookup(self, seq: Seq) -> int:
        """Usable cached blocks for a waiting sequence (its whole `target` prefix)."""
        if not self.cache.enabled:
            return 0
        bs = self.block_size
        target = seq.target
        full = target // bs
        if full:
            self._key(seq, full - 1)
        hit = self.cache.hit_blocks(seq.keys[:full])
        return usable_hit(hit * bs, target, bs) // bs

    def _admit_hit(self, seq: Seq, hit: int) -> None:
        """Pin a waiting sequence's cached blocks and count its lookup."""
        self.cache.pin(seq.keys[:hit])
        seq.held = hit
        seq.computed = hit * self.block_size
        if not seq.admitted:
            seq.cached_tokens = seq.computed
            self.prompt_tokens_queried += seq.prompt_len
            self.prompt_tokens_hit += seq.computed

    def _unadmit(self, seq: Seq) -> None:
        """Undo `_admit_hit` for a sequence that did not fit after all."""
        self.cache.unpin(seq.keys[: seq.held])
        if not seq.admitted:
            self.prompt_tokens_queried -= seq.prompt_len
            self.prompt_tokens_hit -= seq.computed
            seq.cached_tokens = 0
        seq.held = 0
        seq.computed = 0

    def _start(self, seq: Seq, admitted: list[Seq]) -> None:
        seq.state = "running"
        self.running.append(seq)
        if not seq.admitted:
            seq.admitted = True
            admitted.append(seq)

    def _preempt(self, seq: Seq) -> None:
        """Recompute-style: blocks freed (full ones stay cached), back to the queue."""
        self._release(seq, commit_output=False)
        seq.computed = 0
        seq.state = "waiting"
        seq.preemptions += 1
        self.preemptions_total += 1

    def _batch(self, work: list[tuple[Seq, int]], admitted: list[Seq], preempted: list[Seq]) -> Batch | None:
        if not work:
            return None
        prefill = decode = context = 0
        for seq, n in work:
            context += seq.computed + n
            if n == 1 and seq.generated and seq.computed + 1 == seq.target:
                decode += 1
            else:
                prefill += n
        duration = self.cfg.costs.seconds(prefill, decode, context)
        return Batch(work, prefill, decode, context, duration, admitted, preempted)

    # ---- vLLM ----------------------------------------------------------------------------------
    def _schedule_vllm(self) -> Batch | None:
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens
        work: list[tuple[Seq, int]] = []
        admitted: list[Seq] = []
        preempted: list[Seq] = []
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = min(seq.target - seq.computed, budget)
            if n <= 0:
                i += 1
                continue
            fits = self._allocate(seq, n, force=len(running) == 1)
            while not fits:
                victim = running.pop()  # the newest running request
                self._preempt(victim)
                self.waiting.appendleft(victim)
                preempted.append(victim)
                if victim is seq:
                    break
                fits = self._allocate(seq, n, force=len(running) == 1)
            if not fits:
                break
            self._cache_scheduled(seq, n)
            work.append((seq, n))
            budget -= n
            i += 1
        if preempted:
            return self._batch(work, admitted, preempted)
        waiting = self.waiting
        while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            seq = waiting[0]
            hit = self._lookup(seq)
            self._admit_hit(seq, hit)
            n = seq.target - seq.computed
            if n > budget:
                if not cfg.chunked_prefill and work:
                    self._unadmit(seq)
                    break
                n = budget if cfg.chunked_prefill else n
            if not self._allocate(seq, n, force=not running):
                self._unadmit(seq)
                break
            waiting.popleft()
            self._start(seq, admitted)
            self._cache_scheduled(seq, n)
            work.append((seq, n))
            budget -= n
        return self._batch(work, admitted, preempted)

    def _cache_scheduled(self, seq: Seq, n: int) -> None:
        """vLLM caches the full blocks a step is about to compute when it schedules them
        (`KVCacheManager.allocate_slots`), up to the tokens the request has (prompt and emitted
        output), so a request scheduled later in the same step already hits them."""
        if self.cache.enabled:
            self._commit(seq, min(seq.computed + n, seq.prompt_len + seq.generated) // self.block_size)

    # ---- SGLang --------------------------------------------------------------------------------
    def _reserve(self, seq: Seq) -> float:
        """Tokens SGLang sets aside for a request's remaining output."""
        return min(seq.max_new - seq.generated, CLIP_MAX_NEW_TOKENS) * self._ratio

    def _order_waiting(self) -> list[Seq]:
        waiting = list(self.waiting)
        if self.cfg.schedule_policy != "lpm" or len(waiting) > LPM_MAX_QUEUE or not self.cache.enabled:
            return waiting
        bs = self.block_size
        hits = {s.id: self._lookup(s) * bs for s in waiting}
        deferred: set[int] = set()
        seen: set[int] = set()
        probe = max(1, LPM_IN_BATCH_TOKENS // bs)
        for s in waiting:  # SGLang's in-batch prefix rule, at block granularity
            if hits[s.id] <= LPM_IN_BATCH_TOKENS and len(s.keys) >= probe:
                head = s.keys[probe - 1]
                if head in seen:
                    deferred.add(s.id)
                else:
                    seen.add(head)
        return sorted(waiting, key=lambda s: math.inf if s.id in deferred else -hits[s.id])

    def _schedule_sglang(self) -> Batch | None:
        cfg = self.cfg
        chunk_budget = cfg.chunked_prefill_size if cfg.chunked_prefill_size > 0 else math.inf
        input_budget: float = cfg.max_prefill_tokens
        work: list[tuple[Seq, int]] = []
        admitted: list[Seq] = []
        bs = self.block_size
        chunked = self._chunked
        if chunked is not None:
            n = int(min(chunked.target - chunked.computed, chunk_budget))
            self._allocate(chunked, n, force=True)  # its memory was checked when it was admitted
            work.append((chunked, n))
            chunk_budget -= n
            input_budget -= n
            self._chunked = None if chunked.computed + n >= chunked.target else chunked
        if self._chunked is None and self.waiting and chunk_budget > 0 and input_budget > 0:
            reserved = sum(self._reserve(s) for s in self.running)
            for seq in self._order_waiting():
                if len(self.running) >= cfg.max_num_seqs or chunk_budget <= 0 or input_budget <= 0:
                    break
                hit = self._lookup(seq)
                self._admit_hit(seq, hit)
                extend = seq.target - seq.computed
                room = self.cache.free_blocks * bs - reserved
                if extend + self._reserve(seq) > room and self.running:
                    self._unadmit(seq)
                    break
                n = int(min(extend, chunk_budget, input_budget))
                if not self._allocate(seq, n, force=not self.running):
                    self._unadmit(seq)
                    break
                self.waiting.remove(seq)
                self._start(seq, admitted)
                work.append((seq, n))
                reserved += self._reserve(seq)
                chunk_budget -= n
                input_budget -= n
                if n < extend:
                    self._chunked = seq
                    break
        if work:
            return self._batch(work, admitted, [])
        return self._sglang_decode()

    def _sglang_decode(self) -> Batch | None:
        decodes = [s for s in self.running if s is not self._chunked and s.computed + 1 == s.target]
        if not decodes:
            return None
        bs = self.block_size
        preempted: list[Seq] = []

        def need(seqs: list[Seq]) -> int:
            return sum(1 for s in seqs if s.computed + 1 > s.blocks * bs)

        if need(decodes) > self.cache.free_blocks and len(decodes) > 1:
            # SGLang's retraction order: keep the most advanced; retract fewest outputs, longest input
            keep = sorted(decodes, key=lambda s: (s.generated, -s.prompt_len), reverse=True)
            while len(keep) > 1 and need(keep) > self.cache.free_blocks:
                victim = keep.pop()
                self.running.remove(victim)
                self._preempt(victim)
                self.waiting.append(victim)
                preempted.append(victim)
            decodes = [s for s in decodes if s.state == "running"]
            # NewTokenRatioTracker.estimate_new_token_ratio_after_retract
            decoded = sum(s.generated for s in decodes) + RETRACT_DECODE_STEPS * len(decodes)
            self._ratio = min(1.0, decoded / (sum(s.max_new for s in decodes) + 1))
        for seq in decodes:
            self._allocate(seq, 1, force=True)
        return self._batch([(s, 1) for s in decodes], [], preempted)
