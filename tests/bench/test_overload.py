"""bench/overload.py's pure parts on made-up records: the seeded schedule, capacity from the step
model, the outcome and share accounting, the summary, the gateway's config and the trace. No servers,
no clocks."""

from __future__ import annotations

from typing import Any

import pytest

from bench import overload as ov
from gateway.settings import Settings, parse_settings


def test_schedule_is_seeded_and_a_higher_load_sends_the_same_requests_sooner() -> None:
    low = ov.schedule(1, 0.5, 10.0, seconds=20.0)
    assert low == ov.schedule(1, 0.5, 10.0, seconds=20.0)
    assert low != ov.schedule(2, 0.5, 10.0, seconds=20.0)
    high = ov.schedule(1, 2.0, 10.0, seconds=20.0)
    assert [a.t for a in high] == sorted(a.t for a in high)
    assert all(0 <= a.t < 20.0 for a in high)
    for tenant in ("chat", "docs-a", "docs-b"):
        lo = [a for a in low if a.tenant == tenant]
        hi = [a for a in high if a.tenant == tenant]
        assert [a.index for a in lo] == list(range(len(lo)))
        assert len(hi) > len(lo)
        # the same unit-rate process, four times faster
        for a, b in zip(lo, hi, strict=False):
            assert b.t == pytest.approx(a.t / 4)


def test_schedule_offers_each_tenant_its_share() -> None:
    arrivals = ov.schedule(3, 1.0, 20.0, seconds=200.0)
    count = {t.name: sum(a.tenant == t.name for a in arrivals) for t in ov.TENANTS}
    for t in ov.TENANTS:
        assert count[t.name] == pytest.approx(t.share * 20.0 * 200.0, rel=0.1)
    assert count["docs-b"] == pytest.approx(2 * count["docs-a"], rel=0.15)


def test_jobs_are_a_prefix_whatever_their_number() -> None:
    chat, docs = ov.TENANTS[0], ov.TENANTS[1]
    assert ov.jobs(chat, 1, 3) == ov.jobs(chat, 1, 6)[:3]
    short, long = ov.jobs(chat, 1, 20), ov.jobs(docs, 1, 5)
    assert max(j.prompt_tokens for j in short) < min(j.prompt_tokens for j in long)
    body = long[0].body()
    assert body["max_tokens"] == docs.output and body["ignore_eos"] and body["stream"]
    assert long[0].cost == long[0].prompt_tokens + docs.output


def test_capacity_grows_with_the_fleet_and_is_deterministic() -> None:
    sample = ov.mix(0, 240)  # enough to keep 32 sequences running on each engine
    one, two = ov.calibrate(sample, backends=1), ov.calibrate(sample, backends=2)
    assert one == ov.calibrate(sample, backends=1)
    assert one.rps > 0 and one.output_tps > 0
    assert one.rps * 1.5 < two.rps < one.rps * 2.5


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"status": 200, "ttft": 0.1, "total": 0.5, "usage": [80, 32, 0]}, "served"),
        ({"status": 200, "ttft": 0.1, "total": 0.5}, "error"),  # cut before its usage chunk
        ({"status": 429, "retry_after": "2"}, "429"),
        ({"status": 503, "retry_after": "1"}, "503"),
        ({"status": 503}, "no retry-after"),
        ({"status": 200, "gave_up": True}, "lost"),
        ({"gave_up": True}, "lost"),
        ({"status": 200}, "error"),  # cut before its first token
        ({"status": 500}, "error"),
        ({"error": "ClientConnectorError"}, "error"),
    ],
)
def test_outcome(record: dict[str, Any], expected: str) -> None:
    assert ov.outcome(record) == expected


def test_added_latency_is_the_median_of_paired_rounds() -> None:
    # the machine drifts between rounds: the differences within each round are what flow adds
    out = ov.added_latency([610.0, 1220.0, 905.0], [590.0, 1190.0, 900.0])
    assert out["added_ms"] == pytest.approx(0.020)
    assert out["on_p50_ms"] == pytest.approx(0.905) and out["off_p50_ms"] == pytest.approx(0.900)
    assert out["on_p50_us"] == [610.0, 1220.0, 905.0]


def test_records_of_a_run() -> None:
    arrivals = [ov.Arrival(0.5, "chat", 0), ov.Arrival(1.0, "docs-a", 0), ov.Arrival(1.5, "docs-b", 0)]
    work = {t.name: ov.jobs(t, 1, 1) for t in ov.TENANTS}
    results: list[dict[str, Any]] = [
        {"status": 200, "sent": 0.52, "ttft": 0.25, "total": 1.0, "usage": [80, 30, 0], "queue_ms": "120"},
        {"status": 503, "sent": 1.01, "retry_after": "3", "code": "fleet_saturated"},
        {"sent": 1.5, "gave_up": True},
    ]
    chat, refused, lost = ov.records(arrivals, results, work)
    assert chat["tenant"] == "chat" and chat["klass"] == "interactive" and chat["outcome"] == "served"
    assert chat["output"] == 30  # what the usage says, not what was asked
    assert chat["cost"] == work["chat"][0].cost
    assert chat["first"] == pytest.approx(0.77) and chat["end"] == pytest.approx(1.52)
    assert chat["queue_ms"] == 120.0
    assert refused["outcome"] == "503" and refused["klass"] == "batch" and "ttft" not in refused
    assert refused["output"] == work["docs-a"][0].output
    assert lost["outcome"] == "lost" and "queue_ms" not in lost


def test_share_window_starts_once_the_queue_has_built_up() -> None:
    assert ov.share_window(10.0) == (2.0, 10.0)
    assert ov.share_window(ov.ARRIVAL_S) == ov.SHARE_WINDOW


def test_fair_shares_are_weighted_max_min() -> None:
    assert ov.fair_shares(100.0, {"a": 80.0, "b": 80.0}, {}) == {"a": 50.0, "b": 50.0}
    assert ov.fair_shares(100.0, {"a": 20.0, "b": 200.0}, {}) == {"a": 20.0, "b": 80.0}
    weighted = ov.fair_shares(90.0, {"a": 100.0, "b": 100.0}, {"a": 2.0, "b": 1.0})
    assert weighted == pytest.approx({"a": 60.0, "b": 30.0})
    assert ov.fair_shares(0.0, {"a": 5.0}, {}) == {"a": 0.0}


def rec(
    tenant: str, t: float, cost: int, outcome: str = "served", ttft: float = 0.1, output: int = 10
) -> dict[str, Any]:
    klass = {"chat": "interactive", "docs-a": "batch", "docs-b": "batch"}[tenant]
    r: dict[str, Any] = {
        "tenant": tenant,
        "klass": klass,
        "t": t,
        "cost": cost,
        "output": output,
        "outcome": outcome,
    }
    if outcome == "served":
        r.update(ttft=ttft, first=t + ttft, end=t + ttft + 1.0)
    return r


def test_shares_of_two_backlogged_tenants() -> None:
    # docs-b offers twice docs-a's tokens; the class is served half of what it offers
    recs = [rec("docs-a", 4.0 + i, 100, "served" if i < 4 else "503") for i in range(6)]
    recs += [rec("docs-b", 4.0 + i / 2, 100, "served" if i < 5 else "503") for i in range(12)]
    s = ov.shares(recs, window=(3.0, 15.0))
    assert s["docs-a"]["offered"] == 600 and s["docs-b"]["offered"] == 1200
    assert s["docs-a"]["fair"] == s["docs-b"]["fair"] == 450
    assert s["docs-a"]["ratio"] == pytest.approx(400 / 450)
    assert s["docs-b"]["ratio"] == pytest.approx(500 / 450)
    assert s["docs-a"]["backlogged"] and s["docs-b"]["backlogged"]


def test_shares_below_saturation_have_no_backlog() -> None:
    # everything served, a request still in flight at the window's end
    recs = [rec("docs-a", 4.0 + i, 100) for i in range(5)]
    recs += [rec("docs-b", 4.0 + i / 2, 100, ttft=0.1 if i < 9 else 3.0) for i in range(10)]
    s = ov.shares(recs, window=(3.0, 9.0))
    assert not s["docs-a"]["backlogged"] and not s["docs-b"]["backlogged"]


def test_shares_leave_out_what_came_outside_the_window() -> None:
    recs = [rec("docs-a", 1.0, 100), rec("docs-a", 20.0, 100), rec("docs-b", 5.0, 100), rec("chat", 5.0, 50)]
    s = ov.shares(recs, window=(3.0, 15.0))
    assert s["docs-a"]["offered"] == 0 and s["docs-a"]["served"] == 0
    assert s["docs-b"]["served"] == 100
    assert "chat" not in s


def test_summary_counts_lost_requests_as_never_answered() -> None:
    run = [rec("chat", i * 0.1, 50, ttft=0.01 * (i + 1)) for i in range(98)]
    run += [rec("chat", 10.0, 50, "lost"), rec("chat", 10.05, 50, "lost"), rec("chat", 10.1, 50, "429")]
    run += [rec("docs-a", 5.0, 1000, ttft=20.0, output=96), rec("docs-b", 5.0, 1000, "503")]
    s = ov.summarise([run])
    # 98 first tokens (10 to 980 ms) and 2 lost of 100: the refused one is left out
    assert s["ttft_p50_ms"] == pytest.approx(510.0)
    assert s["ttft_p90_ms"] == pytest.approx(900.0)
    assert s["ttft_p99_ms"] is None  # falls on a lost one
    assert s["ttft_p99_ms_each"] == [None]
    assert s["outcomes"]["interactive"] == {
        "served": 98,
        "429": 1,
        "503": 0,
        "no retry-after": 0,
        "error": 0,
        "lost": 2,
    }
    assert s["outcomes"]["batch"]["503"] == 1
    assert s["requests"] == 103
    # docs-a's first token missed the batch target (its deadline): only chat's output is good
    span = 5.0 + 20.0 + 1.0
    assert s["goodput_tps"] == pytest.approx(98 * 10 / span)
    assert s["output_tps"] == pytest.approx((98 * 10 + 96) / span)


def test_gateway_config_names_the_classes_only_with_flow_control() -> None:
    bare = ov.gateway_config(["http://127.0.0.1:1"], None)
    assert "flow" not in bare and all(not t for t in bare["limits"]["tiers"].values())
    parse_settings(bare, environ={})
    for enabled in (False, True):
        cfg = ov.gateway_config(
            ["http://127.0.0.1:1", "http://127.0.0.1:2"], enabled, "redis://127.0.0.1:1/0"
        )
        assert cfg["flow"] == {"enabled": enabled, "classes": ov.CLASSES, "tenant_weights": ov.TENANT_WEIGHTS}
        assert cfg["limits"]["tiers"]["chat"] == {"priority_class": "interactive"}
        assert cfg["limits"]["tiers"]["batch"] == {"priority_class": "batch"}
        assert cfg["redis"] == {"url": "redis://127.0.0.1:1/0"}
        if "flow" in Settings.model_fields:  # the gateway with flow control takes it as it is
            parse_settings(cfg, environ={})


def test_trace_item_gives_up_after_the_class_deadline_and_its_grace() -> None:
    chat, docs = ov.jobs(ov.TENANTS[0], 1, 1)[0], ov.jobs(ov.TENANTS[2], 1, 1)[0]
    a = ov.trace_item(ov.Arrival(1.5, "chat", 0), chat, "tok-chat")
    assert a == {"t": 1.5, "session": None, "body": chat.body(), "headers": {"authorization": "Bearer tok-chat"},
                 "give_up": 5.0 + ov.LOST_GRACE_S}  # fmt: skip
    b = ov.trace_item(ov.Arrival(2.0, "docs-b", 0), docs, "tok-b")
    assert b["give_up"] == ov.CLASSES["batch"]["max_queue_s"] + ov.LOST_GRACE_S == 9.0
    assert ov.TTFT_TARGET_S == {"interactive": 1.0, "standard": 20.0, "batch": 8.0}
