"""policies/flow.py: the queue discipline at saturation, on handed-in time (no clock, no asyncio)."""

from __future__ import annotations

from policies.flow import (
    PREFILL_SATURATED_S,
    SCRAPE_ROOM,
    FlowClass,
    FlowQueue,
    TtftModel,
    Waiting,
    engine_backlog,
    kv_full,
    saturated,
)
from policies.shared_load import FLOW, PREFILL, flow_waiting, split

CLASSES = [
    FlowClass("interactive", 0, max_queue_s=2.0, max_depth=100),
    FlowClass("standard", 1, max_queue_s=10.0, max_depth=10_000),
    FlowClass("batch", 2, max_queue_s=60.0, max_depth=4),
]


def waiting(
    klass: str, tenant: str = "t", cost: int = 100, weight: float = 1.0, deadline: float = 100.0
) -> Waiting:
    return Waiting(klass, tenant, cost, weight, deadline)


def anyone(_: Waiting) -> bool:
    return True


def test_classes_go_strictly_by_priority_whatever_arrived_first() -> None:
    q = FlowQueue(CLASSES)
    order = [waiting("batch"), waiting("standard"), waiting("interactive"), waiting("batch")]
    for w in order:
        assert q.push(w) is None
    popped = [q.pop(anyone) for _ in range(4)]
    assert [w.klass for w in popped if w] == ["interactive", "standard", "batch", "batch"]
    assert q.pop(anyone) is None and len(q) == 0


def served_tokens(q: FlowQueue, pops: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for _ in range(pops):
        w = q.pop(anyone)
        assert w is not None
        out[w.tenant] = out.get(w.tenant, 0) + w.cost
    return out


def test_tenants_share_by_tokens_not_requests() -> None:
    q = FlowQueue(CLASSES)
    for _ in range(50):
        q.push(waiting("standard", "long", cost=1000))
    for _ in range(500):
        q.push(waiting("standard", "short", cost=100))
    served = served_tokens(q, 110)  # both still backlogged
    assert abs(served["long"] - served["short"]) <= 1000, served  # within one request's cost


def test_weights_set_the_shares() -> None:
    q = FlowQueue(CLASSES)
    for _ in range(300):
        q.push(waiting("standard", "gold", cost=100, weight=2.0))
        q.push(waiting("standard", "plain", cost=100, weight=1.0))
    served = served_tokens(q, 150)
    assert abs(served["gold"] - 2 * served["plain"]) <= 200, served


def test_an_idle_tenant_gets_no_credit_for_its_idle_time() -> None:
    q = FlowQueue(CLASSES)
    for _ in range(100):
        q.push(waiting("standard", "busy"))
    served_tokens(q, 50)
    for _ in range(100):
        q.push(waiting("standard", "late"))
    served = served_tokens(q, 20)
    assert served["late"] <= 11 * 100, served  # it shares from now on; it does not catch up


def test_deadlines_expire_in_order() -> None:
    q = FlowQueue(CLASSES)
    first, second = waiting("interactive", deadline=5.0), waiting("batch", deadline=7.0)
    q.push(first)
    q.push(second)
    assert q.next_deadline() == 5.0
    assert q.expired(4.9) == []
    assert q.expired(5.0) == [first]
    assert q.next_deadline() == 7.0
    assert q.expired(10.0) == [second] and q.next_deadline() is None


def test_a_full_class_refuses_over_share_and_makes_room_below_it() -> None:
    q = FlowQueue(CLASSES)
    hogs = [waiting("batch", "hog", cost=1000) for _ in range(3)]
    for hog in hogs:
        assert q.push(hog) is None
    assert q.push(waiting("batch", "small", cost=100)) is None
    assert q.depth("batch") == 4 and q.queued_tokens("batch") == 3100
    assert q.push(waiting("batch", "hog", cost=1000)) == "quota"  # it holds more than its half
    small = waiting("batch", "small", cost=100)
    assert q.push(small) == "saturated"  # full, but its share is not used up:
    assert q.evict_for(small) is hogs[2] and not hogs[2].queued  # the hog's last request makes room
    assert q.push(small) is None and q.held("batch", "hog") == (2000, 2200)
    newcomer = waiting("batch", "new", cost=100)
    assert q.push(newcomer) == "saturated" and q.evict_for(newcomer) is hogs[1]
    assert q.push(newcomer) is None
    # the hog's unserved tokens are not charged: its next request starts where the evicted one did
    assert q.pop(anyone) is hogs[0] and q.pop(anyone).tenant == "small"
    later = waiting("batch", "hog", cost=1000)
    assert q.push(later) is None and later.start == hogs[1].start


def test_a_class_that_never_queues_has_nothing_to_evict() -> None:
    q = FlowQueue([FlowClass("standard", 1, max_queue_s=1.0, max_depth=0)])
    item = waiting("standard")
    assert q.push(item) == "saturated" and q.evict_for(item) is None


def test_only_a_request_a_free_backend_can_take_is_released() -> None:
    q = FlowQueue(CLASSES)
    a, b = waiting("interactive", "a"), waiting("batch", "b")
    a.ref, b.ref = "model-x", "model-y"
    q.push(a)
    q.push(b)
    assert q.pop(lambda w: w.ref == "model-y") is b  # model-x's backends are all busy
    assert q.pop(lambda w: w.ref == "model-y") is None
    assert q.remove(a) and not q.remove(a) and len(q) == 0


def test_the_queue_keeps_each_tenants_tokens_as_requests_come_and_go() -> None:
    q = FlowQueue(CLASSES)
    a1, a2, b = (
        waiting("standard", "a", cost=300),
        waiting("standard", "a", cost=200),
        waiting("standard", "b"),
    )
    for w in (a1, a2, b):
        q.push(w)
    assert q.held("standard", "a") == (500, 600) and q.top_priority() == 1
    assert q.remove(a2) and q.held("standard", "a") == (300, 400)
    assert q.expired(1000.0) == [a1, b]  # a2 left already: its deadline is not handed back
    assert q.held("standard", "a") == (0, 0) and q.top_priority() is None and len(q) == 0


def test_a_backend_is_saturated_while_its_engine_queues_or_its_prefill_is_long() -> None:
    assert engine_backlog(None, None, 50, 0) == 0  # the engine says nothing of its queue
    assert engine_backlog(2.0, 8.0, 1, 0) == 3  # two waiting at the scrape, one sent since
    assert engine_backlog(2.0, 8.0, 1, 3) == 0  # ... and three started since: drained
    # no queue at the scrape: room for SCRAPE_ROOM before it was ever seen queueing ...
    assert engine_backlog(0.0, 4.0, SCRAPE_ROOM, 0) <= 0 < engine_backlog(0.0, 4.0, SCRAPE_ROOM + 1, 0)
    # ... then for what it ran when it queued less what it runs, at least one
    assert engine_backlog(0.0, 20.0, 12, 0, 32.0) == 0 < engine_backlog(0.0, 20.0, 13, 0, 32.0)
    assert engine_backlog(0.0, 32.0, 1, 0, 32.0) == 0 < engine_backlog(0.0, 32.0, 2, 0, 32.0)
    assert saturated(1.0, 0) and not saturated(0.0, 10**9)  # without a rate tokens say nothing
    # with a learned rate the queued prefill is timed: the same tokens are saturation on a slow backend
    slow, fast = PREFILL_SATURATED_S / 1000, PREFILL_SATURATED_S / 100_000
    assert saturated(0.0, 1000, slow) and not saturated(0.0, 99_999, fast)


def test_a_line_is_fitted_per_backend_once_its_first_tokens_waited_for_varied_prefill() -> None:
    model = TtftModel()
    model.observe("a", 0.02 + 0.0002 * 1000, 1000)
    model.observe("a", 0.02 + 0.0002 * 3000, 3000)
    assert model.line("a") is None  # too few first tokens yet
    model.observe("a", 0.02 + 0.0002 * 2000, 2000)
    line = model.line("a")
    assert line is not None and abs(line[0] - 0.02) < 1e-9 and abs(line[1] - 0.0002) < 1e-12
    for _ in range(5):  # short requests behind nothing: what a request costs, not what a token costs
        model.observe("b", 0.015, 12)
    assert model.line("b") is None and model.seconds_per_token("b") is None
    model.observe("c", 1.0, 0)  # no prefill behind it: says nothing
    assert model.line("c") is None
    model.forget("a")
    assert model.line("a") is None


def test_the_shared_figures_carry_the_flow_queues_apart_from_the_backends() -> None:
    figures = {"b0": 3, PREFILL + "b0": 900, FLOW + "interactive": 2, FLOW + "batch": 0}
    counts, _, prefill = split(figures)
    assert counts == {"b0": 3} and prefill == {"b0": 900}
    assert flow_waiting(figures) == {"interactive": 2}


def test_kv_headroom_holds_a_class_at_its_limit_and_unknown_use_holds_nothing() -> None:
    assert kv_full(0.8, 0.8) and kv_full(0.95, 0.8)
    assert not kv_full(0.79, 0.8)
    assert not kv_full(None, 0.8) and not kv_full(0.99, None)
