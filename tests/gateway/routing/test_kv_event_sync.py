"""The KV-event streams follow the fleet: backends added, drained and removed through the admin API.

A real gateway; the publishers are XPUB sockets, so the test sees each subscription arrive and go
(`Publisher.wait_subscribers`) without looking inside the gateway. A backend added through the admin
API has no `kv_events` of its own: its pool's `kv_event_discovery` asks it for `GET
/kv_event_sources`, answered here by a small HTTP server in vLLM 0.32's shape.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from engines.sim.launcher import free_port
from gateway.admission.tokens import mint_token
from gateway.routing.kv_discovery import KvSource
from gateway.routing.kv_events import KvEventSubscriber, KvEventSync
from gateway.settings import BackendSettings, KvEventsSettings, PoolSettings
from policies.kv_index import KvIndex
from tests.conftest import fast_sim, single_pool_config
from tests.gateway.routing.kv_publisher import Publisher
from tests.support import GatewayProcess, wait_until

pytestmark = pytest.mark.processes

SECRET = "test-secret-for-kv-sync-0123456789abcdef"
ADMIN = {"Authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}


class Discovery:
    """An engine's `GET /kv_event_sources` (vLLM's answer: its publisher config per DP rank)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/kv_event_sources":
                    owner.asked += 1
                    body, status = json.dumps(owner.answer).encode(), 200
                else:
                    body, status = b"{}", 200 if self.path == "/health" else 404
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def vllm_sources(pub: Publisher) -> dict[str, Any]:
    """What vLLM serves for `--kv-events-config '{"endpoint": "tcp://*:<port>", ...}'`."""
    return {
        "0": {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{pub.port}",
            "replay_endpoint": None,
            "buffer_steps": 10000,
            "hwm": 100000,
            "max_queue_size": 100000,
            "topic": "kv",
        }
    }


@pytest.fixture
def publishers() -> Iterator[list[Publisher]]:
    pubs = [Publisher(), Publisher()]
    yield pubs
    for pub in pubs:
        pub.close()


def test_admin_changes_to_the_fleet_change_the_subscriptions(publishers: list[Publisher]) -> None:
    configured, discovered = publishers
    engine = Discovery(vllm_sources(discovered))
    try:
        with fast_sim("vllm") as sim:
            config = single_pool_config("vllm", [sim.base_url])
            config["auth"] = {"enabled": True}
            config["models"][0]["tokenizer"] = "sim"
            config["pools"][0]["kv_event_discovery"] = True
            config["pools"][0]["backends"][0]["kv_events"] = {"endpoint": configured.endpoint, "topic": "kv"}
            with (
                GatewayProcess(config, env={"GATEWAY_JWT_SECRET": SECRET}) as gw,
                httpx.Client(base_url=gw.base_url, headers=ADMIN, timeout=10) as admin,
            ):
                configured.wait_subscribers(1)
                assert discovered.poll_subscriptions() == 0

                # added: its engine is asked where it publishes, and subscribed to
                r = admin.post("/admin/pools/vllm/backends", json={"name": "extra", "url": engine.url})
                assert r.status_code == 201, r.text
                discovered.wait_subscribers(1)
                assert engine.asked == 1

                # drained: no new requests, but its cache is still there when it comes back
                assert admin.put("/admin/backends/extra/drain", json={"draining": True}).status_code == 200
                time.sleep(2.5)  # more than two sync passes
                assert discovered.poll_subscriptions() == 1 and engine.asked == 1

                # removed: unsubscribed (and its blocks forgotten)
                assert admin.delete("/admin/backends/extra").status_code == 200
                discovered.wait_subscribers(0)

                # a configured backend removed and added back: its configured source again
                assert admin.delete("/admin/backends/vllm-0").status_code == 200
                configured.wait_subscribers(0)
                r = admin.post("/admin/pools/vllm/backends", json={"name": "vllm-0", "url": sim.base_url})
                assert r.status_code == 201, r.text
                configured.wait_subscribers(1)
                # requests are served all along
                chat = {
                    "model": "test-model",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2,
                }
                assert admin.post("/v1/chat/completions", json=chat).status_code == 200
    finally:
        engine.close()


def test_an_sglang_engine_is_found_through_its_server_info() -> None:
    """The SGLang simulator publishes (`--kv-events-config`) and says where in `/server_info`, as SGLang
    0.5.23 does; the gateway's pool has discovery on and no `kv_events`: it subscribes, and what the
    engine stores for a request is then known to routing."""
    port = free_port()
    events = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "kv"})
    with fast_sim("sglang", "--kv-events-config", events) as sim:
        config = single_pool_config("sglang", [sim.base_url])
        config["auth"] = {"enabled": True}
        config["models"][0]["tokenizer"] = "sim"
        config["pools"][0]["kv_event_discovery"] = True
        config["routing"] = {"scrape_interval_s": 0}
        body = {
            "model": "test-model",
            "messages": [{"role": "user", "content": " ".join(f"fact {i} is {i * 3}." for i in range(150))}],
            "max_tokens": 2,
        }
        with (
            GatewayProcess(config, env={"GATEWAY_JWT_SECRET": SECRET}) as gw,
            httpx.Client(base_url=gw.base_url, headers=ADMIN, timeout=10) as admin,
        ):

            def connected() -> bool:
                line = 'gateway_kv_stream_connected{backend="sglang-0",pool="sglang"} 1.0'
                return line in admin.get("/metrics").text

            def held() -> int:
                r = admin.post("/admin/routes/explain", json=body)
                assert r.status_code == 200, r.text
                return int(r.json()["kv_held_tokens"]["sglang-0"])

            wait_until(connected, 10, what="the subscription to the discovered publisher")
            assert held() == 0
            r = admin.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["prompt_tokens"] > 600
            wait_until(lambda: held() >= 512, 10, what="the engine's BlockStored for the prompt")


class Answers:
    """`fetch_json` for the sync: the answers of each URL, counted (the transport's narrow interface)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def __call__(self, url: str) -> Any:
        self.asked.append(url)
        answer = self.answers.get(url)
        if isinstance(answer, Exception):
            raise answer
        return answer


def pool(discovery: bool, *backends: BackendSettings, name: str = "p", dialect: str = "vllm") -> PoolSettings:
    return PoolSettings.model_validate(
        {
            "name": name,
            "dialect": dialect,
            "models": {"m": "m"},
            "backends": backends,
            "kv_event_discovery": discovery,
        }
    )


async def test_discovery_is_asked_again_only_when_it_failed_or_the_url_changed() -> None:
    sub = KvEventSubscriber(KvIndex())
    fleet = {"a": ("p", "http://a:8000"), "b": ("p", "http://b:8000"), "c": ("p", "http://c:8000")}
    answers = Answers(
        {
            "http://a:8000/kv_event_sources": {
                "0": {"enable_kv_cache_events": True, "endpoint": "tcp://*:5557"}
            },
            "http://b:8000/kv_event_sources": TimeoutError(),
            "http://c:8000/kv_event_sources": ["not", "an", "answer"],
        }
    )
    sync = KvEventSync(sub, lambda: fleet, lambda: [pool(True)], answers, rediscover_s=30.0)
    try:
        await sync.sync()
        assert dict(sub.watched) == {"a": KvSource("tcp://a:5557")}
        asked = len(answers.asked)
        await sync.sync()
        assert len(answers.asked) == asked  # discovered, or failed less than rediscover_s ago
        fleet["a"] = ("p", "http://a2:8000")  # the backend moved
        answers.answers["http://a2:8000/kv_event_sources"] = None  # and publishes nothing there
        await sync.sync()
        assert "a" not in sub.watched and not sub.index.attached("a")
        del fleet["b"]
        await sync.sync()
        assert "http://b:8000/kv_event_sources" not in answers.asked[asked:]
    finally:
        await sync.stop()


async def test_each_pool_asks_its_engines_in_their_dialect() -> None:
    """vLLM backends are asked `GET /kv_event_sources`, SGLang's `GET /server_info` (its `kv_events`)."""
    sub = KvEventSubscriber(KvIndex())
    fleet = {"v": ("vp", "http://v:8000"), "s": ("sp", "http://s:30000")}
    described = {
        "publisher": "zmq",
        "endpoint_host": "*",
        "endpoint_port_base": 5557,
        "topic": "kv",
        "dp_size": 1,
    }
    answers = Answers(
        {
            "http://v:8000/kv_event_sources": {
                "0": {"enable_kv_cache_events": True, "endpoint": "tcp://*:5557"}
            },
            "http://s:30000/server_info": {"dp_size": 1, "kv_events": {**described, "block_size": 1}},
        }
    )
    pools = [pool(True, name="vp", dialect="vllm"), pool(True, name="sp", dialect="sglang")]
    sync = KvEventSync(sub, lambda: fleet, lambda: pools, answers)
    try:
        await sync.sync()
        assert sorted(answers.asked) == ["http://s:30000/server_info", "http://v:8000/kv_event_sources"]
        assert dict(sub.watched) == {"v": KvSource("tcp://v:5557"), "s": KvSource("tcp://s:5557", "kv")}
    finally:
        await sync.stop()


async def test_the_config_is_read_on_every_pass() -> None:
    """A reload that adds, changes or drops a backend's `kv_events` takes effect at the next pass."""
    sub = KvEventSubscriber(KvIndex())
    fleet = {"a": ("p", "http://a:8000")}
    events: KvEventsSettings | None = None

    def pools() -> list[PoolSettings]:
        return [pool(False, BackendSettings(name="a", url="http://a:8000", kv_events=events))]

    answers = Answers({})
    sync = KvEventSync(sub, lambda: fleet, pools, answers)
    try:
        await sync.sync()
        assert not sub.watched
        events = KvEventsSettings(endpoint="tcp://a:5557", topic="kv")
        await sync.sync()
        assert dict(sub.watched) == {"a": KvSource("tcp://a:5557", "kv")}
        events = KvEventsSettings(endpoint="tcp://a:6000", topic="kv")
        await sync.sync()
        assert dict(sub.watched) == {"a": KvSource("tcp://a:6000", "kv")}
        events = None
        await sync.sync()
        assert not sub.watched and not answers.asked  # discovery is off for this pool
    finally:
        await sync.stop()
