"""Flow control end to end (docs/flow-control.md): real gateways in front of a simulator that runs one
sequence at a time. Each test freezes it (its `freeze` fault: no step runs) with one request
running and one waiting, the gateway sees the waiting gauge (scraped every 0.2 s) and queues
newcomers for as long as the test needs, however slow the machine; thawed, the gateway releases them
by class and fair share. A deadline or a full class sheds with 503 / 429; a client that leaves while
queued is dropped before any engine sees it. Order and counts are asserted, never durations."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from engines.sim.launcher import SimProcess
from gateway.admission.tokens import mint_token
from gateway.demo import SERVED
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.support import HTTP, GatewayProcess, RedisServer, wait_until

pytestmark = pytest.mark.processes

SECRET = "test-secret-for-flow-control-0123456789abcdef"
ADMIN = {"Authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
#: one sequence at a time, 30 ms a step, 40 tokens an answer: once thawed, the engine stays saturated
#: while the gateway releases what it queued
SLOW = ("--max-num-seqs", "1", "--itl-ms", "30", "--min-output-tokens", "40", "--max-output-tokens", "40")
SHORT, LONG = 10, 40
QUEUE_WAIT_S = 30.0
#: the shipped classes with deadlines no test reaches: what waits behind the fill is served
PATIENT = {
    "interactive": {"priority": 0, "max_queue_s": 120, "max_queued": 256},
    "standard": {"priority": 1, "max_queue_s": 120, "max_queued": 1024},
    "batch": {"priority": 2, "max_queue_s": 120, "max_queued": 4096},
}


def token(user: str, tier: str = "default", tenant: str | None = None) -> dict[str, str]:
    return {"Authorization": "Bearer " + mint_token(SECRET, user, tier=tier, tenant=tenant)}


def config(sim: SimProcess, redis: RedisServer | None = None, **flow: Any) -> dict[str, Any]:
    flow.setdefault("classes", PATIENT)
    cfg = single_pool_config("vllm", [sim.base_url])
    cfg["auth"] = {"enabled": True}
    cfg["routing"] = {"scrape_interval_s": 0.2}
    cfg["limits"] = {
        "tiers": {
            "default": {},
            "chat": {"priority_class": "interactive"},
            "bulk": {"priority_class": "batch"},
        }
    }
    if flow:
        cfg["flow"] = flow
    if redis is not None:
        cfg["redis"] = {"url": redis.url}
        cfg["routing"]["shared"] = {"enabled": True}
    return cfg


@contextlib.contextmanager
def gateway(sim: SimProcess, redis: RedisServer | None = None, **flow: Any) -> Iterator[GatewayProcess]:
    with GatewayProcess(config(sim, redis, **flow), env={"GATEWAY_JWT_SECRET": SECRET}) as gw:
        yield gw


class Client:
    """Requests sent from threads; each one's outcome appended, in the order they end."""

    def __init__(self, gw: GatewayProcess) -> None:
        self.gw = gw
        self.done: list[tuple[str, int, dict[str, str]]] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def send(
        self,
        label: str,
        headers: dict[str, str],
        max_tokens: int = SHORT,
        words: int = 5,
        via: GatewayProcess | None = None,
    ) -> None:
        url = (via or self.gw).base_url + "/v1/chat/completions"
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": " ".join(f"{label}{i}" for i in range(words))}],
            "max_tokens": max_tokens,
        }

        def run() -> None:
            r = HTTP.post(url, json=body, headers=headers, timeout=60)
            with self._lock:
                self.done.append((label, r.status_code, dict(r.headers)))

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._threads.append(thread)

    def join(self) -> list[str]:
        for thread in self._threads:
            thread.join(60)
            assert not thread.is_alive(), "a request never ended"
        return [label for label, _, _ in self.done]


def flow_report(gw: GatewayProcess) -> dict[str, Any]:
    report: dict[str, Any] = HTTP.get(gw.base_url + "/admin/flow", headers=ADMIN, timeout=10).json()
    return report


def queued(gw: GatewayProcess, klass: str) -> int:
    return int(flow_report(gw)["replica"]["queued"].get(klass, 0))


def freeze(sim: SimProcess, frozen: bool = True) -> None:
    r = HTTP.post(sim.base_url + "/sim/faults", json={"freeze": frozen}, timeout=10)
    assert r.status_code == 200, r.text


def wait_queued(gw: GatewayProcess, klass: str, n: int, what: str) -> None:
    """Until exactly `n` requests of `klass` wait in `gw`'s queue; a timeout shows its flow report.
    They arrive through the client's threads and another process's HTTP stack: on a machine loaded
    beyond its cores, more than the suite's usual wait."""
    try:
        wait_until(lambda: queued(gw, klass) == n, QUEUE_WAIT_S, what)
    except AssertionError as e:
        raise AssertionError(f"{e}; /admin/flow: {flow_report(gw)}") from None


def sim_stats(sim: SimProcess) -> dict[str, Any]:
    stats: dict[str, Any] = HTTP.get(sim.base_url + "/sim/stats", timeout=10).json()
    return stats


def saturate(client: Client, gw: GatewayProcess, sim: SimProcess, words: int = 5) -> None:
    """One request running in the engine, frozen there, and one more waiting behind it, until the
    gateway sees the engine saturated (and that it runs one at a time, so that it releases one at a
    time once thawed); it stays saturated until the test thaws it. Each fill is sent only once the
    engine shows the one before: a fill sent after the gateway saw the queue would wait in the
    gateway's."""
    client.send("fill0-", token("filler"), max_tokens=LONG, words=words)
    wait_until(lambda: sim_stats(sim)["running"] == 1, what="the first fill running")
    freeze(sim)
    client.send("fill1-", token("filler"), max_tokens=LONG, words=words)
    wait_until(lambda: sim_stats(sim)["waiting"] == 1, what="the second fill waiting in the engine")
    wait_until(lambda: flow_report(gw)["replica"]["saturated_backends"], what="the engine seen saturated")


def metric(gw: GatewayProcess, name: str, **labels: str) -> float:
    text = HTTP.get(gw.base_url + "/metrics", headers=ADMIN, timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_interactive_requests_overtake_queued_batch_requests() -> None:
    with fast_sim("vllm", *SLOW) as sim, gateway(sim) as gw:
        client = Client(gw)
        saturate(client, gw, sim)
        for i in range(6):
            client.send(f"batch{i}-", token("loader", tier="bulk"))
        wait_queued(gw, "batch", 6, "the batch requests queued in the gateway")
        for i in range(2):
            client.send(f"chat{i}-", token("person", tier="chat"))
        wait_queued(gw, "interactive", 2, "chat queued")
        freeze(sim, False)
        order = [label for label in client.join() if not label.startswith("fill")]
        last_chat = max(order.index("chat0-"), order.index("chat1-"))
        after = [label for label in order[last_chat:] if label.startswith("batch")]
        assert len(after) >= 3, order  # first come, first served would have served them all first
        statuses = {status for _, status, _ in client.done}
        assert statuses == {200}, client.done
        waited = [h for label, _, h in client.done if label.startswith("chat")]
        assert all(int(h["x-gateway-queue-ms"]) >= 0 for h in waited), waited


def test_tenants_of_a_class_share_by_tokens() -> None:
    with fast_sim("vllm", *SLOW) as sim, gateway(sim) as gw:
        client = Client(gw)
        saturate(client, gw, sim)
        for i in range(5):  # ~400 prompt tokens each: long documents
            client.send(f"long{i}-", token("a", tier="bulk", tenant="docs"), words=400)
        wait_queued(gw, "batch", 5, "the long requests queued")
        for i in range(5):  # a few tokens each
            client.send(f"short{i}-", token("b", tier="bulk", tenant="chatbot"))
        wait_queued(gw, "batch", 10, "the short requests queued")
        freeze(sim, False)
        order = [label for label in client.join() if not label.startswith("fill")]
        last_short = max(i for i, label in enumerate(order) if label.startswith("short"))
        longs_before = sum(1 for label in order[:last_short] if label.startswith("long"))
        assert longs_before <= 2, order  # by requests, or first come first served, it would be 5
        assert {status for _, status, _ in client.done} == {200}


def test_a_request_past_its_deadline_is_shed_with_503_and_retry_after() -> None:
    with fast_sim("vllm", *SLOW) as sim, gateway(sim) as gw:
        client = Client(gw)
        saturate(client, gw, sim)
        r = HTTP.post(
            gw.base_url + "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
            headers={**token("impatient"), "x-gateway-max-queue-ms": "100"},
        )
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "fleet_saturated")
        assert int(r.headers["retry-after"]) >= 1 and "x-gateway-queue-ms" in r.headers
        assert metric(gw, "gateway_flow_shed_total", **{"class": "standard", "reason": "deadline"}) == 1
        freeze(sim, False)
        client.join()


def test_a_full_class_answers_429_to_the_tenant_holding_its_share_and_makes_room_for_others() -> None:
    classes = {
        "interactive": {"priority": 0, "max_queue_s": 5, "max_queued": 8},
        "standard": {"priority": 1, "max_queue_s": 30, "max_queued": 2},
        "batch": {"priority": 2, "max_queue_s": 30, "max_queued": 8},
    }
    with fast_sim("vllm", *SLOW) as sim, gateway(sim, classes=classes) as gw:
        client = Client(gw)
        saturate(client, gw, sim)
        hog = token("hog", tenant="hogs")
        client.send("hog0-", hog)
        wait_queued(gw, "standard", 1, "the first hog queued")
        client.send("hog1-", hog)
        wait_queued(gw, "standard", 2, "the class full")
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 5}
        again = HTTP.post(gw.base_url + "/v1/chat/completions", json=body, headers=hog)
        assert again.status_code == 429, again.text
        assert (
            again.json()["error"]["code"] == "rate_limit_exceeded"
            and "share" in again.json()["error"]["message"]
        )
        assert int(again.headers["retry-after"]) >= 1
        client.send("polite-", token("polite", tenant="others"))  # below its share: the last hog leaves
        wait_until(
            lambda: any(label == "hog1-" for label, _, _ in client.done), QUEUE_WAIT_S, "the last hog refused"
        )
        assert queued(gw, "standard") == 2
        freeze(sim, False)
        client.join()
        status = {label: code for label, code, _ in client.done if not label.startswith("fill")}
        assert status == {"hog0-": 200, "hog1-": 429, "polite-": 200}, client.done
        evicted = next(h for label, _, h in client.done if label == "hog1-")
        assert int(evicted["retry-after"]) >= 1
        assert metric(gw, "gateway_flow_shed_total", **{"class": "standard", "reason": "share"}) == 2


def test_a_client_that_leaves_while_queued_never_reaches_the_engine() -> None:
    with fast_sim("vllm", *SLOW) as sim, gateway(sim) as gw:
        client = Client(gw)
        saturate(client, gw, sim)
        body = orjson.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "leaving-early"}], "max_tokens": 5}
        )
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            f"authorization: {token('leaver')['Authorization']}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            sock.sendall(head + body)
            wait_queued(gw, "standard", 1, "the request queued")
        wait_queued(gw, "standard", 0, "the request out of the queue")
        shed = metric(gw, "gateway_flow_shed_total", **{"class": "standard", "reason": "disconnect"})
        assert shed == 1
        freeze(sim, False)
        client.join()
        assert not _engine_saw(sim, "leaving-early")
        assert _engine_saw(sim, "fill0-")  # the log holds what the engine was sent


def test_a_document_the_rules_send_to_a_saturated_pool_waits_for_it_and_others_pass() -> None:
    with fast_sim("vllm", *SLOW) as slow, fast_sim("sglang") as fast:
        cfg = config(slow)
        cfg["pools"].append(
            {
                "name": "sglang",
                "dialect": "sglang",
                "models": {MODEL: SERVED["sglang"]},
                "backends": [{"name": "sglang-0", "url": fast.base_url}],
            }
        )
        cfg["routing"]["rules"] = [{"name": "documents", "min_prompt_tokens": 200, "pools": ["vllm"]}]
        with GatewayProcess(cfg, env={"GATEWAY_JWT_SECRET": SECRET}) as gw:
            client = Client(gw)
            saturate(client, gw, slow, words=300)  # documents: the rule sends them to the slow pool
            assert flow_report(gw)["replica"]["saturated_backends"] == ["vllm-0"]
            client.send("document-", token("reader"), words=300)
            wait_queued(gw, "standard", 1, "the document queued for its pool")
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
            chat = HTTP.post(gw.base_url + "/v1/chat/completions", json=body, headers=token("u"))
            assert chat.status_code == 200 and chat.headers["x-gateway-pool"] == "sglang", chat.text
            assert queued(gw, "standard") == 1  # the document still waits for the slow pool
            freeze(slow, False)
            client.join()
        pools = {label: h["x-gateway-pool"] for label, _, h in client.done}
        assert set(pools.values()) == {"vllm"}, pools  # no document spilled onto the fast pool


def test_a_replica_holds_its_batch_requests_while_another_has_interactive_ones_waiting() -> None:
    with (
        RedisServer() as redis,
        fast_sim("vllm", *SLOW) as sim,
        gateway(sim, redis) as a,
        gateway(sim, redis) as b,
    ):
        client = Client(a)
        saturate(client, a, sim)
        wait_until(
            lambda: flow_report(b)["replica"]["saturated_backends"], what="b sees the engine saturated"
        )
        for i in range(8):
            client.send(f"batch{i}-", token("loader", tier="bulk"), via=b)
        wait_queued(b, "batch", 8, "the batch requests queued in b")
        for i in range(2):
            client.send(f"chat{i}-", token("person", tier="chat"), via=a)
        wait_queued(a, "interactive", 2, "the chat requests queued in a")

        def b_hears_a() -> bool:
            replicas = flow_report(b)["replicas"] or []
            return any(r["queued"].get("interactive") for r in replicas)

        wait_until(b_hears_a, what="b hearing of a's interactive requests")
        freeze(sim, False)
        order = [label for label in client.join() if not label.startswith("fill")]
        last_chat = max(order.index("chat0-"), order.index("chat1-"))
        after = [label for label in order[last_chat:] if label.startswith("batch")]
        assert len(after) >= 3, order
        assert {status for _, status, _ in client.done} == {200}


def _engine_saw(sim: SimProcess, text: str) -> bool:
    requests = HTTP.get(sim.base_url + "/sim/requests", timeout=10).json()["requests"]
    return any(text in str(r) for r in requests)
