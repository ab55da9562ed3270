from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.features import LONG_PREAMBLE_BLOCKS, extract_features
from policies.hashing import mix64
from policies.pools import PoolBalance, Rule, capable, choose_pool
from policies.types import BackendView, RequestFeatures, RoutingError
from tests.policies.fleet import backends, fleet, pool

F = RequestFeatures("m", 100, (), 0, 0, has_tools=False, tool_choice=None, structured_output=False)
TOOLS = dataclasses.replace(F, has_tools=True, tool_choice="auto")
LONG = dataclasses.replace(F, prompt_tokens=9000)

# chi-square critical values at p = 0.001 for 1, 2, 3 degrees of freedom
CHI2_CRIT = {1: 10.83, 2: 13.82, 3: 16.27}


def _chi2(counts: Counter[str], weights: dict[str, float], n: int) -> float:
    total = sum(weights.values())
    return sum((counts[k] - n * w / total) ** 2 / (n * w / total) for k, w in weights.items())


@pytest.mark.parametrize("weights", [{"a": 0.5, "b": 0.5}, {"a": 0.7, "b": 0.2, "c": 0.1}, {"a": 3, "b": 1}])
def test_random_weighted_split_matches_weights(weights: dict[str, float]) -> None:
    snap = fleet(*(pool(name, weight=w) for name, w in weights.items()))
    rng = random.Random(42)
    n = 4000
    counts = Counter(choose_pool(snap, F, (), rng.random()).pool.name for _ in range(n))
    assert _chi2(counts, weights, n) < CHI2_CRIT[len(weights) - 1]


@pytest.mark.parametrize("weights", [{"a": 0.5, "b": 0.5}, {"a": 0.7, "b": 0.2, "c": 0.1}])
def test_sticky_weighted_split_matches_weights_over_conversations(weights: dict[str, float]) -> None:
    snap = fleet(*(pool(name, weight=w) for name, w in weights.items()))
    n = 4000
    counts = Counter(choose_pool(snap, F, (), 0.0, sticky_key=mix64(k)).pool.name for k in range(n))
    assert _chi2(counts, weights, n) < CHI2_CRIT[len(weights) - 1]


BALANCE = PoolBalance(load_factor=0.25, load_slack=1.0)


@pytest.mark.parametrize("weights", [{"a": 0.5, "b": 0.5}, {"a": 0.7, "b": 0.2, "c": 0.1}])
def test_balanced_sticky_choice_is_the_weighted_rendezvous_when_load_is_even(
    weights: dict[str, float],
) -> None:
    idle = fleet(*(pool(name, weight=w) for name, w in weights.items()))
    # load in proportion to the weights (per backend: equal pool sizes)
    even = fleet(
        *(
            pool(name, weight=w, members=backends(name, 4, in_flight=round(w * 40)))
            for name, w in weights.items()
        )
    )
    for k in range(2000):
        plain = choose_pool(idle, F, (), 0.0, sticky_key=mix64(k)).pool.name
        assert choose_pool(idle, F, (), 0.0, sticky_key=mix64(k), balance=BALANCE).pool.name == plain
        assert choose_pool(even, F, (), 0.0, sticky_key=mix64(k), balance=BALANCE).pool.name == plain


def test_balanced_sticky_choice_spills_from_an_overloaded_pool_in_rendezvous_order() -> None:
    hot = fleet(
        pool("a", members=backends("a", 4, in_flight=6)),
        pool("b", members=backends("b", 4, in_flight=1)),
        pool("c", members=backends("c", 4, in_flight=1)),
    )
    for k in range(500):
        key = mix64(k)
        home = choose_pool(hot, F, (), 0.0, sticky_key=key).pool.name
        chosen = choose_pool(hot, F, (), 0.0, sticky_key=key, balance=BALANCE).pool.name
        if home != "a":
            assert chosen == home  # keys at home in a pool with room stay
        else:
            assert chosen != "a"
            # the next pool in the key's own order, as every replica computes it
            without_a = fleet(*(p for p in hot.pools if p.name != "a"))
            assert chosen == choose_pool(without_a, F, (), 0.0, sticky_key=key).pool.name


def test_balance_ignores_stale_engine_counts() -> None:
    """At low load a scrape still counting a finished request must not move anyone."""
    snap = fleet(
        pool("a", members=backends("a", 2, running=1.0, queue_depth=3.0, kv_usage=0.5)),
        pool("b", members=backends("b", 2)),
    )
    for k in range(500):
        key = mix64(k)
        plain = choose_pool(snap, F, (), 0.0, sticky_key=key).pool.name
        assert choose_pool(snap, F, (), 0.0, sticky_key=key, balance=BALANCE).pool.name == plain


def test_balance_does_not_spill_to_a_pool_that_is_busier_per_backend() -> None:
    """Weights 0.8/0.2 on equal pools: the light pool runs fewer requests per backend even when it
    carries more than its share of requests; moving its requests to the heavy pool helps nobody."""
    snap = fleet(
        pool("heavy", weight=0.8, members=backends("heavy", 2, in_flight=10)),
        pool("light", weight=0.2, members=backends("light", 2, in_flight=4)),  # 8 of 28 > 1.25 x 20 %
    )
    keys = [mix64(k) for k in range(2000)]
    plain = Counter(choose_pool(snap, F, (), 0.0, sticky_key=k).pool.name for k in keys)
    balanced = Counter(choose_pool(snap, F, (), 0.0, sticky_key=k, balance=BALANCE).pool.name for k in keys)
    assert balanced == plain


def test_sticky_weight_change_moves_only_the_needed_share() -> None:
    before = fleet(pool("a", weight=0.5), pool("b", weight=0.5))
    after = fleet(pool("a", weight=0.4), pool("b", weight=0.6))
    keys = [mix64(k) for k in range(4000)]
    moved = sum(
        choose_pool(before, F, (), 0.0, sticky_key=k).pool.name
        != choose_pool(after, F, (), 0.0, sticky_key=k).pool.name
        for k in keys
    )
    assert moved / len(keys) < 0.15  # ideal: 0.10


def test_weight_zero_removes_a_pool() -> None:
    snap = fleet(pool("a", weight=0.0), pool("b", weight=1.0))
    for i in range(200):
        assert choose_pool(snap, F, (), i / 200).pool.name == "b"
        assert choose_pool(snap, F, (), 0.0, sticky_key=mix64(i)).pool.name == "b"
    assert choose_pool(snap, F, (), 0.3).reason == "default"


def test_all_weights_zero_is_unavailable() -> None:
    with pytest.raises(RoutingError) as err:
        choose_pool(fleet(pool("a", weight=0.0)), F, (), 0.5)
    assert err.value.kind == "unavailable"


def test_unknown_model_is_404() -> None:
    with pytest.raises(RoutingError) as err:
        choose_pool(fleet(pool("a")), dataclasses.replace(F, model="nope"), (), 0.5)
    assert err.value.kind == "unknown_model" and err.value.status == 404


def test_pool_without_routable_backend_is_not_eligible() -> None:
    dead = pool("a", members=(*backends("a", 3, healthy=False), BackendView("a-9", draining=True)))
    snap = fleet(dead, pool("b", weight=0.001))
    for i in range(100):
        assert choose_pool(snap, F, (), i / 100).pool.name == "b"
    with pytest.raises(RoutingError):
        choose_pool(fleet(dead), F, (), 0.5)


def test_tools_only_go_to_tool_calling_pools() -> None:
    snap = fleet(pool("vllm", tool_calling=False, weight=10), pool("sglang", tool_calling=True, weight=0.1))
    for i in range(100):
        assert choose_pool(snap, TOOLS, (), i / 100).pool.name == "sglang"
    # tool_choice none: no parser needed
    none = dataclasses.replace(TOOLS, tool_choice="none")
    assert capable(snap.pools[0], none)
    with pytest.raises(RoutingError) as err:
        choose_pool(fleet(snap.pools[0]), TOOLS, (), 0.5)
    assert err.value.reason == "no-capable-pool"


def test_structured_output_needs_capable_pool() -> None:
    snap = fleet(pool("a", structured_output=False), pool("b"))
    so = dataclasses.replace(F, structured_output=True)
    for i in range(50):
        assert choose_pool(snap, so, (), i / 50).pool.name == "b"


RULES = (
    Rule("long-prompt", ("sglang",), prompt_tokens_gte=8000),
    Rule("tools", ("sglang",), has_tools=True),
    Rule("general", ("vllm",)),
)


def test_rules_first_match_wins() -> None:
    snap = fleet(pool("vllm"), pool("sglang"))
    assert choose_pool(snap, LONG, RULES, 0.1).reason == "rule:long-prompt"
    assert choose_pool(snap, LONG, RULES, 0.1).pool.name == "sglang"
    assert choose_pool(snap, TOOLS, RULES, 0.1).reason == "rule:tools"
    assert choose_pool(snap, F, RULES, 0.9).pool.name == "vllm"
    assert choose_pool(snap, F, RULES, 0.9).reason == "rule:general"


def test_rule_falls_through_when_its_pools_are_not_eligible_unless_strict() -> None:
    snap = fleet(pool("vllm"), pool("sglang", weight=0.0))
    choice = choose_pool(snap, LONG, RULES, 0.1)
    assert (choice.pool.name, choice.reason) == ("vllm", "rule:general")
    strict = (Rule("long-prompt", ("sglang",), prompt_tokens_gte=8000, strict=True),)
    with pytest.raises(RoutingError) as err:
        choose_pool(snap, LONG, strict, 0.1)
    assert err.value.reason == "rule:long-prompt:no-eligible-pool"


def test_rule_narrowing_to_several_pools_uses_weights() -> None:
    snap = fleet(pool("a"), pool("b"), pool("c"))
    rule = (Rule("ab", ("a", "b")),)
    names = {choose_pool(snap, F, rule, i / 100).pool.name for i in range(100)}
    assert names == {"a", "b"}
    assert choose_pool(snap, F, rule, 0.5).reason == "rule:ab+weights"


def test_tool_choice_rule_uses_effective_choice() -> None:
    rule = Rule("forced", ("x",), tool_choice_in=frozenset({"required", "named"}))
    assert rule.matches(dataclasses.replace(TOOLS, tool_choice="named"))
    assert not rule.matches(TOOLS)
    auto = Rule("auto", ("x",), tool_choice_in=frozenset({"auto"}))
    assert auto.matches(dataclasses.replace(TOOLS, tool_choice=None))
    assert not auto.matches(F)
    assert Rule("so", ("x",), structured_output=True).matches(dataclasses.replace(F, structured_output=True))
    assert not Rule("so", ("x",), structured_output=True).matches(F)


def test_rule_validation() -> None:
    with pytest.raises(ValueError):
        Rule("bad name", ("a",))
    with pytest.raises(ValueError):
        Rule("ok", ())


def test_pin_bypasses_weights_and_rules_but_not_health() -> None:
    snap = fleet(pool("vllm"), pool("sglang", weight=0.0))
    choice = choose_pool(snap, LONG, RULES, 0.1, pin="sglang")
    assert (choice.pool.name, choice.reason) == ("sglang", "pin")
    down = fleet(pool("vllm"), pool("sglang", members=backends("s", 2, healthy=False)))
    with pytest.raises(RoutingError) as err:
        choose_pool(down, F, (), 0.1, pin="sglang")
    assert err.value.kind == "unavailable"
    with pytest.raises(RoutingError) as err:
        choose_pool(snap, F, (), 0.1, pin="nope")
    assert err.value.kind == "unknown_pool"
    with pytest.raises(RoutingError) as err:
        choose_pool(fleet(pool("vllm", tool_calling=False)), TOOLS, (), 0.1, pin="vllm")
    assert err.value.reason == "pin:not-capable"


@given(
    st.lists(st.floats(min_value=0.0, max_value=10.0), min_size=1, max_size=5),
    st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_chosen_pool_always_has_positive_weight(weights: list[float], rand: float) -> None:
    snap = fleet(*(pool(f"p{i}", weight=w) for i, w in enumerate(weights)))
    if all(w == 0 for w in weights):
        with pytest.raises(RoutingError):
            choose_pool(snap, F, (), rand)
        return
    assert choose_pool(snap, F, (), rand).pool.weight > 0
    assert choose_pool(snap, F, (), rand, sticky_key=mix64(int(rand * 1e9))).pool.weight > 0


def test_candidate_pools_are_those_the_weights_choose_among() -> None:
    """`candidate_pools`: the live pools the rules leave (what `choose_pool` weighs), none when
    `choose_pool` would fail."""
    from policies.pools import candidate_pools

    a, b, c = pool("a"), pool("b"), pool("c", weight=0.0)
    f = dataclasses.replace(F, prompt_tokens=5000)
    snap = fleet(a, b, c)
    assert [p.name for p in candidate_pools(snap, f, [])] == ["a", "b"]  # c: weight 0
    long_to_b = Rule("long", ("b",), prompt_tokens_gte=4000)
    assert [p.name for p in candidate_pools(snap, f, [long_to_b])] == ["b"]
    assert candidate_pools(snap, dataclasses.replace(f, model="other"), []) == []
    strict = Rule("only-c", ("c",), strict=True)
    assert candidate_pools(snap, f, [strict]) == []
    with pytest.raises(RoutingError):
        choose_pool(snap, f, [strict], 0.5)


def test_rules_see_reasoning_output_length_and_a_shared_preamble() -> None:
    base = F
    thinking = Rule("think", ("s",), reasoning=True)
    assert thinking.matches(dataclasses.replace(base, reasoning=True)) and not thinking.matches(base)
    long_output = Rule("long", ("s",), max_tokens_gte=4096)
    assert long_output.matches(dataclasses.replace(base, max_tokens=8000))
    assert not long_output.matches(dataclasses.replace(base, max_tokens=100)) and not long_output.matches(
        base
    )
    shared = Rule("shared", ("s",), shared_preamble=True)
    assert shared.matches(dataclasses.replace(base, preamble_blocks=LONG_PREAMBLE_BLOCKS))
    assert not shared.matches(dataclasses.replace(base, preamble_blocks=LONG_PREAMBLE_BLOCKS - 1))
    assert Rule("own", ("v",), shared_preamble=False).matches(base)


def test_reasoning_is_seen_in_what_the_request_asks() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert not extract_features(chat).reasoning
    assert extract_features({**chat, "reasoning_effort": "high"}).reasoning
    assert not extract_features({**chat, "reasoning_effort": "none"}).reasoning
    assert extract_features({**chat, "chat_template_kwargs": {"enable_thinking": True}}).reasoning
    assert not extract_features({**chat, "chat_template_kwargs": {"enable_thinking": False}}).reasoning
