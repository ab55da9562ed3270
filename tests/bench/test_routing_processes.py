"""bench/routing.py's processes mode end to end, at its smallest: real simulators publishing their KV
events, a real redis-server, our gateway as two routing processes (two replicas the trace client
alternates between) subscribed to the events and sharing load, one short point on a fleet of 2 + 2
simulators. It must produce a row with the simulators' hit rate and the gateway's routes; no timing
is asserted."""

from __future__ import annotations

from bench.routing import FleetSpec, Matrix, Setup, processes_md, run_processes

TWO = "ours prefix_affinity x2, events + shared"


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
    text = "\n".join(processes_md({**res, "command": "test", "machine": {}}))
    assert TWO in text and "hits ÷ oracle" in text
