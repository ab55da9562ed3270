"""Prefix affinity with the engines' KV-cache events: exact holders, agreement, no stale affinity."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from engines.sim import tokenizer
from engines.sim.prompt import render_chat
from policies.kv_blocks import PromptBlocks
from policies.kv_index import KvIndexConfig
from policies.prefix_affinity import PrefixAffinity, PrefixAffinityConfig, _warmable, opening_group
from policies.router import Router
from policies.types import BackendChoice, FleetSnapshot, PoolView, RequestFeatures
from tests.policies.fleet import conversation, features, fleet, grow, pool, text
from tests.policies.test_kv_index import Engine


def with_prompt(messages: list[dict[str, Any]], **body: Any) -> RequestFeatures:
    f = features(messages, **body)
    ids = tokenizer.encode(render_chat(messages, body.get("tools")))
    return dataclasses.replace(f, prompt=PromptBlocks(ids))


def process(p: PoolView, **config: Any) -> PrefixAffinity:
    policy = PrefixAffinity(PrefixAffinityConfig(**config))
    for b in p.backends:
        policy.kv_index.attach(b.name)
        policy.kv_index.set_live(b.name, True)
    return policy


def engine_stores(policies: list[PrefixAffinity], backend: str, f: RequestFeatures) -> list[int]:
    """The engine of `backend` computed the prompt: every process's index hears it."""
    assert f.prompt is not None
    ids = f.prompt.token_ids()
    hashes: list[int] = []
    for policy in policies:
        hashes = Engine(16).store(policy.kv_index, backend, ids)
    return hashes


def route(policy: PrefixAffinity, p: PoolView, f: RequestFeatures) -> BackendChoice:
    choice = policy.select(p, f, 0.0)
    policy.on_routed(p, f, choice)
    return choice


def load(p: PoolView, name: str, in_flight: int) -> PoolView:
    members = tuple(dataclasses.replace(b, in_flight=in_flight) if b.name == name else b for b in p.backends)
    return dataclasses.replace(p, backends=members)


def test_four_processes_send_a_prefix_where_the_engine_holds_it() -> None:
    """A document cached on a backend that is not its rendezvous home (placed there by load):
    every process, none of which routed it, sends its next question there once the events arrive."""
    rng = random.Random(1)
    p = pool("a", 8)
    document = text(rng, 900)
    first = with_prompt([{"role": "user", "content": document + " question one"}])
    processes = [process(p) for _ in range(4)]
    home = processes[0].select(p, first, 0.0).backend
    holder = next(b.name for b in p.backends if b.name != home)
    engine_stores(processes, holder, first)
    later = with_prompt([{"role": "user", "content": document + " another question"}])
    choices = [proc.select(p, later, 0.0) for proc in processes]
    assert {c.backend for c in choices} == {holder}
    assert all(c.reason == "affinity:index" for c in choices)
    # the control: without the prompt's token blocks the processes know nothing of it
    blind = dataclasses.replace(later, prompt=None)
    assert {proc.select(p, blind, 0.0).backend for proc in processes} == {home}


def test_a_cleared_engine_leaves_no_stale_affinity() -> None:
    """A conversation moved off its home by load is followed there by the process that moved it -
    until that engine says it lost its cache (a restart): then it goes home again."""
    rng = random.Random(2)
    p = pool("a", 8)
    messages = conversation(rng, system=text(rng, 40), words=200)
    proc = process(p, pending_s=5.0)
    f1 = with_prompt(messages)
    home = proc.select(p, f1, 0.0).backend
    busy = load(p, home, 30)
    moved = route(proc, busy, f1)
    assert moved.backend != home
    engine_stores([proc], moved.backend, f1)
    messages = grow(rng, messages)
    assert proc.select(p, with_prompt(messages), 0.0).backend == moved.backend
    proc.kv_index.cleared(moved.backend)
    proc.kv_index.tick(proc.kv_index.now + 6.0)  # past the pending window of the decision
    assert proc.select(p, with_prompt(messages), 0.0).backend == home


def test_a_decision_counts_until_its_events_arrive() -> None:
    """Right after a document's first question was sent (its prefill still queued, no events yet),
    the next one follows it rather than placing the document again."""
    rng = random.Random(3)
    p = pool("a", 8)
    document = text(rng, 900)
    proc = process(p, pending_s=5.0)
    first = with_prompt([{"role": "user", "content": document + " one"}])
    home = proc.select(p, first, 0.0).backend
    moved = route(proc, load(p, home, 30), first)
    assert moved.backend != home
    second = with_prompt([{"role": "user", "content": document + " two"}])
    assert proc.select(p, second, 0.0).backend == moved.backend
    proc.kv_index.tick(proc.kv_index.now + 6.0)  # the events never came: the engine does not hold it
    assert proc.select(p, second, 0.0).backend == home


def test_without_a_usable_stream_the_approximate_affinity_decides() -> None:
    rng = random.Random(4)
    p = pool("a", 8)
    messages = conversation(rng, system=text(rng, 40), words=200)
    proc = process(p, pending_s=0.0, kv=KvIndexConfig(silent_requests=1, silent_s=0.0))
    f1 = with_prompt(messages)
    home = proc.select(p, f1, 0.0).backend
    moved = route(proc, load(p, home, 30), f1).backend
    messages = grow(rng, messages)
    f2 = with_prompt(messages)
    # events are usable and say nothing is cached anywhere: home
    proc.kv_index.cleared(moved)
    assert proc.select(p, f2, 0.0).backend == home
    # the stream of `moved` goes down: this process's own memory of the move decides for it
    proc.kv_index.set_live(moved, False)
    assert proc.select(p, f2, 0.0).backend == moved
    # a gap (lost events): the same until it has relearnt
    proc.kv_index.set_live(moved, True)
    proc.kv_index.gap(moved)
    assert proc.select(p, f2, 0.0).backend == moved


def test_a_holder_busier_than_its_prefill_is_worth_spills() -> None:
    rng = random.Random(5)
    p = pool("a", 8)
    document = text(rng, 900)
    proc = process(p)
    first = with_prompt([{"role": "user", "content": document + " one"}])
    holder = proc.select(p, first, 0.0).backend
    engine_stores([proc], holder, first)
    second = with_prompt([{"role": "user", "content": document + " two"}])
    assert proc.select(load(p, holder, 3), second, 0.0).backend == holder
    assert proc.select(load(p, holder, 40), second, 0.0).backend != holder


def test_a_proposal_to_the_shared_store_takes_the_lightest_of_its_choices() -> None:
    """Placing a new preamble group, a process keeps `placement_slack` for agreement with the other
    processes; proposing it to the shared store (which makes them agree) it takes the lightest of its
    first choices (`shared_placement_slack`, 0)."""
    from policies.features import FeatureConfig, extract_features
    from policies.router import Router
    from policies.shared_load import SharedRouting
    from policies.types import BackendView, FleetSnapshot, PoolView

    router = Router([], PrefixAffinityConfig())
    policy = router.policy
    assert isinstance(policy, PrefixAffinity)
    names = [f"b{i}" for i in range(4)]
    pool = PoolView("p", "vllm", 1.0, frozenset({"m"}), True, True, tuple(BackendView(n) for n in names))
    snapshot = FleetSnapshot((pool,))

    def group(i: int) -> dict[str, object]:
        system = " ".join(f"rule{i}-{k}" for k in range(800))
        return {
            "model": "m",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "q"}],
        }

    f = extract_features(group(0), FeatureConfig())
    home = policy.rank(pool, f)[0].name
    # the home already got one other group (within the slack of two groups), the others none
    other = next(
        extract_features(group(i), FeatureConfig())
        for i in range(1, 200)
        if policy.rank(pool, extract_features(group(i), FeatureConfig()))[0].name == home
    )
    router.decide(snapshot, other, 0.5)
    assert router.decide(snapshot, f, 0.5, dry_run=True).backend == home  # slack 2: home
    ask = SharedRouting(router).ask(lambda: snapshot, f)
    assert ask is not None and ask.proposal is not None and ask.proposal != home  # slack 0
    assert router.decide(snapshot, f, 0.5, dry_run=True).backend == home  # the flag did not stay
    # the store may place it on any of its first choices as light as the proposal: the proposal
    # first, the home (one group heavier here) not among them
    choices = [b.name for b in policy.rank(pool, f)][: policy.config.shared_group_choices]
    assert ask.candidates[0] == ask.proposal and set(ask.candidates) <= set(choices)
    assert home not in ask.candidates and len(ask.candidates) == len(choices) - 1
    assert ask.blocks > 0


def test_a_preamble_groups_proposal_has_more_choices_than_a_placement_alone() -> None:
    """A long preamble's new group proposed to the shared store may go to any of its first
    `shared_group_choices` backends; placed by a process alone (no store), and for an opening group
    (a long document) either way, to one of its first `group_choices` only. Eight backends whose
    first three (the group's rendezvous order) each hold a group: the proposal is the fourth or
    later, the placement alone and the document's proposal among the three."""
    from policies.features import FeatureConfig, extract_features
    from policies.shared_load import SharedRouting
    from policies.types import BackendView, FleetSnapshot, PoolView

    def request(system: str, user: str) -> RequestFeatures:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return extract_features({"model": "m", "messages": messages}, FeatureConfig())

    def preamble(i: int) -> RequestFeatures:
        return request(" ".join(f"rule{i}-{k}" for k in range(800)), "q")

    def document(i: int) -> RequestFeatures:
        return request("be brief", " ".join(f"page{i}-{k}" for k in range(800)))

    names = [f"b{i}" for i in range(8)]
    pool = PoolView("p", "vllm", 1.0, frozenset({"m"}), True, True, tuple(BackendView(n) for n in names))
    snapshot = FleetSnapshot((pool,))
    for make in (preamble, document):
        new = make(0)
        router = Router([], PrefixAffinityConfig())
        policy = router.policy
        assert isinstance(policy, PrefixAffinity)
        config = policy.config
        assert config.group_choices < 4 <= config.shared_group_choices
        order = [b.name for b in policy.rank(pool, new)]
        first = set(order[: config.group_choices])
        # one group of the same kind on each of the first choices
        taken: set[str] = set()
        for i in range(1, 400):
            other = make(i)
            home = policy.rank(pool, other)[0].name
            if home in first and home not in taken:
                assert router.decide(snapshot, other, 0.5).backend == home
                taken.add(home)
            if taken == first:
                break
        assert taken == first
        ask = SharedRouting(router).ask(lambda: snapshot, new)
        assert ask is not None and ask.proposal is not None
        alone = router.decide(snapshot, new, 0.5, dry_run=True).backend
        assert alone in first
        if not opening_group(new, config):
            assert ask.proposal not in first and ask.proposal in order[: config.shared_group_choices]
            assert not first & set(ask.candidates)
        else:
            assert ask.proposal in first and set(ask.candidates) <= first


def test_no_routable_backend_makes_no_proposal() -> None:
    """A new group's proposal in a fleet with no routable backend: none (the decision proper reports
    the error to the client). Only such errors mean no proposal (`SharedRouting.ask`)."""
    from policies.features import FeatureConfig, extract_features
    from policies.shared_load import SharedRouting
    from policies.types import BackendView

    router = Router([], PrefixAffinityConfig())
    down = tuple(BackendView(f"b{i}", healthy=False) for i in range(2))
    snapshot = FleetSnapshot((PoolView("p", "vllm", 1.0, frozenset({"m"}), True, True, down),))
    system = " ".join(f"rule-{k}" for k in range(800))
    f = extract_features({"model": "m", "messages": [{"role": "system", "content": system}]}, FeatureConfig())
    ask = SharedRouting(router).ask(lambda: snapshot, f)
    assert ask is not None and ask.proposal is None


def test_with_other_processes_routing_a_new_group_may_be_placed_in_another_pool() -> None:
    """While other processes have requests in flight, what this process sent is only its part: the
    store may place a new group in any of the request's pools of the same weight per backend - for
    a document (an opening group) any, for a long preamble's group those this process finds within
    one group of its own pool choice. Alone, only the chosen pool's backends are candidates."""
    from policies.pool_placement import PoolPlacement
    from policies.shared_load import SharedRouting

    rng = random.Random(5)
    a, b, c = pool("a", 4), pool("b", 4), pool("c", 2, weight=1.0)  # c: twice a's weight per backend
    snapshot = fleet(a, b, c)
    router = Router()
    document = features([{"role": "user", "content": text(rng, 900) + " What is it about?"}])
    alone = SharedRouting(router).ask(lambda: snapshot, document)
    assert alone is not None and alone.proposal is not None
    chosen = next(p for p in (a, b, c) if any(x.name == alone.proposal for x in p.backends))
    assert {n.split("-")[0] for n in alone.candidates} == {chosen.name}
    shared = SharedRouting(router).ask(lambda: snapshot, document, others=True)
    assert shared is not None and shared.candidates[: len(alone.candidates)] == alone.candidates
    pools = {n.split("-")[0] for n in shared.candidates}
    same = {"a", "b"} if chosen.name != "c" else {"c"}  # equal weight per backend only
    assert pools == same
    assert router.other_pools(snapshot, document, "nowhere") == []
    # a long preamble's group: only pools within one group of the chosen one, by this process's sets
    placement = PoolPlacement(PrefixAffinityConfig())
    preamble = features(conversation(rng, system=text(rng, 900)))
    for i in range(3):
        placement.note(i, "b", "b", preamble)
    assert [p.name for p in placement.as_light([a, b], preamble)] == ["a"]
    assert [p.name for p in placement.as_light([b, a], preamble)] == ["b", "a"]
    assert [p.name for p in placement.as_light([a, b], document)] == ["a", "b"]  # an opening group


def test_a_group_the_store_placed_for_an_earlier_request_is_labelled_placed() -> None:
    """A new group's placement taken from the shared store: `affinity:placed` (affinity `hit`: its
    first prefill is under way there) when an earlier request set it, `affinity:miss` when this
    request's own ask did; a placement in another pool is neither (the group's own placement here)."""
    from policies.shared_load import SharedRouting

    p = pool("vllm", 4)
    system = " ".join(f"rule-{k}" for k in range(800))
    f = features([{"role": "system", "content": system}, {"role": "user", "content": "q"}])
    policy = PrefixAffinity()
    second = policy.rank(p, f)[1].name
    choice = policy.select(p, SharedRouting.placed(f, second, before=True), 0.0)
    assert (choice.backend, choice.reason, choice.affinity) == (second, "affinity:placed", "hit")
    choice = policy.select(p, SharedRouting.placed(f, second), 0.0)
    assert (choice.backend, choice.reason, choice.affinity) == (second, "affinity:miss", "miss")
    choice = policy.select(p, SharedRouting.placed(f, "sglang-9", before=True), 0.0)
    assert choice.reason != "affinity:placed"
    assert SharedRouting.placed(f, None, before=True).placed_before is False


def test_the_store_places_a_new_group_on_the_candidate_with_the_fewest_placed_blocks() -> None:
    """`PlacedBlocks`, the store's rule (the gateway's Redis script does the same): fewest placed
    blocks, the first of equals (the proposal), the group's blocks charged there, halving with age."""
    from policies.shared_load import PlacedBlocks

    store = PlacedBlocks(half_life_ms=1000.0)
    # a burst of three groups, every process proposing the same (empty-looking) home: spread
    assert [store.place(("b0", "b1", "b2"), 100, 0.0) for _ in range(3)] == ["b0", "b1", "b2"]
    assert store.place(("b2", "b0"), 50, 0.0) == "b2"  # equals: the first (the proposal)
    assert store.load("b2", 0.0) == 150.0 and store.load("b0", 0.0) == 100.0
    assert store.load("b2", 1000.0) == 75.0  # one half-life later
    assert store.place(("b2", "b3"), 10, 1000.0) == "b3"  # never placed on: zero
    assert store.place(("b1",), 10, 2000.0) == "b1"  # one candidate: it


def test_a_holder_may_run_above_the_bound_by_the_prefill_its_engine_holds() -> None:
    """A document held by one engine (its events say so) stays there while that backend runs above
    the bounded-load rule's limit, as far as `warm_slack` x the requests' worth of the held blocks;
    with `warm_slack` 0 the bound moves it off at once, and far past the extension it spills too."""
    rng = random.Random(6)
    p = pool("a", 8)
    document = text(rng, 1500)
    ask = with_prompt([{"role": "user", "content": document + " which one?"}])
    proc, bound_only = process(p), process(p, warm_slack=0.0)
    home = proc.select(p, ask, 0.0).backend
    engine_stores([proc, bound_only], home, ask)
    held = proc.holders(ask)
    assert held is not None and held[home] > 60  # ~2,000 tokens of the prompt, in blocks
    # bound = ceil(1.25 x (16 + 1) / 8) + 6 = 9 in flight; the held blocks are worth > 30 requests
    busy = load(p, home, 16)
    assert bound_only.select(busy, ask, 0.0).backend != home
    assert proc.select(busy, ask, 0.0)[:3] == (home, "affinity:hit", "hit")
    far = load(p, home, 200)
    assert proc.select(far, ask, 0.0).backend != home


def test_a_hot_group_gets_no_warm_slack() -> None:
    """A group that is half of its pool's traffic (two tool sets, four backends) cannot stay on one
    backend by its held prefix: the bound shares its load, as without `warm_slack` - even in a
    process that has seen only a dozen of the pool's requests, as one of eight routing processes
    early in a run."""
    rng = random.Random(7)
    p = pool("a", 4)

    def tools() -> list[dict[str, Any]]:
        return [
            {"type": "function", "function": {"name": "f", "description": text(rng, 900), "parameters": {}}}
        ]

    first, second = tools(), tools()
    proc, bound_only = process(p), process(p, warm_slack=0.0)
    asks = [with_prompt([{"role": "user", "content": text(rng, 20)}], tools=first) for _ in range(8)]
    home = proc.select(p, asks[0], 0.0).backend
    engine_stores([proc, bound_only], home, asks[0])
    # bound = ceil(1.25 x (12 + 1) / 4) + 6 = 11 in flight
    busy = load(p, home, 12)
    fresh = process(p)
    engine_stores([fresh], home, asks[0])
    assert fresh.select(busy, asks[1], 0.0).backend == home  # a group never seen before: not hot
    for f in asks[:6]:  # half of the pool's requests, the other tool set the other half
        other = with_prompt([{"role": "user", "content": text(rng, 20)}], tools=second)
        for policy in (proc, bound_only):
            policy.on_routed(p, f, BackendChoice(home, "affinity:hit", "hit"))
            policy.on_routed(p, other, BackendChoice(p.backends[0].name, "affinity:hit", "hit"))
    last = asks[-1]
    key = proc.key(last)
    assert proc._demand.hot(p.name, key, 4, 1.25)
    assert proc.select(busy, last, 0.0).backend == bound_only.select(busy, last, 0.0).backend != home


def test_a_pool_whose_engine_holds_the_document_keeps_it_above_the_pools_bound() -> None:
    """The pool bound yields to what an engine holds, as the backend bound does (`warm_slack`): a
    document held by an idle engine of its pool is not moved to the other pool (a cold copy) because
    another backend there runs many requests; with `warm_slack` 0, or far past the stretch, it is."""
    rng = random.Random(8)
    document = text(rng, 1500)
    ask = with_prompt([{"role": "user", "content": document + " which one?"}])
    quiet = fleet(pool("vllm", 4), pool("sglang", 4, dialect="sglang"))

    def router(**config: Any) -> Router:
        r = Router(policy_config=PrefixAffinityConfig(**config))
        assert r.kv_index is not None
        for p in quiet.pools:
            for b in p.backends:
                r.kv_index.attach(b.name)
                r.kv_index.set_live(b.name, True)
        return r

    ours, bound_only = router(), router(warm_slack=0.0)
    first = ours.decide(quiet, ask, 0.0)
    for r in (ours, bound_only):
        assert isinstance(r.policy, PrefixAffinity)
        engine_stores([r.policy], first.backend, ask)
    home = next(p for p in quiet.pools if p.name == first.pool)
    other = next(p for p in quiet.pools if p.name != first.pool)
    busy_one = next(b.name for b in home.backends if b.name != first.backend)

    def with_load(in_flight: int) -> FleetSnapshot:
        # the pool bound: 1.25 x (in_flight + 4 + 1) x 0.5 + 6; the holder is idle
        return fleet(load(home, busy_one, in_flight), load(other, other.backends[0].name, 4))

    snap = with_load(40)  # 41 > 1.25 x 45 x 0.5 + 6 = 34.1; the held document stretches it by ~18
    assert bound_only.decide(snap, ask, 0.0).pool == other.name
    kept = ours.decide(snap, ask, 0.0)
    assert (kept.pool, kept.backend) == (first.pool, first.backend)
    assert ours.decide(with_load(400), ask, 0.0).pool == other.name


def test_a_backend_with_usable_events_is_recorded_at_every_stride_th_block() -> None:
    """The process's own index records a prompt sent to a backend whose engine reports its blocks
    sparsely (`index_stride`), and fully where the engine does not: there it is all there is."""
    rng = random.Random(7)
    p = pool("a", 4)
    long = with_prompt([{"role": "user", "content": text(rng, 3000)}])
    blocks = len(long.block_hashes)
    assert blocks > 64
    reporting = process(p)
    route(reporting, p, long)
    silent = PrefixAffinity(PrefixAffinityConfig())
    route(silent, p, long)
    stride = PrefixAffinityConfig().index_stride
    assert stride > 1
    assert len(silent.index) > 3 * len(reporting.index)
    assert len(reporting.index) <= (blocks + stride - 1) // stride + 2


def test_a_first_turn_prefers_an_engine_that_holds_its_short_system_prompt() -> None:
    """A short system prompt (no group: the conversation anchor is the key) is assumed warm on every
    backend without events; once every engine reports what it holds, its held blocks count at
    `preamble_weight`: a first turn goes where another conversation's turn left the system prompt,
    unless that engine is busier than the saved prefill is worth; and with one stream unusable, the
    assumption decides again (the conversation's rendezvous home)."""
    rng = random.Random(11)
    p = pool("a", 8)
    system = text(rng, 300)
    earlier = with_prompt(conversation(rng, system=system, words=60))
    new = with_prompt(conversation(rng, system=system, words=60))
    home = process(p, preamble_weight=0.0).select(p, new, 0.0).backend
    holder = next(b.name for b in p.backends if b.name != home)
    proc = process(p)
    assert proc.config.preamble_weight == 0.25
    engine_stores([proc], holder, earlier)
    assert proc.select(p, new, 0.0).backend == holder
    assert proc.select(load(p, holder, 4), new, 0.0).backend == home
    # weight 0: the system prompt is assumed warm everywhere, events or not
    blind = process(p, preamble_weight=0.0)
    engine_stores([blind], holder, earlier)
    assert blind.select(p, new, 0.0).backend == home
    # one engine without a usable stream: no engine's report of the preamble counts
    partial = process(p, kv=KvIndexConfig(silent_requests=1, silent_s=0.0))
    engine_stores([partial], holder, earlier)
    quiet = next(b.name for b in p.backends if b.name not in (home, holder))
    partial.kv_index.note_routed(quiet)
    assert not partial.kv_index.usable(quiet)
    assert partial.select(p, new, 0.0).backend == home


def test_a_documents_proposal_adds_the_other_processes_working_sets_and_queued_prefill_is_shared() -> None:
    """Each process sees only its part of the traffic, so a document's placement (the lightest
    working set of its first choices) proposed to the store adds the other processes' working sets
    and tails, which the store brings: here this process has sent nothing, the others have filled
    the document's first two choices, and the proposal is its third. A long preamble's proposal
    does not add them (its placement goes by the store's placed blocks)."""
    from policies.features import FeatureConfig, extract_features
    from policies.shared_load import PREFILL, SETS, SharedRouting, split, with_others
    from policies.types import BackendView

    def request(system: str, user: str) -> RequestFeatures:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return extract_features({"model": "m", "messages": messages}, FeatureConfig())

    document = request("be brief", " ".join(f"page-{k}" for k in range(800)))
    preamble = request(" ".join(f"rule-{k}" for k in range(800)), "q")
    p = PoolView(
        "p", "vllm", 1.0, frozenset({"m"}), True, True, tuple(BackendView(f"b{i}") for i in range(4))
    )
    snapshot = FleetSnapshot((p,))
    for f, expected in ((document, 2), (preamble, 0)):
        router = Router([], PrefixAffinityConfig())
        policy = router.policy
        assert isinstance(policy, PrefixAffinity)
        assert opening_group(f, policy.config) == (f is document)
        order = [b.name for b in policy.rank(p, f)]
        share = SharedRouting(router)
        alone = share.ask(lambda: snapshot, f)
        assert alone is not None and alone.proposal == order[0]
        elsewhere = {order[0]: 300, order[1]: 200}
        ask = share.ask(lambda: snapshot, f, elsewhere=elsewhere)
        assert ask is not None and ask.proposal == order[expected]
        if f is document:  # the store may take the two lightest with the others' sets added
            assert ask.candidates == (order[2], order[1])
        again = share.ask(lambda: snapshot, f)  # nothing of `elsewhere` stayed
        assert again is not None and again.proposal == order[0]

    # what a process reports: its in-flight counts and, under SETS + the backend, its working sets
    router = Router([], PrefixAffinityConfig())
    chosen = router.decide(snapshot, document, 0.5).backend
    share = SharedRouting(router)
    reported = share.report({"b0": 2})
    assert reported["b0"] == 2 and reported[SETS + chosen] > 0 and len(reported) == 2
    assert split(reported) == ({"b0": 2}, {chosen: reported[SETS + chosen]}, {})
    # ... and, under PREFILL + the backend, the prompt tokens it sent there that await their first
    # token: another process's snapshot adds them to its own (`BackendView.prefill`)
    reported = share.report({"b0": 2}, {"b0": 700, "b1": 0})
    assert reported[PREFILL + "b0"] == 700 and PREFILL + "b1" not in reported
    counts, _, prefill = split(reported)
    assert counts == {"b0": 2} and prefill == {"b0": 700}
    mine = fleet(
        dataclasses.replace(p, backends=tuple(dataclasses.replace(b, prefill=50) for b in p.backends))
    )
    seen = {b.name: (b.in_flight, b.prefill) for b in with_others(mine, counts, prefill).pools[0].backends}
    assert seen["b0"] == (2, 750) and seen["b1"] == (0, 50)


def one_tool_set(n: int = 40, seed: int = 11) -> list[RequestFeatures]:
    """`n` requests of one agent's tool set (a ~900-word schema, then a short question each): one
    prefix group, all of its pool's traffic."""
    rng = random.Random(seed)
    tools = [{"type": "function", "function": {"name": "f", "description": text(rng, 900), "parameters": {}}}]
    return [with_prompt([{"role": "user", "content": text(rng, 20)}], tools=tools) for _ in range(n)]


def routed_hot(
    p: PoolView, asks: list[RequestFeatures], **config: Any
) -> tuple[PrefixAffinity, str, list[BackendChoice]]:
    """A process that routed every one of `asks` (one hot group), the first one's prompt held by its
    engine: the policy, the holder and the later requests' choices."""
    policy = process(p, **config)
    first = route(policy, p, asks[0])
    engine_stores([policy], first.backend, asks[0])
    return policy, first.backend, [route(policy, p, f) for f in asks[1:]]


def test_a_new_group_is_not_placed_beside_a_warm_up() -> None:
    """A warm-up puts a hot group's preamble in its target's cache, as a request of the group would:
    it counts in that backend's working set, so a new group (placed on the lightest of its first
    choices) goes elsewhere, not beside the warm-up's prefill as on an empty engine (bench.replay,
    agent loops at 50 %: a group's first request queued 1.3 s behind a warm-up there)."""
    p = pool("a", 4)
    policy, holder, choices = routed_hot(p, one_tool_set(), placement_slack=0.0)
    target = next(c.warm for c in choices if c.warm is not None)
    placed = 0
    for seed in range(300):  # new groups whose rendezvous order puts the warm-up's target first
        new = one_tool_set(1, seed=1000 + seed)[0]
        if policy.rank(p, new)[0].name != target:
            continue
        choice = policy.select(p, new, 0.0)
        assert choice.backend not in {target, holder}, choice
        assert choice.reason == "affinity:miss"
        placed += 1
        if placed == 3:
            break
    assert placed == 3


def test_a_hot_groups_next_holder_is_warmed_instead_of_sent_a_cold_request() -> None:
    """A group that is all of its pool's traffic is meant to be warm on several backends. With
    events, its next holder is named for a warm-up of the preamble (`BackendChoice.warm`) while the
    requests stay on the holder; once that engine's events show the preamble, it takes requests as a
    holder. One warm-up at a time, another once `pending_s` passed without the events. Without
    `warm_spread`, a request is sent there and prefills the preamble cold (`affinity:spread`)."""
    p = pool("a", 4)
    asks = one_tool_set()
    a0, a1 = asks[0].prompt, asks[1].prompt
    assert a0 is not None and a1 is not None
    ids, other = a0.token_ids(), a1.token_ids()
    shared = next(i for i, (x, y) in enumerate(zip(ids, other, strict=False)) if x != y)

    def hot(**config: Any) -> tuple[PrefixAffinity, str, list[BackendChoice]]:
        return routed_hot(p, asks, **config)

    proc, holder, choices = hot()
    warmups = [c for c in choices if c.warm is not None]
    assert len(warmups) == 1, "one warm-up of the group while it is under way"
    target = warmups[0].warm
    assert target is not None and target != holder
    assert {c.backend for c in choices} == {holder}
    # the preamble (the tool schemas: what every request shares), give or take the estimate
    assert 0.8 * shared <= warmups[0].warm_tokens <= shared
    busy = load(p, holder, 3)
    assert route(proc, busy, asks[1])[:3] == (holder, "affinity:hit", "hit")

    # its engine computed the warm-up: a holder now, which takes requests when the holder is busier
    Engine(16).store(proc.kv_index, target, ids[: warmups[0].warm_tokens])
    moved = route(proc, busy, asks[1])
    assert moved.backend == target and moved.warm is None

    # a warm-up the gateway did not send (its cap): the group's next request asks for it again
    skipped, _, _ = hot()
    assert route(skipped, p, asks[1]).warm is None
    skipped.warm_skipped(asks[0])
    assert route(skipped, p, asks[1]).warm == target

    # no events of a warm-up for `pending_s`: warmed again (the group still wants a next holder)
    again, _, _ = hot()
    assert all(route(again, p, f).warm is None for f in asks[:10])
    again.kv_index.tick(again.config.pending_s + 1)
    assert any(route(again, p, f).warm is not None for f in asks[:10])

    # without warm-ups a request opens the next holder, and prefills the preamble there cold
    cold, cold_holder, cold_choices = hot(warm_spread=False)
    assert all(c.warm is None for c in cold_choices)
    spread = route(cold, load(p, cold_holder, 3), asks[1])
    assert spread.reason == "affinity:spread" and spread.backend != cold_holder

    # a salted prompt's blocks carry its salt, which a warm-up's would not: none is sent for it
    salted = dataclasses.replace(asks[0], prompt=PromptBlocks(ids, first_extra=("tenant-salt",)))
    assert _warmable(asks[0]) and not _warmable(salted)

    # without the request's tokens (no tokenizer), nothing to warm it with
    blind = process(p)
    engine_stores([blind], holder, asks[0])
    assert all(route(blind, p, dataclasses.replace(f, prompt=None)).warm is None for f in asks)
