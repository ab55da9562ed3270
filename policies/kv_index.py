"""Which backend holds which KV-cache blocks, from the engines' own events: bounded and pure.

vLLM and SGLang publish `BlockStored` (blocks computed and cached: their hashes, the parent block's
hash, their token ids), `BlockRemoved` (evicted) and `AllBlocksCleared` (cache reset). The gateway's
subscriber (`gateway/routing/kv_events.py`) decodes them and calls `stored`, `removed`, `cleared`
here; routing asks `match(prompt, names)`: for each backend with a usable stream, how many leading
tokens of the prompt it holds.

Keys. A block is indexed by the gateway's own chained key over its token ids
(`policies.kv_blocks`), never by the engine's hash: the engines' hashes depend on settings the gateway
cannot see (hash algorithm, seed), while the token ids are in every `BlockStored`. Per backend the
index maps each engine hash to the key computed for it (`nodes`), found through the event's
`parent_block_hash`; a `BlockRemoved` looks the key up there. A LoRA adapter's blocks (`stored(lora=)`:
vLLM caches them apart from the base model's) are keyed from the adapter's seed (`seed_for`), so they
match only prompts keyed in that namespace; the names heard are kept in `adapters` (the gateway keys
a model the engines serve as an adapter there).

Unknown parents. A store whose parent the index never heard of - stored before this process
subscribed (a gateway that starts or restarts beside engines that have served: every chat prompt
then extends the chat template's first tokens, or a shared system prompt, cached long ago and never
stored again), or announced in a lost event - is *anchored* on the prompts this process recently
sent to that backend (`note_routed`): the first prompt in which the store's tokens (at least
`anchor_tokens` of them) follow a whole number of blocks places it, and the parent is the prompt's
prefix before them. The engine only extends a prefix it holds, so that prefix is recorded as held
too, under the parent's hash: when the engine removes the parent (engines evict leaves first, so
after its children), the prefix goes with it (and with it a group another anchored prefix shares: the
index may then under-report that one, never over-report). The recorded prefixes count against
`max_blocks`, oldest dropped first. A store that no recent prompt places (a request
another routing process sent, or too short to place: a decode's last few tokens) is skipped and
counted (`orphans`): the index under-reports, it never invents a block. Its later stores under a
parent already anchored or heard are keyed as usual, so what this process routes itself fills in
what it missed.

Granularity. A backend's blocks are keyed in groups of `group` tokens: its block size, or for engines
with small pages (SGLang's default page size is 1 token) the first multiple of it of at least
`min_block_tokens` (64: vLLM's 16-token blocks are keyed four at a time), so that a request has few
keys to hash and match (8,192 tokens are 512 keys at 16, 128 at 64: read key by key, their lookups
were the decision's largest cost with events, bench/kv_micro.py), and a
64-token granularity is far finer than the cost rule weighs a cache (a request's prefill is worth
`blocks_per_request` x 32 tokens). Pages inside a group are kept as pending token bytes under the
group's parent key until the group is full; a page removed inside a group ends the held prefix only
when the group's last page goes (its key), so holes are seen at the group's granularity.

Matching is prefix semantics: a backend holds a prompt's first `d` blocks when every one of them is held
(an engine cannot use a block whose parent it evicted). With one bitmask of backends per key, the
default scan (`scan_stride` 0, `_bisect`) reads the first key, then the last: the backends holding both
hold the whole prompt; for the others it reads the key halfway between one they hold and one they do
not, and so on, so where each backend's held prefix ends is found exactly in about log2(keys) reads (a
128-key document held whole: 2). `scan_stride` N reads the first key, then the last key of each stretch
of N keys, and scans a stretch key by key where some backends drop out in it. Either way a backend that
holds a key read is taken to hold every key before it: a *hole* there (a block removed while a later
block of its chain stays held) is not seen. Engines evict leaves first (vLLM's free-block queue takes a
finished request's last block first, and a block in use keeps its parents in use; SGLang's radix cache
evicts leaves only), so their removals make no holes; the index's own ageing (`max_blocks`, oldest
stored first) removes a chain from its first block, which is always read. A hole can come from an
engine's recomputing a block after a lost removal and the like; it over-reports one backend until the
engine stores the hole's block again. Cost: a dict lookup and an `and` per key read (`scan_stride` 1:
every key, exact whatever the holes). The lookups are the decision's largest cost with events
(~100-250 ns each, bench/kv_micro.py), which is why the default bisects: a long document's match
reads about 2 keys instead of 17-24 with `scan_stride` 8, with the same decisions.

Bounds and ageing (no clock here: a logical clock `now` is passed in by the caller, seconds in the
gateway). Each backend keeps at most `max_blocks` engine blocks; beyond that the oldest stored are
dropped first, so the memory is bounded by configuration whatever the events say (size it at least
at the engine's KV capacity in blocks, so that in normal operation the engine's own removals keep it
below the cap and the cap only ages out entries whose removal was lost). A stream is *usable* when
the gateway says it is live (connected, no unrecovered sequence gap) and not *silent*: when
`silent_requests` requests were routed to a backend over `silent_s` without one event from it, its
stream is ignored until it speaks again. A backend without a usable stream falls back to the
approximate affinity of `policies.prefix_affinity`. `gap(backend)` (events lost, not replayed):
its blocks are forgotten and its stream stays unusable for `relearn_s` while new events rebuild it.
`cleared(backend)` (the engine said so, or restarted): forgotten, and usable at once (it is empty).

Memory (CPython 3.11, measured by tests/policies/test_kv_index.py and docs/routing.md): one engine
block costs an `OrderedDict` slot with its hash and key (~150 bytes) and, per distinct key, a slot in
the shared key -> holders map (~100 bytes, shared by every backend holding the block); a page
inside a group not yet full keeps its pending token bytes (so ~370 bytes a block with 64-token
groups of 16-token blocks, against ~290 with one key a block).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.kv_blocks import PromptBlocks, block_key, chain_keys, seed_for, token_bytes

#: LoRA adapter names remembered (`KvIndex.adapters`): a bound whatever the events say
_ADAPTERS = 1024

# A node of a backend's engine blocks: the key of a full group, or (parent group's key, pending
# token bytes of a group not yet full).
_Node = int | tuple[int, bytes]


#: blocks are keyed in groups of at least 64 tokens (vLLM's 16-token blocks four at a time): an
#: 8k-token prompt is 128 keys to match, not 512, and the cost rule weighs caches far coarser
MIN_BLOCK_TOKENS = 64
#: 0: `match` bisects where each held prefix ends (about log2(keys) reads; see *Matching* above)
SCAN_STRIDE = 0
#: a backend sent 16 requests over 10 s without one event is not trusted until it speaks again:
#: an engine announces a request's blocks within its prefill, so silence that long is a broken stream
SILENT_REQUESTS = 16
SILENT_S = 10.0
#: after events were lost and not replayed, a backend's blocks are rebuilt from new events for 30 s
#: before its stream is trusted again (a busy engine stores its working set again within that)
RELEARN_S = 30.0
#: prompts remembered per backend (the last routed there) to anchor stores under an unknown
#: parent: ~1 MiB a backend for 8k-token prompts
ANCHOR_PROMPTS = 32
#: the fewest tokens a store needs to be anchored on a prompt (fewer could match by chance)
ANCHOR_TOKENS = 16


@dataclass(frozen=True, slots=True)
class KvIndexConfig:
    """Bounds and liveness rules of the KV-event index (docs/routing.md, *KV events*). The gateway
    sets `max_blocks` (`routing.prefix_affinity.kv_max_blocks`); the rest keep the constants above."""

    #: engine blocks kept per backend, oldest stored dropped first: the memory bound
    max_blocks: int = 32768
    min_block_tokens: int = MIN_BLOCK_TOKENS
    scan_stride: int = SCAN_STRIDE
    silent_requests: int = SILENT_REQUESTS
    silent_s: float = SILENT_S
    relearn_s: float = RELEARN_S
    anchor_prompts: int = ANCHOR_PROMPTS
    anchor_tokens: int = ANCHOR_TOKENS

    def __post_init__(self) -> None:
        if min(self.max_blocks, self.min_block_tokens, self.silent_requests) < 1 or self.scan_stride < 0:
            raise ValueError(
                "max_blocks, min_block_tokens and silent_requests must be >= 1, scan_stride >= 0"
            )
        if self.anchor_prompts < 0 or self.anchor_tokens < 1:
            raise ValueError("anchor_prompts must be >= 0 and anchor_tokens >= 1")
        if self.silent_s < 0 or self.relearn_s < 0:
            raise ValueError("silent_s and relearn_s must be >= 0")


class _Stream:
    """One backend's blocks as its events described them."""

    __slots__ = (
        "anchor_names",
        "anchored",
        "anchors",
        "bit",
        "block_size",
        "group",
        "live",
        "nodes",
        "orphans",
        "prompts",
        "quiet_since",
        "relearn_until",
        "unanswered",
    )

    def __init__(self, bit: int, prompts: int) -> None:
        self.bit = bit
        self.block_size = 0  # unknown until the first full-block store
        self.group = 0
        self.live = False
        self.nodes: OrderedDict[Any, _Node] = OrderedDict()
        self.orphans = 0  # stores skipped for an unknown parent
        self.anchored = 0  # stores under an unknown parent placed on a prompt routed here
        # an anchored parent's hash -> the node names of the prefix recorded held under it
        self.anchors: dict[Any, list[tuple[str, Any, int]]] = {}
        self.anchor_names = 0  # the names in `anchors`, bounded by max_blocks
        self.prompts: deque[PromptBlocks] = deque(maxlen=prompts)  # the last routed here, newest last
        self.unanswered = 0  # requests routed here since its last event
        self.quiet_since = 0.0
        self.relearn_until = 0.0


class KvIndex:
    """The engines' KV-cache contents per backend. Not thread-safe (the gateway's event loop only)."""

    def __init__(self, config: KvIndexConfig | None = None) -> None:
        self.config = config or KvIndexConfig()
        self.now = 0.0
        #: changes whenever what `match` may answer changes (events, liveness, routing notes)
        self.version = 0
        self._streams: dict[str, _Stream] = {}
        self._names: dict[int, str] = {}  # bit -> backend
        self._holders: dict[int, int] = {}  # key -> bitmask of backends holding it
        # Which streams are usable, remembered for `match` over every backend (the policy's call,
        # on every request): changes whenever a stream's usability may change other than by the
        # clock (`_changed`); the streams whose usability the clock alone may change (relearning,
        # or unanswered long enough to turn silent) are rechecked on every call.
        self._liveness = 0
        self._plan: _Plan | None = None
        #: the LoRA adapters the engines stored blocks for (`stored(lora=...)`), at most `_ADAPTERS`
        self.adapters: set[str] = set()

    # -- streams ----------------------------------------------------------------------------------
    def attach(self, backend: str) -> None:
        """Expect events for `backend` (its stream is configured); not live until `set_live`."""
        self.version += 1
        self._liveness += 1
        if backend in self._streams:
            return
        used = 0
        for st in self._streams.values():
            used |= st.bit
        bit = 1
        while used & bit:
            bit <<= 1
        self._streams[backend] = _Stream(bit, self.config.anchor_prompts)
        self._names[bit] = backend

    def detach(self, backend: str) -> None:
        """Forget `backend` and its blocks (it left the fleet, or its stream is no longer configured)."""
        self.version += 1
        self._liveness += 1
        st = self._streams.get(backend)
        if st is None:
            return
        self._drop_all(st)
        del self._streams[backend]
        del self._names[st.bit]

    @property
    def streams(self) -> int:
        """Backends whose events are expected."""
        return len(self._streams)

    @property
    def names(self) -> list[str]:
        """The backends whose events are expected."""
        return list(self._streams)

    def attached(self, backend: str) -> bool:
        return backend in self._streams

    def set_live(self, backend: str, live: bool) -> None:
        """The subscriber's view of the stream: connected and in sequence (`live`) or not."""
        self.version += 1
        self._liveness += 1
        st = self._streams.get(backend)
        if st is not None:
            st.live = live

    def tick(self, now: float) -> None:
        """Advance the logical clock (never backwards)."""
        if now > self.now:
            self.now = now

    def usable(self, backend: str) -> bool:
        """Whether routing may trust `backend`'s blocks now (see the module docstring)."""
        st = self._streams.get(backend)
        return st is not None and self._usable(st)

    def _usable(self, st: _Stream) -> bool:
        if not st.live or self.now < st.relearn_until:
            return False
        cfg = self.config
        return not (st.unanswered >= cfg.silent_requests and self.now - st.quiet_since >= cfg.silent_s)

    def note_routed(self, backend: str, prompt: PromptBlocks | None = None) -> None:
        """A request was sent to `backend` (its engine should soon speak); `prompt`, its tokens, may
        anchor the engine's stores under a parent this index never heard of (see the docstring)."""
        self.version += 1
        st = self._streams.get(backend)
        if st is not None:
            if prompt is not None:
                st.prompts.append(prompt)  # a deque of anchor_prompts: 0 keeps none
            if st.unanswered == 0:
                st.quiet_since = self.now
            st.unanswered += 1
            if st.unanswered == self.config.silent_requests:
                self._liveness += 1  # from now on the clock may silence it

    def _heard(self, st: _Stream) -> None:
        if st.unanswered >= self.config.silent_requests:
            self._liveness += 1  # it may have been silent
        st.unanswered = 0

    def gap(self, backend: str) -> None:
        """Events were lost and not replayed: forget the backend's blocks, distrust it for a while."""
        self.version += 1
        self._liveness += 1
        st = self._streams.get(backend)
        if st is None:
            return
        self._drop_all(st)
        st.relearn_until = self.now + self.config.relearn_s

    # -- events -----------------------------------------------------------------------------------
    def stored(
        self,
        backend: str,
        block_hashes: Sequence[Any],
        parent: Any,
        token_ids: Sequence[int],
        block_size: int,
        extra_keys: Sequence[Any] | None = None,
        lora: str | None = None,
    ) -> int:
        """`BlockStored`: returns the number of blocks indexed (0: skipped, see the docstring)."""
        self.version += 1
        st = self._streams.get(backend)
        if st is None:
            return 0
        self._heard(st)
        n = len(block_hashes)
        if n == 0 or block_size < 1 or len(token_ids) != n * block_size:
            return 0
        if block_size > st.block_size:
            # The engine's block size is the largest it ever stores: a smaller one is a partial
            # entry (vLLM 0.32 stores the tail of some prompts as one short block). When the first
            # store heard was such a tail, what was keyed with its size is dropped.
            if st.block_size:
                self._drop_all(st)
            st.block_size = block_size
            min_tokens = self.config.min_block_tokens
            st.group = block_size * max(1, -(-min_tokens // block_size))
            self._liveness += 1
        elif block_size != st.block_size:
            return 0  # a partial block: not indexed (a request is matched in whole blocks)
        if lora is not None and lora not in self.adapters and len(self.adapters) < _ADAPTERS:
            self.adapters.add(lora)
        nodes = st.nodes
        if parent is None:
            base, pend = seed_for(lora), b""
        else:
            node = nodes.get(parent)
            if node is None:
                node = self._anchor(st, parent, token_ids, lora)
                if node is None:
                    st.orphans += 1
                    return 0
                st.anchored += 1
            if isinstance(node, int):
                base, pend = node, b""
            else:
                base, pend = node
        data = token_bytes(token_ids)
        step = block_size * 4
        group = st.group * 4
        view = memoryview(data)
        first_extra: Any = None
        for i in range(n):
            blk = view[i * step : (i + 1) * step]
            extra = extra_keys[i] if extra_keys is not None and i < len(extra_keys) else None
            if group == step:
                key = block_key(base, blk, extra)
                self._put(st, block_hashes[i], key)
                base = key
                continue
            if not pend:
                first_extra = extra
            pend = pend + bytes(blk)
            if len(pend) >= group:
                key = block_key(base, pend, first_extra)
                self._put(st, block_hashes[i], key)
                base, pend = key, b""
            else:
                self._put(st, block_hashes[i], (base, pend))
        return n

    def removed(self, backend: str, block_hashes: Iterable[Any]) -> None:
        """`BlockRemoved`."""
        self.version += 1
        st = self._streams.get(backend)
        if st is None:
            return
        self._heard(st)
        nodes = st.nodes
        anchors = st.anchors
        for h in block_hashes:
            node = nodes.pop(h, None)
            if isinstance(node, int):
                self._unhold(node, st.bit)
            if anchors:
                self._unanchor(st, h)

    def cleared(self, backend: str) -> None:
        """`AllBlocksCleared`, or the engine restarted: it holds nothing."""
        self.version += 1
        self._liveness += 1
        st = self._streams.get(backend)
        if st is None:
            return
        self._heard(st)
        self._drop_all(st)
        st.relearn_until = 0.0

    # -- reads ------------------------------------------------------------------------------------
    def match(self, prompt: PromptBlocks, names: Iterable[str] | None = None) -> dict[str, int]:
        """Leading tokens of `prompt` held by each of `names` (default: every attached backend)
        whose stream is usable (0 when none); backends without a usable stream are absent."""
        if names is None:
            plan = self._plan
            if plan is None or plan.liveness != self._liveness or not plan.holds(self):
                plan = self._plan = self._planned()
            out = plan.zeros.copy()
            groups = plan.groups
        else:
            out, groups = self._usable_groups((name, self._streams.get(name)) for name in names)
        holders = self._holders
        bits = self._names
        stride = self.config.scan_stride
        if stride == 0:
            for group, mask in groups:
                _bisect(prompt.keys(group), group, mask, holders, bits, out)
            return out
        for group, mask in groups:
            # the last key of each stretch of `stride` keys, with one bitmask of backends: those
            # holding it are taken to hold the stretch; where some drop out, the stretch is scanned
            # key by key for them (see the module docstring, *Matching*)
            keys = prompt.keys(group)
            n = len(keys)
            depth = 0  # keys held by every backend in `mask`
            while depth < n:
                end = depth + stride - 1 if depth else 0  # the first key alone, then stretches
                if end >= n:
                    end = n - 1
                held = holders.get(keys[end], 0) & mask
                if held != mask:
                    # (here `depth` >= 1: the first key is a stretch of its own, and `out`
                    # already holds 0 tokens for every usable backend)
                    dropped = mask & ~held
                    d = depth
                    while d < end:
                        still = holders.get(keys[d], 0) & dropped
                        if still != dropped:
                            _record(out, bits, dropped & ~still, d * group)
                            dropped = still
                            if not dropped:
                                break
                        d += 1
                    if dropped:
                        _record(out, bits, dropped, end * group)
                    mask = held
                    if not mask:
                        break
                depth = end + 1
            if mask:
                _record(out, bits, mask, depth * group)
        return out

    def _usable_groups(
        self, pairs: Iterable[tuple[str, _Stream | None]]
    ) -> tuple[dict[str, int], list[tuple[int, int]]]:
        """Of `pairs`, the usable streams' names (each mapped to 0 tokens) and (key group, bitmask)
        of them per key group."""
        out: dict[str, int] = {}
        by_group: dict[int, int] = {}
        # `_usable`, inlined: this loop runs for every backend of a match
        now = self.now
        cfg = self.config
        silent_requests = cfg.silent_requests
        silent_s = cfg.silent_s
        for name, st in pairs:
            if (
                st is None
                or not st.live
                or now < st.relearn_until
                or (st.unanswered >= silent_requests and now - st.quiet_since >= silent_s)
            ):
                continue
            out[name] = 0
            if st.group:
                by_group[st.group] = by_group.get(st.group, 0) | st.bit
        return out, list(by_group.items())

    def _planned(self) -> _Plan:
        zeros, groups = self._usable_groups(self._streams.items())
        silent_requests = self.config.silent_requests
        watch = [
            (st, self._usable(st))
            for st in self._streams.values()
            if st.live and (self.now < st.relearn_until or st.unanswered >= silent_requests)
        ]
        return _Plan(self._liveness, self.now, zeros, groups, watch)

    def holds(self, backend: str) -> int:
        """Engine blocks indexed for `backend`."""
        st = self._streams.get(backend)
        return len(st.nodes) if st is not None else 0

    def block_size(self, backend: str) -> int:
        """The engine's block size as its events said (0 until known)."""
        st = self._streams.get(backend)
        return st.block_size if st is not None else 0

    def stats(self) -> Mapping[str, Mapping[str, int | bool]]:
        """Per backend: blocks, stores skipped for an unknown parent (`orphans`) and stores anchored
        on a routed prompt (`anchored`), usable (for metrics and the admin API)."""
        return {
            name: {
                "blocks": len(st.nodes),
                "orphans": st.orphans,
                "anchored": st.anchored,
                "usable": self._usable(st),
            }
            for name, st in self._streams.items()
        }

    def __len__(self) -> int:
        """Distinct keys held by any backend."""
        return len(self._holders)

    # -- internals --------------------------------------------------------------------------------
    def _anchor(self, st: _Stream, parent: Any, token_ids: Sequence[int], lora: str | None) -> _Node | None:
        """The node of `parent`, unknown here, found by placing the store's tokens on a prompt recently
        routed to this backend (see the module docstring, *Unknown parents*), with the prompt's prefix
        before them recorded as held under `parent`; None when no prompt places them."""
        need = self.config.anchor_tokens
        if len(token_ids) < need or not st.prompts or not st.group:
            return None
        seed = seed_for(lora)
        probe = token_bytes(token_ids[: max(need, st.group)])
        rest = token_bytes(token_ids)
        align = st.block_size * 4
        for prompt in reversed(st.prompts):
            if prompt.seed == seed and (at := _place(prompt.data, probe, rest, align)) >= 0:
                return self._held_prefix(st, parent, prompt, at)
        return None

    def _held_prefix(self, st: _Stream, parent: Any, prompt: PromptBlocks, end: int) -> _Node:
        """Record `prompt`'s first `end` bytes as held by the backend, under `parent` (the engine block
        that ends there), and return the node a store under `parent` chains from."""
        group = st.group
        anchors = st.anchors
        if parent in anchors:
            self._unanchor(st, parent)
        step = group * 4
        keys = prompt.keys(group)  # cached on the prompt (matching it computed them)
        if end // step <= len(keys):
            keys = keys[: end // step]
        else:  # past the tokens a prompt is keyed on
            keys = tuple(chain_keys(prompt.data[:end], group, prompt.seed, prompt.first_extra))
        # bounded like the blocks (their names may have aged out of `nodes` already): the oldest go,
        # and a prefix longer than the bound is recorded held up to it (the store still chains on)
        held = keys[: self.config.max_blocks]
        while anchors and st.anchor_names + len(held) > self.config.max_blocks:
            self._unanchor(st, next(iter(anchors)))
        names: list[tuple[str, Any, int]] = []
        for i, key in enumerate(held):
            name = ("anchor", parent, i)
            self._put(st, name, key)
            names.append(name)
        anchors[parent] = names
        st.anchor_names += len(names)
        full = len(keys) * step
        base = keys[-1] if keys else prompt.seed
        node: _Node = base if full == end else (base, prompt.data[full:end])
        self._put(st, parent, node)
        return node

    def _unanchor(self, st: _Stream, parent: Any) -> None:
        """The engine removed an anchored parent: the prefix recorded held under it goes too."""
        names = st.anchors.pop(parent, None)
        if names is None:
            return
        st.anchor_names -= len(names)
        nodes = st.nodes
        for name in names:
            node = nodes.pop(name, None)
            if isinstance(node, int):
                self._unhold(node, st.bit)

    def _put(self, st: _Stream, engine_hash: Any, node: _Node) -> None:
        nodes = st.nodes
        old = nodes.pop(engine_hash, None)
        if isinstance(old, int) and old != node:
            self._unhold(old, st.bit)
        nodes[engine_hash] = node
        if isinstance(node, int):
            holders = self._holders
            holders[node] = holders.get(node, 0) | st.bit
        if len(nodes) > self.config.max_blocks:
            _, gone = nodes.popitem(last=False)
            if isinstance(gone, int):
                self._unhold(gone, st.bit)

    def _unhold(self, key: int, bit: int) -> None:
        holders = self._holders
        mask = holders.get(key)
        if mask is None:
            return
        mask &= ~bit
        if mask:
            holders[key] = mask
        else:
            del holders[key]

    def _drop_all(self, st: _Stream) -> None:
        bit = st.bit
        for node in st.nodes.values():
            if isinstance(node, int):
                self._unhold(node, bit)
        st.nodes.clear()
        st.anchors.clear()
        st.anchor_names = 0


class _Plan:
    """`match`'s usable streams for every backend, as of `liveness` and the clock `now`; `watch`:
    the streams whose usability the clock alone may change, with their usability then."""

    __slots__ = ("groups", "liveness", "now", "watch", "zeros")

    def __init__(
        self,
        liveness: int,
        now: float,
        zeros: dict[str, int],
        groups: list[tuple[int, int]],
        watch: list[tuple[_Stream, bool]],
    ) -> None:
        self.liveness = liveness
        self.now = now
        self.zeros = zeros
        self.groups = groups
        self.watch = watch

    def holds(self, index: KvIndex) -> bool:
        """Still true at the index's clock."""
        if index.now == self.now:
            return True
        return all(index._usable(st) == usable for st, usable in self.watch)


def _place(data: bytes, probe: bytes, rest: bytes, align: int) -> int:
    """Where in `data` (a prompt's token bytes) a store's tokens `rest` start: at a multiple of `align`
    (a block boundary) past the first block, `probe` (their start) found there, and every token of
    `rest` that `data` covers agreeing; -1 if nowhere."""
    at = data.find(probe, align)
    while at >= 0:
        if at % align == 0 and data[at : at + len(rest)] == rest[: len(data) - at]:
            return at
        at = data.find(probe, at + 4)
    return -1


def _bisect(
    keys: tuple[int, ...],
    group: int,
    mask: int,
    holders: dict[int, int],
    bits: dict[int, str],
    out: dict[str, int],
) -> None:
    """`match` with `scan_stride` 0: the first key, then the last; where some backends hold the first
    and not the last, the key halfway, and so on (a held prefix ends where a backend holds one key and
    not the next): a few reads whatever the prompt's length, a hole between two keys read not seen."""
    n = len(keys)
    if not n:
        return
    mask &= holders.get(keys[0], 0)
    if not mask:
        return
    # (lo, hi, m): every backend of `m` holds key `lo`; its prefix ends in lo..hi
    todo = [(0, n - 1, mask)]
    while todo:
        lo, hi, m = todo.pop()
        if lo < hi:
            h = holders.get(keys[hi], 0) & m
            if h:
                _record(out, bits, h, (hi + 1) * group)
                m &= ~h
                if not m:
                    continue
            hi -= 1
            if lo < hi:
                mid = (lo + hi + 1) // 2
                h = holders.get(keys[mid], 0) & m
                if h:
                    todo.append((mid, hi, h))
                    m &= ~h
                if m:
                    todo.append((lo, mid - 1, m))
                continue
        _record(out, bits, m, (lo + 1) * group)


def _record(out: dict[str, int], names: dict[int, str], mask: int, tokens: int) -> None:
    while mask:
        low = mask & -mask
        out[names[low]] = tokens
        mask ^= low
