"""bench/replay.py, the offline replay of the routing bench: it must keep running against the real
router and keep telling policies apart (routing changes are tried with it before `make bench`)."""

from __future__ import annotations

import pytest

from bench.replay import POLICIES, main, replay


def test_prefix_affinity_keeps_shared_prefixes_warm_and_round_robin_does_not() -> None:
    ours = replay("shared_prefix", POLICIES["prefix_affinity"], load=0.5, seconds=4.0)
    rr = replay("shared_prefix", POLICIES["round_robin"], load=0.5, seconds=4.0)
    assert ours.requests == rr.requests >= 50
    assert ours.vs_oracle >= 0.9 > 0.6 > rr.vs_oracle
    assert sum(ours.per_backend.values()) == ours.requests
    assert 0 < ours.ttft_p50_ms <= ours.ttft_p99_ms
    assert any(reason.endswith("affinity:hit") for reason in ours.reasons)


def test_replicas_are_independent_routers_and_seeds_change_the_schedule() -> None:
    one = replay("long_document_qa", POLICIES["prefix_affinity"], load=0.5, seconds=3.0)
    again = replay("long_document_qa", POLICIES["prefix_affinity"], load=0.5, seconds=3.0)
    assert (one.hit_rate, one.ttft_p99_ms) == (again.hit_rate, again.ttft_p99_ms)  # deterministic
    other = replay("long_document_qa", POLICIES["prefix_affinity"], load=0.5, seconds=3.0, seed=1)
    assert other.ttft_p99_ms != one.ttft_p99_ms
    four = replay("long_document_qa", POLICIES["prefix_affinity"], load=0.5, seconds=3.0, replicas=4)
    assert four.requests == one.requests


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    main(["uniform", "--seconds", "2", "--baseline", "least_load"])
    line = capsys.readouterr().out.strip()
    assert line.startswith("uniform") and "prefix_affinity" in line and "least_load" in line
    with pytest.raises(SystemExit):
        main(["no_such_workload"])


def test_clairvoyant_reference_beats_round_robin_and_reports_itself() -> None:
    """The yardstick sees every engine's queue and cache: on shared prefixes it must keep first tokens
    far below round robin's and find most of the cache, with every request counted once."""
    ref = replay("shared_prefix", POLICIES["clairvoyant"], load=0.5, seconds=4.0)
    rr = replay("shared_prefix", POLICIES["round_robin"], load=0.5, seconds=4.0)
    assert ref.requests == rr.requests == sum(ref.per_backend.values())
    assert set(ref.reasons) == {"clairvoyant"}
    assert ref.vs_oracle > 0.6 > rr.vs_oracle
    assert ref.ttft_p99_ms < 0.7 * rr.ttft_p99_ms
