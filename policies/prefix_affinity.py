"""Prefix affinity ("ours"): bounded-load rendezvous hashing on the conversation anchor, refined by a
bounded local prefix index.

1. Key. `features.anchor_hash` (tool schemas + system prompt + first user message; optionally mixed
   with `session_key`). Every turn of a conversation has the same anchor, so every turn has the same
   key; conversations that share only a system prompt have different keys and spread over the pool.
2. Rendezvous (HRW) order. Each routable backend scores `mix64(key ^ hash64(name))`; the highest is the
   conversation's *home*, the rest is its ordered list of fallbacks. Every gateway replica with the
   same snapshot computes the same order without talking to the others, and removing a backend only
   moves the conversations whose home it was.
3. Bounded load. A backend *fits* when
   `score + 1 <= ceil((1 + load_factor) * (total + 1) / n) + load_slack` (consistent hashing with
   bounded loads, Mirrokni et al. 2018, plus an absolute slack so that at low load one extra request
   does not throw away a warm cache) and it is not saturated (engine queue, KV use or max concurrency
   over the thresholds of `LoadModel`). The first fitting backend in HRW order
   wins; if that is not the home, the decision is a *spill*. If none fits, the least loaded one wins.
4. Index refinement. The local `PrefixIndex` remembers which backend this replica sent each prefix to
   (only the blocks past the preamble: a shared system prompt/tool schema is what HRW is meant to
   spread, not something to follow). If it knows a prefix of this request on some other backend that
   is at least `index_min_gain_blocks` deeper than what it knows on the home (the same long document asked
   different questions, a forked conversation, a conversation that spilled earlier), that backend is
   preferred when it fits (`affinity:index`). When the home already holds the deepest known prefix,
   nothing changes, so replicas disagree only where one of them knows strictly more.

Reasons: `affinity:hit` (home; the index knows a prefix past the preamble there, or the index is
disabled), `affinity:miss` (home; nothing of this conversation known there yet), `affinity:index` (a warmer non-home
backend), `affinity:spill` (home skipped for load).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from policies.hashing import NameHashes, mix64, str_hash64
from policies.load import DEFAULT_LOAD_MODEL, LoadModel
from policies.policy import BackendPolicy
from policies.prefix_index import PrefixIndex
from policies.types import BackendChoice, BackendView, PoolView, RequestFeatures


@dataclass(frozen=True, slots=True)
class PrefixAffinityConfig:
    kind: Literal["prefix_affinity"] = "prefix_affinity"
    load_factor: float = 0.25
    load_slack: float = 1.0
    load: LoadModel = DEFAULT_LOAD_MODEL
    index_entries: int = 65536
    index_max_holders: int = 4
    index_min_gain_blocks: int = 4
    session_in_key: bool = False

    def __post_init__(self) -> None:
        if self.load_factor < 0 or self.load_slack < 0:
            raise ValueError("load_factor and load_slack must be >= 0")
        if self.index_min_gain_blocks < 1:
            raise ValueError("index_min_gain_blocks must be >= 1")


class PrefixAffinity(BackendPolicy):
    def __init__(self, config: PrefixAffinityConfig = PrefixAffinityConfig()) -> None:
        self._config = config
        self._load = config.load
        self._index = PrefixIndex(config.index_entries, config.index_max_holders)
        self._names = NameHashes()

    @property
    def index(self) -> PrefixIndex:
        return self._index

    def key(self, features: RequestFeatures) -> int:
        """The rendezvous key of a request (identical across turns of one conversation)."""
        key = features.anchor_hash
        if self._config.session_in_key and features.session_key:
            key = mix64(key ^ str_hash64(features.session_key))
        return key

    def rank(self, pool: PoolView, features: RequestFeatures) -> list[BackendView]:
        """The pool's routable backends in rendezvous order for this request (home first)."""
        key = self.key(features)
        names = self._names
        scored = [(mix64(key ^ names(b.name)), b.name, b) for b in pool.backends if b.routable]
        scored.sort(reverse=True, key=_first_two)
        return [entry[2] for entry in scored]

    def select(self, pool: PoolView, features: RequestFeatures, rand: float) -> BackendChoice:
        ranked = self.rank(pool, features)
        n = len(ranked)
        if n == 0:
            raise ValueError(f"pool {pool.name!r} has no routable backend")
        load = self._load
        scores = [load.score(b) for b in ranked]
        config = self._config
        capacity = math.ceil((1.0 + config.load_factor) * (sum(scores) + 1.0) / n) + config.load_slack
        fits = [scores[i] + 1.0 <= capacity and not load.saturated(ranked[i]) for i in range(n)]
        home = ranked[0]

        indexed = self._index.max_entries > 0
        home_known = not indexed
        holders: tuple[str, ...] = ()
        preamble = features.preamble_blocks
        if indexed and len(features.block_hashes) > preamble:
            depth, holders = self._index.longest_match(
                features.block_hashes, {b.name for b in ranked}, above=preamble
            )
            if home.name in holders:
                home_known = True
            elif depth:
                home_depth = self._index.depth_for(
                    features.block_hashes, home.name, below=depth, above=preamble
                )
                home_known = home_depth > 0
                if depth - max(home_depth, preamble) >= self._config.index_min_gain_blocks:
                    for i in range(1, n):
                        if fits[i] and ranked[i].name in holders:
                            return BackendChoice(ranked[i].name, "affinity:index", "hit")

        if fits[0]:
            return _home(home.name, home_known)
        # Spill: a fitting backend that holds the deepest known prefix, else the next in HRW order.
        for i in range(1, n):
            if fits[i] and ranked[i].name in holders:
                return BackendChoice(ranked[i].name, "affinity:spill", "spill")
        for i in range(1, n):
            if fits[i]:
                return BackendChoice(ranked[i].name, "affinity:spill", "spill")
        least = min(range(n), key=scores.__getitem__)
        if least == 0:
            return _home(home.name, home_known)
        return BackendChoice(ranked[least].name, "affinity:spill", "spill")

    def on_routed(self, pool: PoolView, features: RequestFeatures, choice: BackendChoice) -> None:
        # The preamble (shared system prompt, tool schemas) is not indexed: rendezvous hashing spreads
        # it on purpose, and skipping it keeps long agent prompts cheap to record.
        self._index.insert(features.block_hashes[features.preamble_blocks :], choice.backend)


def _home(name: str, known: bool) -> BackendChoice:
    if known:
        return BackendChoice(name, "affinity:hit", "hit")
    return BackendChoice(name, "affinity:miss", "miss")


def _first_two(entry: tuple[int, str, BackendView]) -> tuple[int, str]:
    return entry[0], entry[1]
