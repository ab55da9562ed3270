"""Routing processes sharing their state through a real redis-server (docs/routing.md, *Shared load*):
gateways (`gateway serve`, separate processes, some with several workers) in front of simulators that
publish their own KV-cache events (`--kv-events-config`).

- four routing processes send every question about a document to the backend whose engine holds it;
- a new group placed by one process is followed by another before the engine has announced a block
  of it (the placement in Redis), and without the shared state it is not;
- one process's in-flight requests steer another's choice, and a killed process's counts expire after
  one lease;
- a Redis outage: every request still answered, routed per process, and sharing resumes after it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis as redis_client

from engines.sim.launcher import SimProcess, free_port
from gateway.demo import SERVED
from gateway.routing.shared_load import LEASE_S
from policies.features import FeatureConfig, extract_features
from policies.prefix_affinity import PrefixAffinity
from policies.shared_load import PREFILL, SETS
from policies.types import BackendView, FleetSnapshot, PoolView
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.support import HTTP, GatewayProcess, RedisServer, received_chat, wait_until

pytestmark = pytest.mark.processes

NAMES = ["vllm-0", "vllm-1"]


def document(seed: int, words: int = 1200) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(5000)}" for _ in range(words))


def body(content: str, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        **extra,
    }


def home_of(b: dict[str, Any]) -> str:
    """The backend prefix affinity ranks first for `b` with nothing known (the pure policy)."""
    pool = PoolView("vllm", "vllm", 1.0, frozenset({MODEL}), True, True, tuple(BackendView(n) for n in NAMES))
    return PrefixAffinity().rank(pool, extract_features(b, FeatureConfig()))[0].name


def with_home(home: str, make: Any, start: int = 0) -> Iterator[Any]:
    """Values `make(seed)` whose request body's home is `home`, seed by seed."""
    seed = start
    while True:
        value = make(seed)
        if home_of(value if isinstance(value, dict) else body(value)) == home:
            yield value
        seed += 1


def publishing_sim(*extra: str) -> SimProcess:
    """A vLLM simulator that publishes its KV-cache events (with a replay socket: a routing process
    that subscribes after the first batches still learns them)."""
    port, replay = free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{port}",  # binds (an address without * connects, as vLLM does)
        "replay_endpoint": f"tcp://*:{replay}",
        "topic": "kv",
    }
    return fast_sim("vllm", "--kv-events-config", json.dumps(config), *extra)


def gateway_config(sims: list[SimProcess], redis: RedisServer | None, *, workers: int = 1,
                   shared: bool = True) -> dict[str, Any]:  # fmt: skip
    config = single_pool_config("vllm", [s.base_url for s in sims])
    config["models"][0]["tokenizer"] = "sim"
    config["server"]["workers"] = workers
    config["pools"][0]["kv_event_discovery"] = True  # the sims serve GET /kv_event_sources
    config["routing"] = {"scrape_interval_s": 0, "shared": {"enabled": shared}}
    config["access_log"] = {"enabled": False}
    if redis is not None:
        config["redis"] = {"url": redis.url}
    return config


def served_by(sims: list[SimProcess]) -> list[int]:
    return [int(HTTP.get(s.base_url + "/sim/stats").json()["requests_total"]) for s in sims]


def gauge(gw: GatewayProcess, name: str, backend: str) -> float | None:
    """A per-backend gauge of the gateway's /metrics (over its workers, as the gauge combines them)."""
    for line in HTTP.get(gw.base_url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") and f'backend="{backend}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def shared_in_flight(redis: RedisServer) -> int:
    """The requests in flight that the routing processes have reported to the shared load hash (each
    field: "<lease expiry ms>|" and its figures by name)."""
    live = redis_client.Redis.from_url(redis.url).hgetall("gw:rt:{rt}:live")
    figures = [json.loads(v.split(b"|", 1)[1]) for v in live.values()]
    return sum(n for f in figures for name, n in f.items() if not name.startswith((SETS, PREFILL)))


def events_applied(gw: GatewayProcess, backend: str) -> float:
    """The KV events of `backend`'s stream the gateway's workers have applied, summed over them."""
    return gauge(gw, "gateway_kv_events_total", backend) or 0.0


def subscribed(gws: list[GatewayProcess], backends: list[str]) -> None:
    """Every worker of every gateway is connected to every backend's event stream (the gauge is the
    workers' minimum); what was published before is replayed to it."""
    for gw in gws:
        for name in backends:
            wait_until(
                lambda gw=gw, name=name: gauge(gw, "gateway_kv_stream_connected", name) == 1,
                what=f"{gw.base_url} subscribed to {name}'s events",
            )


def post(url: str, b: dict[str, Any]) -> httpx.Response:
    # a new connection each time: the kernel hands it to any worker of that gateway
    with httpx.Client(timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        return http.post(url + "/v1/chat/completions", json=b)


def where(sims: list[SimProcess], url: str, b: dict[str, Any]) -> tuple[str, str]:
    """Send `b` (alone: nothing else in flight) and return the backend that served it and the reason."""
    sent = time.time()
    r = post(url, b)
    assert r.status_code == 200, r.text
    (k,) = [i for i, s in enumerate(sims) if received_chat(s.base_url, b, sent)]  # not a warm-up's count
    return NAMES[k], r.headers["x-gateway-route"]


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def test_four_routing_processes_send_every_question_where_the_engine_holds_the_document(
    redis: RedisServer,
) -> None:
    """Two gateways × two workers (sharing through Redis). The document is first sent straight to the
    backend that is not its home, as a routing process outside these would: none of the four knows
    of it but by that engine's own events, and all 24 questions about it go there, whichever process
    routes them."""
    with publishing_sim() as s0, publishing_sim() as s1:
        sims = [s0, s1]
        with contextlib.ExitStack() as stack:
            gws = [
                stack.enter_context(GatewayProcess(gateway_config(sims, redis, workers=2))) for _ in range(2)
            ]
            subscribed(gws, NAMES)
            doc = document(11)
            holder = 1 - NAMES.index(home_of(body(f"{doc}\n\nQuestion 0?")))
            direct = dict(body(f"{doc}\n\nQuestion 0?"), model=SERVED["vllm"])
            applied = [events_applied(gw, NAMES[holder]) for gw in gws]
            r = HTTP.post(sims[holder].base_url + "/v1/chat/completions", json=direct)
            assert r.status_code == 200, r.text
            for gw, before in zip(gws, applied, strict=True):  # the request's stored event, in both workers
                wait_until(
                    lambda gw=gw, n=before: events_applied(gw, NAMES[holder]) >= n + 2, what="the event"
                )
            routes = [where(sims, gws[i % 2].base_url, body(f"{doc}\n\nQuestion {i}?")) for i in range(1, 25)]
    wrong = [(i, r) for i, r in enumerate(routes, 1) if r != (NAMES[holder], "default+affinity:index")]
    assert not wrong, f"the engine holding the document is {NAMES[holder]}; requests not sent there: {wrong}"


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "not-shared"])
def test_a_new_group_follows_the_first_process_placement_before_any_event(
    redis: RedisServer, shared: bool
) -> None:
    """Gateway B has sent another document to the document's home, so by its own working sets it
    would place a new document on the other backend; gateway A has sent a longer one to the other
    backend, so it places the new document at home (and with the shared state the store agrees: it
    holds more placed blocks on the other backend than at home). The engine takes ~2.5 s to prefill
    it (no event before that): B's request, sent meanwhile, follows A's placement through Redis - and
    without the shared state it does not (the test's control)."""
    slow = ("--prefill-us-per-token", "2000")
    with publishing_sim(*slow) as s0, publishing_sim(*slow) as s1:
        sims = [s0, s1]
        doc_body = next(with_home("vllm-0", lambda k: body(f"{document(100 + k)}\n\nQuestion?")))
        others = with_home("vllm-0", lambda k: body(document(500 + k, 1100)))
        longer = with_home("vllm-1", lambda k: body(document(700 + k, 1400)))
        with (
            GatewayProcess(gateway_config(sims, redis, shared=shared)) as a,
            GatewayProcess(gateway_config(sims, redis, shared=shared)) as b,
        ):
            subscribed([a, b], NAMES)
            # B's working set at vllm-0 grows by one document (opening groups go to the lightest),
            # A's at vllm-1 by a longer one
            assert where(sims, b.base_url, next(others))[0] == "vllm-0"
            assert where(sims, a.base_url, next(longer))[0] == "vllm-1"
            results: dict[str, httpx.Response] = {}
            first = threading.Thread(target=lambda: results.setdefault("a", post(a.base_url, doc_body)))
            before = served_by(sims)
            first.start()
            wait_until(lambda: served_by(sims) != before, 5, what="A's request reaching an engine")
            now = served_by(sims)
            a_went = NAMES[next(i for i in range(len(sims)) if now[i] > before[i])]
            b_went, b_reason = where(sims, b.base_url, dict(doc_body, max_tokens=5))
            first.join(30)
    assert results["a"].status_code == 200
    assert a_went == "vllm-0"
    if shared:
        assert b_went == a_went, f"B routed the group to {b_went} ({b_reason}), A had placed it on {a_went}"
    else:
        assert b_went == "vllm-1", f"B, alone, placed the group on {b_went} ({b_reason})"


def test_another_process_streams_steer_the_choice_and_a_killed_process_counts_expire(
    redis: RedisServer,
) -> None:
    """A holds six long streams about one document on its home, vllm-0; B, which has none in flight,
    routes new conversations whose home is vllm-0 to vllm-1 (the fleet's counts, not its own). A is
    killed (SIGKILL: nothing said goodbye): its counts still count until its lease (`LEASE_S`) has
    passed, then B sends the conversations home again."""
    slow = ("--itl-ms", "200", "--min-output-tokens", "200", "--max-output-tokens", "200")
    with publishing_sim(*slow) as s0, publishing_sim(*slow) as s1:
        sims = [s0, s1]
        doc = next(with_home("vllm-0", lambda k: f"{document(900 + k)}\n\nQuestion?"))
        conversations = with_home("vllm-0", lambda k: body(f"conversation {k}: " + document(k, 40), 1))
        with GatewayProcess(gateway_config(sims, redis)) as b:
            a = GatewayProcess(gateway_config(sims, redis)).start()
            try:
                subscribed([a, b], NAMES)
                for i in range(6):
                    req = body(f"{doc} {i}", 200, stream=True)
                    threading.Thread(target=_stream, args=(a.base_url, req), daemon=True).start()
                    wait_until(lambda i=i: served_by(sims)[0] > i, 10, what=f"A's stream {i} on vllm-0")
                # once A's renewer (every lease / 3) has reported its six streams, B steers away
                wait_until(
                    lambda: where(sims, b.base_url, next(conversations))[0] == "vllm-1", what="A heard"
                )
                steered = [where(sims, b.base_url, next(conversations)) for _ in range(3)]
                assert a.proc is not None
                a.proc.kill()
                a.proc.wait()
                lingering = where(sims, b.base_url, next(conversations))
                # once A's lease has passed without a renewal, its counts no longer count
                wait_until(
                    lambda: where(sims, b.base_url, next(conversations))[0] == "vllm-0",
                    LEASE_S * 2,
                    what="home",
                )
                home = [where(sims, b.base_url, next(conversations)) for _ in range(3)]
            finally:
                a.stop()
    assert [w for w, _ in steered] == ["vllm-1"] * 3, steered
    assert lingering[0] == "vllm-1", lingering
    assert [w for w, _ in home] == ["vllm-0"] * 3, home


def test_with_another_process_busy_a_new_document_may_be_placed_in_the_other_pool(redis: RedisServer) -> None:
    """Two pools of one backend each, equal weights, three gateways sharing Redis. A places a document
    on a-0. Alone (nothing in flight elsewhere), B places another document whose pool by its own
    (empty) working sets is `a` there too: the store chooses only among that pool's backends. While A
    has a stream in flight, C - which has heard A's counts - proposes pool `a` for a third document
    and the store places it on b-0, the backend with no placed blocks: what C sent itself is only its
    part of the fleet's traffic (docs/routing.md, *Shared load*)."""
    from policies.router import Router

    slow = ("--itl-ms", "200", "--min-output-tokens", "200", "--max-output-tokens", "200")
    pools = [PoolView(n, "vllm", 1.0, frozenset({MODEL}), True, True, (BackendView(f"{n}-0"),)) for n in "ab"]
    snapshot = FleetSnapshot(tuple(pools))

    def pool_of(b: dict[str, Any]) -> str:  # the pool a process that has sent nothing picks
        return Router().decide(snapshot, extract_features(b, FeatureConfig()), 0.5, dry_run=True).pool

    docs = (body(f"{document(1000 + k)}\n\nQuestion?", 1) for k in range(10_000))
    in_a = (d for d in docs if pool_of(d) == "a")
    x1, x2, x3 = next(in_a), next(in_a), next(in_a)
    with publishing_sim(*slow) as sa, publishing_sim(*slow) as sb:
        sims = [sa, sb]
        config = gateway_config(sims, redis)
        config["pools"] = [
            dict(config["pools"][0], name=n, backends=[{"name": f"{n}-0", "url": s.base_url}])
            for n, s in (("a", sa), ("b", sb))
        ]
        with contextlib.ExitStack() as stack:
            # (a config each: a gateway writes its port into it)
            a, b, c = (stack.enter_context(GatewayProcess(copy.deepcopy(config))) for _ in range(3))
            subscribed([a, b, c], ["a-0", "b-0"])
            placed = [_served(sims, a.base_url, x1)]
            # two leases: A's count for x1 has expired in Redis, and B's view of it (as its renewer
            # last heard it, kept for a lease) with it
            # no signal: a count that expires in Redis is seen by its absence only
            time.sleep(LEASE_S * 2 + 0.2)
            placed.append(_served(sims, b.base_url, x2))
            threading.Thread(
                target=_stream, args=(a.base_url, body("hello", 200, stream=True)), daemon=True
            ).start()
            wait_until(lambda: sum(served_by(sims)) == 3, 10, what="A's stream on an engine")
            wait_until(lambda: shared_in_flight(redis) >= 1, LEASE_S, what="A's renewer reporting its stream")
            assert post(c.base_url, body("hi", 1)).status_code == 200  # C hears the others' counts
            third = _served(sims, c.base_url, x3)
    assert placed == ["a-0", "a-0"], placed
    assert third == "b-0", f"the third document went to {third}"


def _served(sims: list[SimProcess], url: str, b: dict[str, Any]) -> str:
    """Send `b` alone and return the name of the backend (pool `a` or `b`, one backend each) that served it."""
    before = served_by(sims)
    r = post(url, b)
    assert r.status_code == 200, r.text
    after = served_by(sims)
    (k,) = [i for i in range(len(sims)) if after[i] > before[i]]
    return ["a-0", "b-0"][k]


def _stream(url: str, b: dict[str, Any]) -> None:
    with (
        contextlib.suppress(httpx.HTTPError),
        httpx.Client(timeout=120) as http,
        http.stream("POST", url + "/v1/chat/completions", json=b) as r,
    ):
        for _ in r.iter_bytes():
            pass


def test_a_redis_outage_fails_no_request_and_sharing_resumes_after_it() -> None:
    """Two gateways × two workers, Redis stopped mid-run and started again on the same port: every one
    of 90 requests is answered (routing falls back to each process's own counts and placements), and
    the processes share again afterwards (a document placed by one is followed by the others)."""
    server = RedisServer().start()
    port = server.port
    try:
        with publishing_sim() as s0, publishing_sim() as s1:
            sims = [s0, s1]
            with contextlib.ExitStack() as stack:
                gws = [
                    stack.enter_context(GatewayProcess(gateway_config(sims, server, workers=2)))
                    for _ in range(2)
                ]
                statuses: list[int] = []
                reasons: list[str] = []

                def burst(n: int, seed: int) -> None:
                    for i in range(n):
                        b = body(f"{document(seed + i % 5, 1000)}\n\nQuestion {seed + i}?")
                        r = post(gws[i % 2].base_url, b)
                        statuses.append(r.status_code)
                        reasons.append(r.headers.get("x-gateway-route", ""))

                burst(30, 0)
                server.stop()  # the outage
                burst(30, 1000)
                server = RedisServer(port).start()
                for gw in gws:  # every worker's probe has seen Redis again (the gauge is their minimum)
                    wait_until(
                        lambda gw=gw: "gateway_redis_up 1.0" in HTTP.get(gw.base_url + "/metrics").text
                    )
                burst(30, 2000)
                # the restarted (empty) Redis holds the placements the processes set after it came back
                placed = redis_client.Redis.from_url(server.url).keys("gw:rt:{rt}:g:*")
    finally:
        server.stop()
    assert statuses == [200] * 90, [s for s in statuses if s != 200]
    assert all("affinity:" in r for r in reasons), set(reasons)
    assert placed, "no shared placement after Redis came back"


def test_a_process_hears_the_working_sets_the_others_sent(redis: RedisServer) -> None:
    """A routes a document; B, after any call of its own to the store, sees A's working set on the
    backend that got it (what a document's placement proposal adds to B's own:
    `policies.shared_load`), by the admin explain's `shared` view - and its own report does not come
    back to it as another's."""
    from gateway.admission.tokens import mint_token

    secret = "test-secret-for-shared-working-sets-0123"
    user = {"Authorization": "Bearer " + mint_token(secret, "alice")}
    admin = {"Authorization": "Bearer " + mint_token(secret, "ops", roles=["admin"])}

    def send(gw: GatewayProcess, b: dict[str, Any]) -> None:
        r = HTTP.post(gw.base_url + "/v1/chat/completions", json=b, headers=user)
        assert r.status_code == 200, r.text

    def view(gw: GatewayProcess) -> dict[str, Any]:
        r = HTTP.post(gw.base_url + "/admin/routes/explain", json=body("hello"), headers=admin, timeout=10)
        assert r.status_code == 200, r.text
        return dict(r.json()["shared"])

    env = {"GATEWAY_JWT_SECRET": secret}
    with publishing_sim() as s0, publishing_sim() as s1:
        sims = [s0, s1]
        with (
            GatewayProcess(gateway_config(sims, redis), env=env) as a,
            GatewayProcess(gateway_config(sims, redis), env=env) as b,
        ):
            subscribed([a, b], NAMES)
            before = served_by(sims)
            send(a, body(f"{document(7)}\n\nQuestion?"))
            after = served_by(sims)
            (got,) = [NAMES[k] for k in range(2) if after[k] > before[k]]
            send(b, body("hi", 1))  # B's call hears A's report
            seen = view(b)
            assert set(seen["others_working_sets"]) == {got}, seen
            assert seen["others_working_sets"][got] > 30, seen  # the document's blocks (1,200 words)
            send(a, body("hi", 1))
            assert view(a)["others_working_sets"] == {}  # B routed no group: nothing of its own
