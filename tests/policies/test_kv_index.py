"""The KV-event index: what the engines said they hold, keyed by the gateway's own block keys."""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.kv_blocks import PromptBlocks, salt_extra, seed_for
from policies.kv_index import KvIndex, KvIndexConfig
from tests.support import examples


class Engine:
    """A stand-in engine's hashing: opaque, chained, unlike the gateway's keys."""

    def __init__(self, block_size: int, salt: int = 7) -> None:
        self.block_size = block_size
        self.salt = salt

    def hashes(self, tokens: Sequence[int], parent: int | None = None) -> list[int]:
        out: list[int] = []
        h = parent
        bs = self.block_size
        for i in range(len(tokens) // bs):
            h = hash((self.salt, h, tuple(tokens[i * bs : (i + 1) * bs]))) & ((1 << 64) - 1)
            out.append(h)
        return out

    def store(
        self, index: KvIndex, backend: str, tokens: Sequence[int], start: int = 0, parent: int | None = None
    ) -> list[int]:
        """Store blocks `start..` of `tokens` (their parent is block `start - 1`)."""
        bs = self.block_size
        full = len(tokens) // bs * bs
        all_hashes = self.hashes(tokens[:full])
        hashes = all_hashes[start:]
        parent = all_hashes[start - 1] if start else None
        index.stored(backend, hashes, parent, list(tokens[start * bs : full]), bs)
        return all_hashes


def live_index(*names: str, **config: object) -> KvIndex:
    """An index whose streams are live; keyed per 16-token block unless told (the tests' engines
    store 16-token blocks: the block semantics, not the default grouping, are under test)."""
    config.setdefault("min_block_tokens", 16)
    index = KvIndex(KvIndexConfig(**config))  # type: ignore[arg-type]
    for name in names:
        index.attach(name)
        index.set_live(name, True)
    return index


def doc(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 50000) for _ in range(n)]


def test_a_stored_prompt_is_matched_on_its_backend_only() -> None:
    index = live_index("a", "b")
    tokens = doc(100)
    Engine(16).store(index, "a", tokens)
    assert index.match(PromptBlocks(tokens), ["a", "b"]) == {"a": 96, "b": 0}
    # a longer prompt with the same start: the held prefix
    assert index.match(PromptBlocks([*tokens[:50], *doc(60, 1)]), ["a", "b"]) == {"a": 48, "b": 0}
    # backends without a stream are absent (they fall back to the approximate affinity)
    assert index.match(PromptBlocks(tokens), ["a", "c"]) == {"a": 96}


def test_stores_chain_through_their_parent() -> None:
    index = live_index("a")
    tokens = doc(64)
    eng = Engine(16)
    eng.store(index, "a", tokens[:32])
    eng.store(index, "a", tokens, start=2)
    assert index.match(PromptBlocks(tokens), ["a"]) == {"a": 64}


def test_a_store_under_an_unknown_parent_invents_nothing() -> None:
    index = live_index("a")
    tokens = doc(64)
    Engine(16).store(index, "a", tokens, start=2)  # blocks 0-1 never announced (a lost event)
    assert index.match(PromptBlocks(tokens), ["a"]) == {"a": 0}
    assert index.stats()["a"]["orphans"] == 1
    assert index.holds("a") == 0


def test_a_removed_block_ends_the_held_prefix() -> None:
    """Exact whatever the holes when every key is read (`scan_stride` 1)."""
    index = live_index("a", "b", scan_stride=1)
    tokens = doc(128)
    eng = Engine(16)
    hashes = eng.store(index, "a", tokens)
    eng.store(index, "b", tokens)
    index.removed("a", [hashes[3]])
    assert index.match(PromptBlocks(tokens), ["a", "b"]) == {"a": 48, "b": 128}
    index.removed("a", hashes)
    index.removed("b", hashes[:1])
    assert index.match(PromptBlocks(tokens), ["a", "b"]) == {"a": 0, "b": 0}
    assert len(index) == 7  # b still holds blocks 1..7, unusable without block 0
    index.cleared("b")
    assert len(index) == 0


def test_the_bisecting_scan_finds_where_each_prefix_ends() -> None:
    """The default scan (`scan_stride` 0) reads the first key, the last, then halves: removals from the
    tail, as engines evict, end each backend's prefix exactly wherever it ends, in a few reads; a hole
    is not seen (see policies.kv_index, *Matching*); the first key always is."""
    index = live_index("a", "b", "c", "d", "e")
    tokens = doc(16 * 40)
    eng = Engine(16)
    hashes = {n: eng.store(index, n, tokens) for n in "abcde"}
    for name, end in (("a", 1), ("b", 13), ("c", 20), ("d", 39)):
        index.removed(name, hashes[name][end:])
    assert index.match(PromptBlocks(tokens)) == {
        "a": 16,
        "b": 16 * 13,
        "c": 16 * 20,
        "d": 16 * 39,
        "e": 16 * 40,
    }
    index.removed("e", [hashes["e"][20]])  # a hole: not seen
    index.removed("d", [hashes["d"][0]])  # the first block: seen
    assert index.match(PromptBlocks(tokens), ["d", "e"]) == {"d": 0, "e": 16 * 40}
    assert index.match(PromptBlocks(tokens[: 16 * 21]), ["c"]) == {"c": 16 * 20}  # shorter prompts too
    assert index.match(PromptBlocks(tokens[:16]), ["a", "d"]) == {"a": 16, "d": 0}


def test_the_strided_scan_finds_where_each_prefix_ends() -> None:
    """`scan_stride` 8 reads one key in 8: removals from the tail, as engines evict, end each
    backend's prefix exactly, wherever in a stretch; a hole inside a stretch whose last key is held
    is not seen (see policies.kv_index, *Matching*); the first key always is."""
    index = live_index("a", "b", "c", "d", scan_stride=8)
    tokens = doc(16 * 40)
    eng = Engine(16)
    hashes = {n: eng.store(index, n, tokens) for n in "abcd"}
    index.removed("a", hashes["a"][13:])  # inside the second stretch (blocks 1-8, 9-16, ...)
    index.removed("b", hashes["b"][9:])  # at a stretch's first key
    index.removed("c", hashes["c"][16:])  # just past a stretch's last key
    index.removed("d", hashes["d"][39:])  # the last block (a stretch of 7)
    assert index.match(PromptBlocks(tokens)) == {"a": 16 * 13, "b": 16 * 9, "c": 16 * 16, "d": 16 * 39}
    index.removed("d", [hashes["d"][20]])  # a hole inside the stretch 17-24: not seen
    index.removed("c", [hashes["c"][0]])  # the first block: seen
    assert index.match(PromptBlocks(tokens), ["c", "d"]) == {"c": 0, "d": 16 * 39}
    with_every_key = live_index("d", scan_stride=1)
    h = eng.store(with_every_key, "d", tokens)
    with_every_key.removed("d", [h[20]])
    assert with_every_key.match(PromptBlocks(tokens)) == {"d": 16 * 20}


def test_the_caps_ageing_is_seen_at_the_first_key() -> None:
    """`max_blocks` ages a chain out from its first block (the oldest stored), which every scan reads."""
    index = live_index("a", max_blocks=40)
    eng = Engine(16)
    first, second = doc(16 * 30, 1), doc(16 * 12, 2)
    eng.store(index, "a", first)
    eng.store(index, "a", second)  # 42 blocks: the first two of `first` aged out
    assert index.match(PromptBlocks(first)) == {"a": 0}
    assert index.match(PromptBlocks(second)) == {"a": 16 * 12}


def test_all_blocks_cleared_forgets_one_backend() -> None:
    index = live_index("a", "b")
    tokens = doc(64)
    eng = Engine(16)
    eng.store(index, "a", tokens)
    eng.store(index, "b", tokens)
    index.cleared("a")
    assert index.match(PromptBlocks(tokens), ["a", "b"]) == {"a": 0, "b": 64}


def test_the_cap_ages_out_the_oldest_blocks() -> None:
    index = live_index("a", max_blocks=10)
    eng = Engine(16)
    old, new = doc(160, 1), doc(160, 2)
    eng.store(index, "a", old)
    eng.store(index, "a", new)
    assert index.holds("a") == 10
    assert len(index) == 10
    assert index.match(PromptBlocks(new), ["a"]) == {"a": 160}
    assert index.match(PromptBlocks(old), ["a"]) == {"a": 0}


def test_small_pages_are_grouped_and_chain_from_any_page() -> None:
    """SGLang with page size 1: one hash per token, keyed in groups of 16 tokens."""
    index = live_index("a")
    eng = Engine(1)
    tokens = doc(70)
    hashes = eng.hashes(tokens)
    # the radix cache stores a node of 37 tokens, then a child from token 37 (mid-group)
    index.stored("a", hashes[:37], None, tokens[:37], 1)
    assert index.match(PromptBlocks(tokens), ["a"]) == {"a": 32}
    index.stored("a", hashes[37:], hashes[36], tokens[37:], 1)
    assert index.match(PromptBlocks(tokens), ["a"]) == {"a": 64}
    # a branch from token 20 (a split inside the first node)
    branch = [*tokens[:20], *doc(30, 5)]
    bh = eng.hashes(branch)
    index.stored("a", bh[20:], bh[19], branch[20:], 1)
    assert index.match(PromptBlocks(branch), ["a"]) == {"a": 48}
    # evicting the leaf: its group keys go
    index.removed("a", hashes[37:])
    assert index.match(PromptBlocks(tokens), ["a"]) == {"a": 32}


def test_mixed_block_sizes_in_one_pool() -> None:
    index = live_index("v", "s")
    tokens = doc(100)
    Engine(16).store(index, "v", tokens)
    Engine(32).store(index, "s", tokens)
    assert index.match(PromptBlocks(tokens), ["v", "s"]) == {"v": 96, "s": 96}
    assert index.block_size("s") == 32
    # a partial block (another size on a known stream) is not indexed
    assert index.stored("s", [1], None, tokens[:16], 16) == 0


def test_a_partial_block_heard_first_does_not_fix_the_block_size() -> None:
    """vLLM 0.32 may store a prompt's tail as one short block (`block_size` = its length); if that is
    the first store a stream brings, the real blocks that follow must still be indexed."""
    index = live_index("v")
    tail = doc(7, 1)
    assert index.stored("v", [99], None, tail, 7) == 1
    tokens = doc(64, 2)
    assert Engine(16).store(index, "v", tokens) and index.block_size("v") == 16
    assert index.match(PromptBlocks(tokens), ["v"]) == {"v": 64}
    assert index.holds("v") == 4  # the tail keyed with the wrong size is gone
    assert index.stored("v", [98], None, tail, 7) == 0


def test_salted_blocks_match_only_the_same_salt() -> None:
    index = live_index("a")
    tokens = doc(64)
    hashes = Engine(16).hashes(tokens)
    index.stored("a", hashes, None, tokens, 16, extra_keys=[["s1"], None, None, None])
    assert index.match(PromptBlocks(tokens), ["a"]) == {"a": 0}
    assert index.match(PromptBlocks(tokens, first_extra=salt_extra("s1")), ["a"]) == {"a": 64}
    assert index.match(PromptBlocks(tokens, first_extra=salt_extra("s2")), ["a"]) == {"a": 0}


def test_a_lora_adapters_blocks_match_only_its_requests() -> None:
    """An adapter's blocks are its own cache namespace (vLLM hashes them with its name): they match a
    prompt keyed in that namespace (`seed_for(name)`), never the base model's, and the reverse."""
    index = live_index("a")
    tokens = doc(64)
    hashes = Engine(16).hashes(tokens)
    index.stored("a", hashes, None, tokens, 16, lora="tiny-lora")
    assert index.adapters == {"tiny-lora"}
    assert index.match(PromptBlocks(tokens, seed=seed_for("tiny-lora"))) == {"a": 64}
    assert index.match(PromptBlocks(tokens)) == {"a": 0}
    assert index.match(PromptBlocks(tokens, seed=seed_for("other"))) == {"a": 0}
    index.stored("a", Engine(16, salt=8).hashes(tokens), None, tokens, 16)  # the base model's own
    assert index.match(PromptBlocks(tokens)) == {"a": 64}
    assert index.adapters == {"tiny-lora"}


def test_a_silent_stream_is_not_trusted_until_it_speaks() -> None:
    index = live_index("a", silent_requests=3, silent_s=5.0)
    tokens = doc(64)
    eng = Engine(16)
    eng.store(index, "a", tokens)
    index.tick(100.0)
    for _ in range(3):
        index.note_routed("a")
    assert index.usable("a")  # three unanswered, but not for long yet
    index.tick(106.0)
    assert not index.usable("a")
    assert index.match(PromptBlocks(tokens), ["a"]) == {}
    index.removed("a", [])  # any event
    assert index.usable("a")


def test_a_gap_forgets_and_distrusts_for_a_while() -> None:
    index = live_index("a", relearn_s=30.0)
    tokens = doc(64)
    eng = Engine(16)
    eng.store(index, "a", tokens)
    index.tick(10.0)
    index.gap("a")
    assert not index.usable("a")
    eng.store(index, "a", tokens)
    index.tick(41.0)
    assert index.match(PromptBlocks(tokens), ["a"]) == {"a": 64}
    index.set_live("a", False)
    assert index.match(PromptBlocks(tokens), ["a"]) == {}


def test_detach_frees_the_slot_and_the_keys() -> None:
    index = live_index("a", "b")
    tokens = doc(64)
    Engine(16).store(index, "a", tokens)
    index.detach("a")
    assert len(index) == 0
    index.attach("c")
    index.set_live("c", True)
    assert index.match(PromptBlocks(tokens), ["b", "c"]) == {"b": 0, "c": 0}


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("sr"), st.integers(0, 5), st.integers(0, 1)), max_size=60),
    # (stride, leaves first): any removals only when every key is read
    st.sampled_from([(1, False), (1, True), (2, True), (3, True), (8, True), (0, True)]),
)
def test_matches_agree_with_a_model_of_the_engines(
    ops: list[tuple[str, int, int]], scan: tuple[int, bool]
) -> None:
    """Random stores and removals of six prompts sharing prefixes (up to 12 blocks) on two backends:
    the index's match is the longest prefix whose every block the model says is held. Exact with
    any removals when every key is read; with a stride or bisecting, when the engines evict leaves first (a
    block no held block of the backend chains from) as real ones do."""
    stride, leaves_first = scan
    base = doc(96, 9)
    prompts = [base[: 16 * (1 + 2 * (i % 3))] + doc(16 * (2 * (i // 3)), i) for i in range(6)]
    eng = Engine(16)
    names = ["a", "b"]
    index = live_index(*names, scan_stride=stride)
    held: dict[str, set[int]] = {n: set() for n in names}
    parent: dict[int, int | None] = {}
    for prompt in prompts:
        chain = eng.hashes(prompt)
        parent.update(zip(chain, [None, *chain[:-1]], strict=True))
    for op, p, b in ops:
        name = names[b]
        hashes = eng.hashes(prompts[p])
        if op == "s":
            index.stored(name, hashes, None, prompts[p][: 16 * len(hashes)], 16)
            held[name].update(hashes)
        elif not leaves_first or not any(parent[h] == hashes[-1] for h in held[name]):
            index.removed(name, hashes[-1:])
            held[name].difference_update(hashes[-1:])
    for p in prompts:
        hashes = eng.hashes(p)
        want = {}
        for n in names:
            d = 0
            while d < len(hashes) and hashes[d] in held[n]:
                d += 1
            want[n] = d * 16
        assert index.match(PromptBlocks(p), names) == want
        assert index.match(PromptBlocks(p)) == want  # every attached backend, the same answer


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("snnnttttlgcdaer"), st.integers(0, 1), st.floats(0.0, 4.0)), max_size=40
    )
)
def test_the_remembered_usable_streams_follow_every_change(ops: list[tuple[str, int, float]]) -> None:
    """`match` over every backend remembers which streams are usable: after any sequence of events,
    routing notes, clock ticks, liveness changes, gaps, clears, detaches and attaches it answers as
    a match naming every backend (which works them out afresh)."""
    tokens = doc(48)
    eng = Engine(16)
    names = ["a", "b"]
    index = live_index(*names, silent_requests=2, silent_s=3.0, relearn_s=5.0)
    now = 0.0
    for op, b, dt in ops:
        name = names[b]
        if op == "s":
            eng.store(index, name, tokens)
        elif op == "r":
            index.removed(name, [])
        elif op == "n":
            index.note_routed(name)
        elif op == "t":
            now += dt
            index.tick(now)
        elif op == "l":
            index.set_live(name, dt < 2.0)
        elif op == "g":
            index.gap(name)
        elif op == "c":
            index.cleared(name)
        elif op == "d":
            index.detach(name)
        elif op == "a":
            index.attach(name)
        else:
            index.stored(name, [1], None, tokens[:8], 8)  # another block size: a new key group
        prompt = PromptBlocks(tokens)
        assert index.match(prompt) == index.match(prompt, index.names)
        assert set(index.match(prompt)) == {n for n in index.names if index.usable(n)}


def test_the_clock_alone_silences_and_trusts_again() -> None:
    """What `match` remembers of the streams follows the clock: a stream turns silent, and a gap's
    distrust ends, with no other call between."""
    index = live_index("a", "b", silent_requests=2, silent_s=3.0, relearn_s=5.0)
    tokens = doc(32)
    prompt = PromptBlocks(tokens)
    Engine(16).store(index, "a", tokens)
    assert index.match(prompt) == {"a": 32, "b": 0}
    index.note_routed("b")
    index.note_routed("b")
    assert index.match(prompt) == {"a": 32, "b": 0}  # unanswered, not for long yet
    index.tick(3.0)
    assert index.match(prompt) == {"a": 32}
    index.gap("a")
    index.removed("b", [])  # b speaks again
    assert index.match(prompt) == {"b": 0}
    index.tick(8.0)
    assert index.match(prompt) == {"a": 0, "b": 0}


def test_a_silent_stream_is_trusted_as_soon_as_it_speaks() -> None:
    index = live_index("a", silent_requests=2, silent_s=3.0)
    prompt = PromptBlocks(doc(32))
    index.note_routed("a")
    index.note_routed("a")
    index.tick(3.0)
    assert index.match(prompt) == {}
    index.removed("a", [])  # an event, the clock unchanged
    assert index.match(prompt) == {"a": 0}


def test_memory_per_block_is_bounded() -> None:
    """8 backends at a cap of 5,000 engine blocks each, sent 7,040 (640 of them shared by all): the
    cap holds and the bytes per engine block stay small."""
    index = live_index(*[f"b{i}" for i in range(8)], max_blocks=5000)
    eng = Engine(16)
    shared = [doc(1024, s) for s in range(10)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(8):
        for s in range(10):
            eng.store(index, f"b{i}", shared[s])
        for j in range(100):
            eng.store(index, f"b{i}", doc(1024, 1000 * i + j))
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    blocks = sum(index.holds(f"b{i}") for i in range(8))
    assert blocks == 8 * 5000  # the cap held
    per_block = (after - before) / blocks
    assert per_block < 320, per_block  # measured ~254 on CPython 3.11


def test_bad_bounds_are_refused() -> None:
    for field in ("max_blocks", "min_block_tokens", "silent_requests"):
        with pytest.raises(ValueError, match=field):
            KvIndexConfig(**{field: 0})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scan_stride"):
        KvIndexConfig(scan_stride=-1)
    with pytest.raises(ValueError, match="relearn_s"):
        KvIndexConfig(relearn_s=-1.0)


def test_a_store_under_a_parent_stored_before_subscribing_is_anchored_on_the_routed_prompt() -> None:
    """A gateway that starts beside an engine that has served: the prompt's first blocks (a shared
    system prompt, the chat template's first tokens) were stored before it subscribed, so the store of
    the rest names a parent it never heard of. The prompt it routed there places the store: the
    prefix before it is held too, until the engine removes the parent."""
    index = live_index("a", "b")
    eng = Engine(16)
    shared = doc(80, 1)
    tokens = [*shared[:64], *doc(100, 2)]
    hashes = eng.hashes(tokens)
    prompt = PromptBlocks(tokens)
    index.note_routed("b", prompt)  # routed elsewhere: places nothing on "a"
    index.stored("a", hashes[4:], hashes[3], tokens[64:160], 16)
    assert index.match(prompt, ["a"]) == {"a": 0}
    assert index.stats()["a"]["orphans"] == 1
    index.note_routed("a", prompt)
    index.stored("a", hashes[4:], hashes[3], tokens[64:160], 16)
    assert index.match(prompt, ["a", "b"]) == {"a": 160, "b": 0}
    assert index.stats()["a"]["anchored"] == 1
    # a later turn of the conversation, stored under the anchored chain, is keyed as usual
    longer = [*tokens, *doc(40, 3)]
    more = eng.hashes(longer)
    index.stored("a", more[10:], more[9], longer[160:192], 16)
    assert index.match(PromptBlocks(longer), ["a"]) == {"a": 192}
    # another prompt under the same shared start is held up to it (the anchored prefix)
    other = [*shared[:64], *doc(50, 4)]
    assert index.match(PromptBlocks(other), ["a"]) == {"a": 64}
    # the engine evicts leaves first; its parent's removal takes the anchored prefix with it
    index.removed("a", [*more[10:], *hashes[4:]])
    assert index.match(PromptBlocks(other), ["a"]) == {"a": 64}
    index.removed("a", [hashes[3]])
    assert index.match(PromptBlocks(other), ["a"]) == {"a": 0}
    assert index.holds("a") == 0 and len(index) == 0


def test_small_pages_under_an_unknown_parent_are_anchored_mid_group() -> None:
    """SGLang's 1-token pages: a store continues the radix tree at any token, here mid-group."""
    index = live_index("a")
    eng = Engine(1)
    tokens = doc(120, 6)
    hashes = eng.hashes(tokens)
    prompt = PromptBlocks(tokens)
    index.note_routed("a", prompt)
    index.stored("a", hashes[21:], hashes[20], tokens[21:], 1)  # tokens 0-20 cached before
    assert index.match(prompt, ["a"]) == {"a": 112}
    index.removed("a", hashes[21:])
    assert index.match(prompt, ["a"]) == {"a": 16}  # the anchored prefix: its full group
    index.removed("a", [hashes[20]])
    assert index.match(prompt, ["a"]) == {"a": 0}


def test_a_store_too_short_or_nowhere_in_the_routed_prompts_invents_nothing() -> None:
    index = live_index("a")
    eng = Engine(1)
    tokens = doc(100, 7)
    hashes = eng.hashes(tokens)
    index.note_routed("a", PromptBlocks(tokens))
    index.stored("a", hashes[90:95], hashes[89], tokens[90:95], 1)  # 5 tokens: could match by chance
    elsewhere = doc(40, 8)
    eh = eng.hashes(elsewhere)
    index.stored("a", eh[10:], eh[9], elsewhere[10:], 1)  # another process's request
    # the store's tokens at the very start: no parent can precede them there
    index.stored("a", hashes[:30], 12345, tokens[:30], 1)
    assert index.match(PromptBlocks(tokens), ["a"]) == {"a": 0}
    assert index.stats()["a"] == {"blocks": 0, "orphans": 3, "anchored": 0, "usable": True}


def test_anchored_prefixes_count_against_max_blocks() -> None:
    """Each anchored prefix records its groups; all of them together stay within `max_blocks`, even
    when the nodes they name have aged out of the index already."""
    index = live_index("a", max_blocks=16)
    eng = Engine(1)
    for i in range(30):
        tokens = doc(400, 200 + i)
        hashes = eng.hashes(tokens)
        index.note_routed("a", PromptBlocks(tokens))
        index.stored("a", hashes[300:], hashes[299], tokens[300:], 1)  # 4 full groups before it
    st = index._streams["a"]  # the bound is internal: what the anchors keep, not what matches
    assert st.anchor_names == sum(len(names) for names in st.anchors.values()) <= 16
    assert (
        index.holds("a") <= 16 and index.stats()["a"]["anchored"] == 30 and index.stats()["a"]["orphans"] == 0
    )
