"""The closed loop's decision: bounded steps toward the better pool, a floor, admins' pins left alone."""

from __future__ import annotations

import pytest

from policies.engine_compare import MIN_SAMPLES, Summary
from policies.rebalance import FLOOR_SHARE, MIN_ADVANTAGE, STEP_SHARE, PoolState, plan


def summary(p90: float, requests: int = 100, errors: int = 0) -> Summary:
    return Summary(requests, errors, 0, requests, p90, p90, p90, 0, None, None, None)


def figures(**p90_by_pool: float) -> dict[str, dict[str, Summary]]:
    return {pool: {"plain": summary(p90)} for pool, p90 in p90_by_pool.items()}


TWO = {"m": ["fast", "slow"]}


def test_weight_moves_one_step_of_the_pairs_weight_toward_the_faster_pool() -> None:
    pools = [PoolState("fast", 1.0), PoolState("slow", 1.0)]
    decided = plan(pools, TWO, {"m": figures(fast=0.01, slow=0.05)})
    (move,) = decided.moves
    assert (move.model, move.verdict.better, move.verdict.worse) == ("m", "fast", "slow")
    step = STEP_SHARE * 2.0
    assert move.before == {"fast": 1.0, "slow": 1.0}
    assert move.after == {"fast": pytest.approx(1.0 + step), "slow": pytest.approx(1.0 - step)}
    assert sum(move.after.values()) == pytest.approx(2.0)  # the pair keeps its total
    assert decided.held == {}


def test_steps_stop_at_the_floor() -> None:
    weights = {"fast": 1.0, "slow": 1.0}
    steps = 0
    while True:
        pools = [PoolState(n, w) for n, w in weights.items()]
        decided = plan(pools, TWO, {"m": figures(fast=0.01, slow=0.05)})
        if not decided.moves:
            break
        weights = dict(decided.moves[0].after)
        steps += 1
        assert steps < 100
    assert weights["slow"] == pytest.approx(FLOOR_SHARE * 2.0)
    assert steps == round((1.0 - FLOOR_SHARE * 2.0) / (STEP_SHARE * 2.0))
    assert "slow is at its floor" in decided.held["m"]


def test_a_pool_an_admin_set_is_left_alone() -> None:
    pools = [PoolState("fast", 1.0), PoolState("slow", 1.0, pinned=True)]
    decided = plan(pools, TWO, {"m": figures(fast=0.01, slow=0.05)})
    assert decided.moves == ()
    assert decided.held == {"m": "weight set by an admin: slow"}


def test_with_three_pools_the_unpinned_two_are_compared() -> None:
    pools = [PoolState("a", 1.0), PoolState("b", 1.0, pinned=True), PoolState("c", 1.0)]
    decided = plan(pools, {"m": ["a", "b", "c"]}, {"m": figures(a=0.05, b=0.001, c=0.01)})
    (move,) = decided.moves
    assert (move.verdict.better, move.verdict.worse) == ("c", "a")
    assert set(move.after) == {"a", "c"}


def test_no_move_without_a_clear_winner_or_enough_requests() -> None:
    close = {"m": figures(fast=0.010, slow=0.010 * MIN_ADVANTAGE * 0.95)}
    decided = plan([PoolState("fast", 1.0), PoolState("slow", 1.0)], TWO, close)
    assert decided.moves == () and decided.held["m"].startswith("no clear winner")
    few = {"m": {p: {"plain": summary(0.01 if p == "fast" else 1.0, MIN_SAMPLES - 1)} for p in TWO["m"]}}
    decided = plan([PoolState("fast", 1.0), PoolState("slow", 1.0)], TWO, few)
    assert decided.moves == () and decided.held["m"] == "not enough requests to compare its pools"


def test_errors_move_weight_even_from_a_faster_pool() -> None:
    data = {"m": {"fast": {"plain": summary(0.01, errors=20)}, "slow": {"plain": summary(0.05)}}}
    (move,) = plan([PoolState("fast", 1.0), PoolState("slow", 1.0)], TWO, data).moves
    assert (move.verdict.better, move.verdict.measure) == ("slow", "error_rate")


def test_a_pool_of_weight_zero_and_a_model_of_one_pool_are_not_moved() -> None:
    pools = [PoolState("fast", 1.0), PoolState("slow", 0.0), PoolState("solo", 1.0)]
    serving = {"m": ["fast", "slow"], "n": ["solo"]}
    decided = plan(pools, serving, {"m": figures(fast=0.01, slow=0.05), "n": figures(solo=0.01)})
    assert decided.moves == ()
    assert decided.held == {"m": "fewer than two pools with a weight above 0"}


def test_a_pool_moves_once_a_round_for_its_busiest_model() -> None:
    pools = [PoolState("a", 1.0), PoolState("b", 1.0)]
    serving = {"small": ["a", "b"], "big": ["a", "b"]}
    data = {
        "small": {"a": {"plain": summary(0.05)}, "b": {"plain": summary(0.01)}},
        "big": {"a": {"plain": summary(0.01, 500)}, "b": {"plain": summary(0.05, 500)}},
    }
    decided = plan(pools, serving, data)
    (move,) = decided.moves
    assert (move.model, move.verdict.better) == ("big", "a")
    assert decided.held == {"small": "a, b moved for big this round"}


def test_a_pool_that_meets_the_ttft_target_more_often_wins_even_when_slower_at_p90() -> None:
    def targeted(p90: float, met: int) -> Summary:
        return Summary(100, 0, 0, 100, p90, p90, p90, 0, None, None, None, 100, met, met)

    data = {"m": {"fast": {"plain": targeted(0.01, 70)}, "slow": {"plain": targeted(0.011, 95)}}}
    (move,) = plan([PoolState("fast", 1.0), PoolState("slow", 1.0)], TWO, data).moves
    assert (move.verdict.better, move.verdict.measure) == ("slow", "ttft_target")
    assert move.after["slow"] == pytest.approx(1.0 + STEP_SHARE * 2.0)
