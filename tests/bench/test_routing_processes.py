"""bench/routing.py's processes mode end to end, at its smallest: real simulators publishing their KV
events, a real redis-server, our gateway as two routing processes (two replicas the trace client
alternates between) subscribed to the events and sharing load, one short point on a fleet of 2 + 2
simulators. It must produce a row with the simulators' hit rate, the gateway's routes and the serving
figures (bench/serving.py); no timing is asserted."""

from __future__ import annotations

import pytest

from bench.routing import PRICE, FleetSpec, Matrix, Setup, processes_md, run_processes

TWO = "ours prefix_affinity x2, events + shared"


@pytest.mark.processes
def test_two_routing_processes_with_events_produce_rows_with_hit_rates() -> None:
    matrix = Matrix(
        workloads=("shared_prefix",), loads=(0.8,), routers=(TWO,), seconds=2.0, uniform_routers=()
    )
    setups = {TWO: Setup("prefix_affinity", replicas=2, events=True, shared=True)}
    res = run_processes(matrix, lambda _: None, spec=FleetSpec(per_engine=2), setups=setups, with_peers=False)
    assert res["unavailable"] == {}
    (row,) = res["rows"]
    assert (row["workload"], row["router"], row["processes"], row["events"]) == (
        "shared_prefix",
        TWO,
        2,
        True,
    )
    assert row["requests"] >= 50
    assert row["completed"] == row["requests"] and row["errors"] == 0
    assert 0.0 < row["hit_rate"] <= row["oracle_hit_rate"] + 0.05
    assert sum(row["routes"].values()) == row["requests"]
    assert any("affinity" in reason for reason in row["routes"])
    for metric in ("ttft", "tpot", "itl", "e2e"):
        assert 0 < row[f"{metric}_p50_ms"] <= row[f"{metric}_p90_ms"] <= row[f"{metric}_p99_ms"], metric
    assert row["output_tps"] > 0 and 0 <= row["goodput_share"] <= 1
    # every token priced between the cached prompt's price and the completion's
    assert PRICE["cached_prompt"] <= row["usd_per_mtok"] <= PRICE["completion"]
    text = "\n".join(processes_md({**res, "command": "test", "machine": {}}))
    assert TWO in text and "hits ÷ oracle" in text


def test_uniform_rows_of_four_processes_are_judged_against_least_load_with_as_many() -> None:
    """Four gateway processes share the cores with the fleet whatever they route by: on uniform
    traffic the x4 row is divided by least load's x4 row when the run has one, else by x1's."""
    from bench.routing import LEAST_LOAD, LEAST_LOAD_X4, OURS_EVENTS, SETUPS, processes_verdicts

    def row(router: str, p99: float) -> dict[str, object]:
        return {
            "workload": "uniform",
            "load": 0.8,
            "router": router,
            "ttft_p99_ms": p99,
            "hit_vs_oracle": 0.0,
        }

    setups = {
        name: {"replicas": SETUPS[name].replicas, "workers": SETUPS[name].workers} for name in OURS_EVENTS
    }
    x1, x4 = OURS_EVENTS
    rows = [row(x1, 1000.0), row(x4, 1300.0), row(LEAST_LOAD, 1000.0)]
    alone = "\n".join(processes_verdicts({"rows": rows, "setups": setups}))
    assert "x1 1.00× met" in alone and "x4 1.30× **missed**" in alone
    both = "\n".join(processes_verdicts({"rows": [*rows, row(LEAST_LOAD_X4, 1250.0)], "setups": setups}))
    assert "x1 1.00× met" in both and "x4 1.04× met" in both
