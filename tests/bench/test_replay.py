"""bench/replay.py, the offline replay of the routing bench: it must keep running against the real
router and keep telling policies apart (routing changes are tried with it before `make bench`), on the
batching fleet (its default) and on the serial fleet of before, whose figures it must reproduce."""

from __future__ import annotations

import dataclasses

import pytest

from bench.replay import POLICIES, SERIAL_BLOCKS_PER_REQUEST, main, replay, with_options
from bench.routing import SERIAL, FleetSpec, capacity, make_point
from policies.kv_index import KvIndexConfig
from policies.least_load import LeastLoadConfig
from policies.load import LoadModel
from policies.prefix_affinity import PrefixAffinityConfig


def test_prefix_affinity_keeps_shared_prefixes_warm_and_round_robin_does_not() -> None:
    ours = replay("shared_prefix", POLICIES["prefix_affinity"], load=0.5, seconds=4.0, spec=SERIAL)
    rr = replay("shared_prefix", POLICIES["round_robin"], load=0.5, seconds=4.0, spec=SERIAL)
    assert ours.requests == rr.requests >= 50
    assert ours.vs_oracle >= 0.9 > 0.6 > rr.vs_oracle
    assert sum(ours.per_backend.values()) == ours.requests
    assert 0 < ours.ttft_p50_ms <= ours.ttft_p99_ms
    assert any(reason.endswith("affinity:hit") for reason in ours.reasons)


def test_batching_fleet_tells_the_same_policies_apart() -> None:
    """The batching fleet (each backend's step model in virtual time): the same ordering, and every
    request's first token is recorded once."""
    ours = replay("shared_prefix", POLICIES["prefix_affinity"], load=0.5, seconds=8.0)
    rr = replay("shared_prefix", POLICIES["round_robin"], load=0.5, seconds=8.0)
    assert ours.requests == rr.requests >= 100
    assert ours.vs_oracle >= 0.9 > 0.6 > rr.vs_oracle
    assert sum(ours.per_backend.values()) == ours.requests == ours.answered == rr.answered
    assert 0 < ours.ttft_p50_ms <= ours.ttft_p99_ms < rr.ttft_p99_ms


def test_serial_engine_reproduces_the_replay_of_before() -> None:
    """`--engine serial` is the replay of before the batching engine: these figures are what the code
    of 48f9ff8 computed for the same calls (run from that commit), with prefix affinity's exchange
    rate of then (`--engine serial` keeps it)."""
    then = dataclasses.replace(POLICIES["prefix_affinity"], blocks_per_request=SERIAL_BLOCKS_PER_REQUEST)
    r = replay("shared_prefix", then, load=0.5, seconds=4.0, spec=SERIAL)
    assert (r.requests, r.hit_rate, r.ttft_p50_ms, r.ttft_p99_ms) == (
        77,
        0.5626649015019438,
        298.6,
        606.535235222891,
    )
    r = replay("multi_turn_chat", then, load=0.5, seconds=4.0, spec=SERIAL)
    assert (r.requests, r.hit_rate, r.ttft_p50_ms, r.ttft_p99_ms) == (
        74,
        0.6260970479437151,
        76.6,
        234.4807287316984,
    )


@pytest.mark.parametrize("spec", [SERIAL, FleetSpec()], ids=["serial", "batching"])
def test_replicas_are_independent_routers_and_seeds_change_the_schedule(spec: FleetSpec) -> None:
    one = replay("long_document_qa", POLICIES["prefix_affinity"], load=0.5, seconds=1.5, spec=spec)
    again = replay("long_document_qa", POLICIES["prefix_affinity"], load=0.5, seconds=1.5, spec=spec)
    assert (one.hit_rate, one.ttft_p99_ms) == (again.hit_rate, again.ttft_p99_ms)  # deterministic
    other = replay("long_document_qa", POLICIES["prefix_affinity"], load=0.5, seconds=1.5, seed=1, spec=spec)
    assert other.ttft_p99_ms != one.ttft_p99_ms
    four = replay(
        "long_document_qa", POLICIES["prefix_affinity"], load=0.5, seconds=1.5, replicas=4, spec=spec
    )
    assert four.requests == one.requests


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    main(["uniform", "--seconds", "2", "--baseline", "least_load"])
    line = capsys.readouterr().out.strip()
    assert line.startswith("uniform") and "prefix_affinity" in line and "least_load" in line
    main(["uniform", "--seconds", "2", "--engine", "serial"])
    assert capsys.readouterr().out.startswith("uniform")
    with pytest.raises(SystemExit):
        main(["no_such_workload"])


def test_options_set_the_policys_fields_and_those_of_its_load_and_kv() -> None:
    """`--option FIELD=VALUE`: a field of the policy's config; `load` and `kv` take mappings of
    their own fields, the others keeping the policy's values (affinity: no queue threshold)."""
    base = PrefixAffinityConfig()
    options = {"placement_slack": 0.0, "load": {"kv_weight": 2.0}, "kv": {"scan_stride": 1}}
    assert with_options(base, options) == PrefixAffinityConfig(
        placement_slack=0.0,
        load=LoadModel(kv_weight=2.0, queue_high=None),
        kv=KvIndexConfig(scan_stride=1),
    )
    assert with_options(LeastLoadConfig(), {"load": {"queue_weight": 3}}) == LeastLoadConfig(
        load=LoadModel(queue_weight=3)
    )
    with pytest.raises(TypeError):
        with_options(base, {"no_such_field": 1})
    with pytest.raises(SystemExit):
        main(["uniform", "--seconds", "2", "--option", "no_such_field=1"])


def test_cli_with_baselines_shared_between_processes(capsys: pytest.CaptureFixture[str]) -> None:
    """The kv suite's call (`bench/__main__.py`): baselines without our routers (round robin,
    sglang-router's model) beside ours, several processes sharing through the store: the working-set
    reports must not break the baselines, which have none."""
    main(["shared_prefix", "--seconds", "2", "--replicas", "2", "--events", "5", "--shared",
          "--baseline", "round_robin", "--baseline", "sglang_cache_aware"])  # fmt: skip
    line = capsys.readouterr().out.strip()
    assert line.startswith("shared_prefix") and "x2" in line
    assert "round_robin" in line and "sglang_cache_aware" in line


@pytest.mark.parametrize(("spec", "seconds"), [(SERIAL, 4.0), (FleetSpec(), 8.0)], ids=["serial", "batching"])
def test_clairvoyant_reference_beats_round_robin_and_reports_itself(spec: FleetSpec, seconds: float) -> None:
    """The yardstick sees every engine's queue and cache: on shared prefixes it must keep first tokens
    far below round robin's and find most of the cache, with every request counted once."""
    ref = replay("shared_prefix", POLICIES["clairvoyant"], load=0.5, seconds=seconds, spec=spec)
    rr = replay("shared_prefix", POLICIES["round_robin"], load=0.5, seconds=seconds, spec=spec)
    assert ref.requests == rr.requests == sum(ref.per_backend.values()) == ref.answered
    assert set(ref.reasons) == {"clairvoyant"}
    assert ref.vs_oracle > 0.6 > rr.vs_oracle
    assert ref.ttft_p99_ms < 0.7 * rr.ttft_p99_ms


def test_batching_capacity_follows_the_uncached_prefill() -> None:
    """The batching fleet's capacity is its engines over each request's engine time at the oracle's
    hits: a workload with fewer cached tokens (uniform: none) is served at a lower rate than one whose
    prompts are mostly shared (shared_prefix), and more hits raise it."""
    spec = FleetSpec()
    shared = make_point("shared_prefix", 0.5, 4.0, spec)
    uniform = make_point("uniform", 0.5, 4.0, spec)
    assert uniform.capacity < shared.capacity
    colder = [(n, 0) for n, _ in shared.per]
    assert capacity(colder, spec) < shared.capacity
