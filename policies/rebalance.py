"""The closed loop's decision: which pool weights to move toward the pools that serve each model's
traffic better (gateway/flow/rebalance.py runs it every `REBALANCE_INTERVAL_S`, on a window of the
engine comparison).

For each model served by two or more pools the loop may move (weight above 0, not pinned by an
admin), the pair of pools with the most telling verdict (`policies.engine_compare.pair_verdict`,
`best_of`) decides: an error-rate or TTFT-target verdict, or a TTFT p90 one of at least
`MIN_ADVANTAGE`, moves `STEP_SHARE` of the pair's weight from the worse pool to the better, never
leaving the worse one below `FLOOR_SHARE` of it. The pair's total weight stays what it was, so other pools keep their
share. A pool's weight applies to every model it serves: models go in order of their requests, and
a pool moved for one model is not moved again in the same round.

Pure: the caller hands in the weights, the pins and the window's figures, and applies the moves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies.engine_compare import Summary, Verdict, best_of, pair_verdict

#: a tenth of the pair's weight a round: it takes several rounds (minutes) to move much, so one
#: unlucky window moves little, and each step's effect shows in the figures before the next
STEP_SHARE = 0.1
#: the worse pool keeps a tenth of the pair's weight: its traffic goes on measuring it, so the loop
#: sees when it serves well again and moves weight back
FLOOR_SHARE = 0.1
#: a TTFT p90 at least 1.2x lower: closer verdicts are within the histograms' ±4.4 % and the swings
#: of load, and a loop acting on them would move weight to and fro
MIN_ADVANTAGE = 1.2
#: weights are written with six decimals (a float's last bits would show in the audit log)
_DIGITS = 6


@dataclass(frozen=True, slots=True)
class PoolState:
    """A pool as the loop sees it: its live weight, and whether an admin set it (left alone)."""

    name: str
    weight: float
    pinned: bool = False


@dataclass(frozen=True, slots=True)
class Move:
    """Move weight from `verdict.worse` to `verdict.better` for `model`: the two pools' weights
    before and after."""

    model: str
    verdict: Verdict
    before: dict[str, float]
    after: dict[str, float]


@dataclass(frozen=True, slots=True)
class Plan:
    """A round's decision: the moves, and for each model not moved, why not."""

    moves: tuple[Move, ...]
    held: dict[str, str]


def plan(
    pools: Sequence[PoolState],
    serving: Mapping[str, Sequence[str]],
    figures: Mapping[str, Mapping[str, Mapping[str, Summary]]],
) -> Plan:
    """The round's moves (module docstring). `serving`: model -> the pools that serve it;
    `figures`: model -> pool -> traffic class -> the window's summary."""
    by_name = {p.name: p for p in pools}
    moves: list[Move] = []
    held: dict[str, str] = {}
    moved: dict[str, str] = {}  # pool -> the model it was moved for this round
    for model in sorted(serving, key=lambda m: (-_requests(figures.get(m, {})), m)):
        names = [n for n in serving[model] if n in by_name]
        if len(names) < 2:
            continue
        free = [n for n in names if not by_name[n].pinned and by_name[n].weight > 0]
        busy = [n for n in free if n in moved]
        free = [n for n in free if n not in moved]
        if len(free) < 2:
            pinned = [n for n in names if by_name[n].pinned]
            if busy:
                held[model] = f"{', '.join(busy)} moved for {moved[busy[0]]} this round"
            elif pinned:
                held[model] = f"weight set by an admin: {', '.join(pinned)}"
            else:
                held[model] = "fewer than two pools with a weight above 0"
            continue
        mine = figures.get(model, {})
        verdicts: list[Verdict] = []
        for i in range(len(free)):
            for j in range(i + 1, len(free)):
                v = pair_verdict(free[i], mine.get(free[i], {}), free[j], mine.get(free[j], {}))
                if v is not None:
                    verdicts.append(v)
        verdict = best_of(verdicts)
        if verdict is None:
            held[model] = "not enough requests to compare its pools"
            continue
        if verdict.measure == "ttft_p90" and verdict.ratio < MIN_ADVANTAGE:
            held[model] = f"no clear winner ({verdict.why()})"
            continue
        better, worse = by_name[verdict.better], by_name[verdict.worse]
        total = better.weight + worse.weight
        step = min(STEP_SHARE * total, worse.weight - FLOOR_SHARE * total)
        if step <= total * 10.0**-_DIGITS:
            held[model] = f"{worse.name} is at its floor ({verdict.why()})"
            continue
        new_worse = round(worse.weight - step, _DIGITS)
        new_better = round(better.weight + (worse.weight - new_worse), _DIGITS)
        moves.append(
            Move(
                model,
                verdict,
                {better.name: better.weight, worse.name: worse.weight},
                {better.name: new_better, worse.name: new_worse},
            )
        )
        moved[better.name] = moved[worse.name] = model
    return Plan(tuple(moves), held)


def _requests(by_pool: Mapping[str, Mapping[str, Summary]]) -> int:
    total = 0
    for classes in by_pool.values():
        for s in classes.values():
            total += s.requests
    return total
