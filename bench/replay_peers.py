"""The peers' routing policies, modelled for `bench/replay.py` so that a replay can put them beside ours
on many schedules in seconds (the wall-clock bench, bench/routing.py, runs the real routers, one
schedule per point).

**SGLang router `cache_aware`** (`SglangCacheAware`; sglang-router 0.3.2, the version the routing
suite installs, with its default arguments: `--cache-threshold 0.3`, `--balance-abs-threshold 64`,
`--balance-rel-threshold 1.5`). What it does, from its documentation and source (not its code):

- It keeps one approximate radix tree of the *text* it has sent to each worker. A chat request's text
  is its messages' contents joined by spaces: tool schemas and the chat template are not in it.
- Its load is its own count of requests in flight to each worker. When the fleet is imbalanced -
  `max - min > 64` **and** `max > 1.5 x min` - the least loaded worker takes the request.
- Otherwise the deepest match of the text in the tree wins when it covers more than 30 % of the text
  (at the node where matching stops, the first tenant of that node's map: an order that changes from
  node to node); else the worker with the least text in the tree (the first of the smallest in the
  map's order, fixed for the run). Either way the text is inserted in the tree for the chosen worker.
- Every 60 s it evicts the least recently used leaves of any worker above 2^26 characters: never in a
  replay's 20 s, so not modelled.

The model matches the text word by word (the simulators' tokenizer: one id per word or punctuation
mark) instead of character by character; the match's share of the text is the same to within a
word. It is a model: the real router's rows in bench/BENCHMARKS.md stay the measurement of record.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from itertools import takewhile
from typing import Any, Literal

from engines.sim import tokenizer
from engines.sim.prefix_cache import PrefixCache
from policies.hashing import MASK64, mix64, str_hash64

SGLANG_CACHE_AWARE: Literal["sglang_cache_aware"] = "sglang_cache_aware"


def routing_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """What sglang-router matches of a chat request: its messages' text contents, joined by spaces."""
    parts: list[str] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.append(
                " ".join(p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text")
            )
    return " ".join(parts)


def text_chain(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """The routing text's positions as chained hashes (the simulators' block keys, one word a block):
    position k names the text's first k + 1 words."""
    return PrefixCache.block_keys(tokenizer.encode(routing_text(messages)), 1)


class SglangCacheAware:
    """One sglang-router process's `cache_aware` choice (see the module docstring)."""

    __slots__ = ("_abs", "_names", "_order", "_rel", "_sizes", "_threshold", "_tree")

    def __init__(
        self,
        workers: Sequence[str],
        *,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        seed: int = 0,
    ) -> None:
        if not workers:
            raise ValueError("sglang cache_aware needs at least one worker")
        self._threshold = cache_threshold
        self._abs = balance_abs_threshold
        self._rel = balance_rel_threshold
        order = list(workers)
        random.Random(seed).shuffle(order)  # the size map's iteration order, fixed for the run
        self._order = order
        self._names = {w: str_hash64(w) for w in workers}
        self._sizes = dict.fromkeys(order, 0)  # words in the tree per worker
        self._tree: dict[int, set[str]] = {}  # position hash -> the workers sent that prefix

    def size(self, worker: str) -> int:
        """Words of text in the tree for `worker`."""
        return self._sizes[worker]

    def select(self, chain: Sequence[int], in_flight: Mapping[str, int]) -> tuple[str, str]:
        """The worker for a request whose routing text is `chain` (`text_chain`), and why
        (`imbalanced`, `match` or `smallest`); the text is inserted for it."""
        loads = [in_flight.get(w, 0) for w in self._order]
        low, high = min(loads), max(loads)
        if high - low > self._abs and high > self._rel * low:
            chosen, why = self._order[loads.index(low)], "imbalanced"
        else:
            tree = self._tree
            depth = sum(1 for _ in takewhile(tree.__contains__, chain))  # the deepest match
            if chain and depth / len(chain) > self._threshold:
                node = chain[depth - 1]
                chosen = min(tree[node], key=lambda w: mix64((node & MASK64) ^ self._names[w]))
                why = "match"
            else:
                sizes = self._sizes
                chosen = min(self._order, key=sizes.__getitem__)  # the first of the smallest
                why = "smallest"
        self._insert(chain, chosen)
        return chosen, why

    def _insert(self, chain: Sequence[int], worker: str) -> None:
        tree = self._tree
        added = 0
        for h in chain:
            holders = tree.get(h)
            if holders is None:
                tree[h] = {worker}
                added += 1
            elif worker not in holders:
                holders.add(worker)
                added += 1
        self._sizes[worker] += added
