"""The admin API and routing end to end: weights, drain, pins, rules, affinity, replicas sharing Redis.

Real simulators (2 vLLM-dialect + 2 SGLang-dialect), real gateway processes, a real redis-server;
admin calls carry a real JWT with the admin role.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from engines.sim.launcher import SimProcess
from gateway.admission.tokens import mint_token
from gateway.demo import SERVED, demo_config
from tests.conftest import MODEL, fast_sim
from tests.support import HTTP, GatewayProcess, RedisServer, wait_until

pytestmark = pytest.mark.processes

SECRET = "test-secret-for-admin-suite-0123456789"
ENV = {"GATEWAY_JWT_SECRET": SECRET}
ADMIN = {"Authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
USER = {"Authorization": "Bearer " + mint_token(SECRET, "alice")}
EXPIRED = {"Authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"], ttl_s=-3600)}
# A client's wait for one answer. Generous: a loaded machine can hold every process for seconds at a
# time, and an answer that comes returns at once.
HTTP_TIMEOUT_S = 30.0


def fleet_config(urls: dict[str, list[str]]) -> dict[str, Any]:
    """The demo's two-pool config (gateway/demo.py) serving MODEL, with quicker probes and a lower long-prompt rule."""
    config = demo_config(urls, port=0)
    config.pop("limits")  # the routing tests send more than the demo user's 60 requests a minute
    config["models"][0]["name"] = MODEL
    for pool in config["pools"]:
        pool["models"] = {MODEL: SERVED[pool["dialect"]]}
    config["routing"]["rules"][0]["min_prompt_tokens"] = 1500
    config["routing"]["scrape_interval_s"] = 0.5
    config["upstream"]["health"]["interval_s"] = 0.5
    return config


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, list[SimProcess]]]:
    with contextlib.ExitStack() as stack:
        out = {
            e: [stack.enter_context(fast_sim(e, "--itl-ms", "2")) for _ in range(2)]
            for e in ("vllm", "sglang")
        }
        yield out


@pytest.fixture(scope="module")
def urls(sims: dict[str, list[SimProcess]]) -> dict[str, list[str]]:
    return {e: [s.base_url for s in ss] for e, ss in sims.items()}


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


@pytest.fixture()
def gateway(urls: dict[str, list[str]]) -> Iterator[GatewayProcess]:
    with GatewayProcess(fleet_config(urls), env=ENV) as gw:
        yield gw


@pytest.fixture(scope="module")
def refusing_gateway(urls: dict[str, list[str]]) -> Iterator[GatewayProcess]:
    """One gateway for the access checks: a refused request changes nothing, so they can share it."""
    with GatewayProcess(fleet_config(urls), env=ENV) as gw:
        yield gw


def _chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4, **extra}


def _requests_by_backend(sims: dict[str, list[SimProcess]]) -> dict[str, int]:
    return {
        f"{e}-{i}": int(HTTP.get(s.base_url + "/sim/stats", timeout=5).json()["requests_total"])
        for e, ss in sims.items()
        for i, s in enumerate(ss)
    }


def _gateway_log(gateway: GatewayProcess) -> str:
    """The gateway log without its access log (a backend taken out, a probe timed out), and the access
    log's statuses with its lines of any other status than 200 (did the gateway log the failed request
    as answered?), for a failure."""
    lines = gateway.log().splitlines()
    access = [line for line in lines if line.startswith("{")]

    def status(line: str) -> object:
        try:
            return json.loads(line).get("status")
        except ValueError:
            return "unparsed"

    statuses = Counter(str(status(line)) for line in access)
    odd = [line for line in access if status(line) != 200]
    return (
        gateway.server_log()[-4000:]
        + f"\naccess log: {len(access)} lines, statuses {dict(statuses)}\n"
        + "\n".join(odd[-5:])
    )


async def _send_many(
    gateway: GatewayProcess, bodies: list[dict[str, Any]], headers: dict[str, str] | None = None
) -> list[httpx.Response]:
    """`bodies` sent 32 at a time over 32 kept-alive connections. A request that fails at the transport
    level is sent once more, as the SDKs do (openai's `max_retries`), and the call fails when one fails
    twice or more than 3 needed it. Such failures come rarely on a loaded machine (a connect timeout, a
    connection closed while a held client waited); a connection pool smaller than the concurrency
    (httpx keeps 20 by default) would open and close connections all along."""
    sem = asyncio.Semaphore(32)
    started = time.monotonic()
    retried: list[str] = []
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    async with httpx.AsyncClient(
        base_url=gateway.base_url, timeout=HTTP_TIMEOUT_S, headers=headers or USER, limits=limits
    ) as client:

        async def one(body: dict[str, Any]) -> httpx.Response:
            async with sem:
                for attempt in (1, 2):
                    t0 = time.monotonic()
                    try:
                        return await client.post("/v1/chat/completions", json=body)
                    except httpx.TransportError as e:
                        what = (
                            f"{type(e).__name__} {t0 - started:.1f}s in, after {time.monotonic() - t0:.1f}s"
                        )
                        if attempt == 2:
                            raise _Failed(f"twice; the second: {what}") from e
                        retried.append(what)
                raise AssertionError("unreachable")

        results = await asyncio.gather(*(one(b) for b in bodies), return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed or len(retried) > 3:
        raise AssertionError(
            f"{len(failed)} of {len(bodies)} requests failed, the first: {failed[:1]!r}; {len(retried)}"
            f" sent again: {retried[:5]}; the gateway log:\n{_gateway_log(gateway)}"
        )
    return [r for r in results if isinstance(r, httpx.Response)]


def _all_answered(responses: list[httpx.Response], gateway: GatewayProcess) -> None:
    """Every answer a 200; else the refused ones (status, body) and the gateway's log."""
    failed = [(r.status_code, r.text) for r in responses if r.status_code != 200]
    assert not failed, f"{len(failed)} refused, {failed[:3]}; the gateway log:\n{_gateway_log(gateway)}"


class _Failed(Exception):
    pass


# -- access -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/admin/pools", None),
        ("PUT", "/admin/pools/vllm/weight", {"weight": 0.5}),
        ("POST", "/admin/pools/vllm/backends", {"name": "x", "url": "http://127.0.0.1:9"}),
        ("DELETE", "/admin/backends/nope", None),
        ("PUT", "/admin/backends/nope/drain", {"draining": True}),
        ("POST", "/admin/routes/explain", _chat("hi")),
        ("POST", "/admin/reload", None),
        ("GET", "/admin/audit", None),
        ("POST", "/admin/api-keys", {"user": "bob"}),
        ("GET", "/admin/api-keys", None),
        ("DELETE", "/admin/api-keys/nope", None),
    ],
)
def test_admin_endpoints_need_the_admin_role(
    refusing_gateway: GatewayProcess, method: str, path: str, body: Any
) -> None:
    with httpx.Client(base_url=refusing_gateway.base_url, timeout=HTTP_TIMEOUT_S) as http:
        assert http.request(method, path, json=body).status_code == 401
        assert http.request(method, path, json=body, headers=EXPIRED).status_code == 401
        denied = http.request(method, path, json=body, headers=USER)
        assert denied.status_code == 403
        assert set(denied.json()["error"]) == {"message", "type", "param", "code"}


def test_pools_listing_and_explain(gateway: GatewayProcess) -> None:
    with httpx.Client(base_url=gateway.base_url, timeout=HTTP_TIMEOUT_S, headers=ADMIN) as http:
        pools = http.get("/admin/pools").json()["pools"]
        assert {p["name"] for p in pools} == {"vllm", "sglang"}
        assert all(len(p["backends"]) == 2 and p["backends"][0]["healthy"] for p in pools)
        explained = http.post("/admin/routes/explain", json=_chat("hello", tools=[_TOOL])).json()
        assert explained["routable"] and explained["pool"] == "sglang"
        assert explained["reason"].startswith("rule:tools")
        assert explained["features"]["has_tools"] is True
        pinned = http.post(
            "/admin/routes/explain", json=_chat("hello"), headers={"x-gateway-pool": "vllm"}
        ).json()
        assert pinned["pool"] == "vllm" and pinned["reason"].startswith("pin")


_TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}},
}


# -- weights ------------------------------------------------------------------------------------------
def test_weighted_split_matches_weights_and_zero_removes_a_pool(gateway: GatewayProcess) -> None:
    with httpx.Client(base_url=gateway.base_url, timeout=HTTP_TIMEOUT_S, headers=ADMIN) as http:
        assert http.put("/admin/pools/vllm/weight", json={"weight": 0.8}).json()["ok"]
        assert http.put("/admin/pools/sglang/weight", json={"weight": 0.2}).json()["ok"]
    bodies = [_chat(f"conversation {i} about topic {i * 7919 % 1000}") for i in range(2000)]
    responses = asyncio.run(_send_many(gateway, bodies))
    _all_answered(responses, gateway)
    split = Counter(r.headers["x-gateway-pool"] for r in responses)
    expected = {"vllm": 1600.0, "sglang": 400.0}
    chi2 = sum((split[p] - e) ** 2 / e for p, e in expected.items())
    assert chi2 < 10.83, f"split {dict(split)} does not follow 0.8/0.2 (chi2={chi2:.2f}, p<0.001)"
    with httpx.Client(base_url=gateway.base_url, timeout=HTTP_TIMEOUT_S, headers=ADMIN) as http:
        http.put("/admin/pools/sglang/weight", json={"weight": 0})
        audit = http.get("/admin/audit").json()["entries"]
    assert audit[0]["action"] == "set_weight" and audit[0]["target"] == "sglang" and audit[0]["after"] == 0
    assert audit[0]["actor"] == "ops" and audit[0]["before"] == 0.2
    responses = asyncio.run(_send_many(gateway, [_chat(f"after zero {i}") for i in range(100)]))
    _all_answered(responses, gateway)
    assert {r.headers["x-gateway-pool"] for r in responses} == {"vllm"}


# -- drain --------------------------------------------------------------------------------------------
def test_drained_backend_gets_no_new_requests_while_its_stream_finishes(
    gateway: GatewayProcess, sims: dict[str, list[SimProcess]]
) -> None:
    result: dict[str, str] = {}

    def long_stream() -> None:
        body = _chat("a long story", stream=True, max_tokens=300, min_tokens=300)
        with httpx.Client(base_url=gateway.base_url, timeout=HTTP_TIMEOUT_S, headers=ADMIN) as http:
            result["text"] = http.post(
                "/v1/chat/completions", json=body, headers={"x-gateway-pool": "vllm"}
            ).text

    t = threading.Thread(target=long_stream)
    t.start()
    with httpx.Client(base_url=gateway.base_url, timeout=HTTP_TIMEOUT_S, headers=ADMIN) as http:

        def busy() -> str | None:
            pools = http.get("/admin/pools").json()["pools"]
            return next((b["name"] for p in pools for b in p["backends"] if b["in_flight"] > 0), None)

        wait_until(lambda: busy() is not None, timeout=5, what="the stream to start")
        target = busy()
        assert target is not None and target.startswith("vllm")
        assert http.put(f"/admin/backends/{target}/drain", json={"draining": True}).status_code == 200
        before = _requests_by_backend(sims)[target]
        bodies = [_chat(f"during drain {i}") for i in range(60)]
        responses = asyncio.run(_send_many(gateway, bodies, headers={**ADMIN, "x-gateway-pool": "vllm"}))
        _all_answered(responses, gateway)
        assert _requests_by_backend(sims)[target] == before, "a drained backend received a new request"
        t.join(30)
        assert result["text"].rstrip().endswith("data: [DONE]") and '"error"' not in result["text"]
        http.put(f"/admin/backends/{target}/drain", json={"draining": False})


# -- pins and rules -----------------------------------------------------------------------------------
def test_pin_is_for_admins_only_and_rules_are_obeyed(gateway: GatewayProcess) -> None:
    with httpx.Client(base_url=gateway.base_url, timeout=HTTP_TIMEOUT_S) as http:
        for i in range(6):
            r = http.post(
                "/v1/chat/completions", json=_chat(f"pin {i}"), headers={**ADMIN, "x-gateway-pool": "sglang"}
            )
            assert r.headers["x-gateway-pool"] == "sglang" and r.headers["x-gateway-route"].startswith("pin")
        user_pools = set()
        for i in range(40):
            r = http.post(
                "/v1/chat/completions",
                json=_chat(f"user pin {i}"),
                headers={**USER, "x-gateway-pool": "sglang"},
            )
            assert not r.headers["x-gateway-route"].startswith("pin")
            user_pools.add(r.headers["x-gateway-pool"])
        assert user_pools == {"vllm", "sglang"}, "a user's pin header must be ignored"
        r = http.post("/v1/chat/completions", json=_chat("use a tool", tools=[_TOOL]), headers=USER)
        assert r.headers["x-gateway-pool"] == "sglang" and r.headers["x-gateway-route"].startswith(
            "rule:tools"
        )
        long_text = "lorem ipsum dolor sit amet " * 300
        r = http.post("/v1/chat/completions", json=_chat(long_text), headers=USER)
        assert r.status_code == 200, r.text
        assert r.headers["x-gateway-pool"] == "sglang" and r.headers["x-gateway-route"].startswith(
            "rule:long-prompt"
        )


# -- affinity and balance -----------------------------------------------------------------------------
def _backend_of(sims: dict[str, list[SimProcess]], marker: str) -> str:
    for engine, ss in sims.items():
        for i, s in enumerate(ss):
            for rec in HTTP.get(s.base_url + "/sim/requests", timeout=5).json()["requests"]:
                if marker in str(rec.get("body")):
                    return f"{engine}-{i}"
    raise AssertionError(f"no simulator received {marker!r}")


def test_conversation_turns_stick_to_one_backend_across_replicas(
    urls: dict[str, list[str]], sims: dict[str, list[SimProcess]], redis_url: str
) -> None:
    config = fleet_config(urls)
    config["redis"] = {"url": redis_url}
    with (
        GatewayProcess(dict(config), env=ENV) as a,
        GatewayProcess(fleet_config(urls) | {"redis": {"url": redis_url}}, env=ENV) as b,
    ):
        for conv in range(4):
            messages: list[dict[str, str]] = [
                {"role": "system", "content": "You are a helpful assistant. " * 20},
                {"role": "user", "content": f"conversation {conv}: first question"},
            ]
            homes: set[str] = set()
            routes: list[str] = []
            for turn in range(4):
                replica = (a, b)[turn % 2]
                marker = f"marker-{conv}-{turn}"
                messages.append({"role": "user", "content": marker})
                r = HTTP.post(
                    replica.base_url + "/v1/chat/completions",
                    json={"model": MODEL, "messages": messages, "max_tokens": 4},
                    headers=USER,
                    timeout=HTTP_TIMEOUT_S,
                )
                assert r.status_code == 200
                messages.append(
                    {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}
                )
                homes.add(_backend_of(sims, marker))
                routes.append(r.headers["x-gateway-route"])
            assert len(homes) == 1, f"conversation {conv} moved between backends: {homes} (routes {routes})"


def test_uniform_traffic_is_balanced(gateway: GatewayProcess, sims: dict[str, list[SimProcess]]) -> None:
    before = _requests_by_backend(sims)
    bodies = [_chat(f"uniform {i} {i * 104729 % 99991}") for i in range(800)]
    responses = asyncio.run(_send_many(gateway, bodies))
    _all_answered(responses, gateway)
    after = _requests_by_backend(sims)
    per_pool = Counter(r.headers["x-gateway-pool"] for r in responses)
    for engine in ("vllm", "sglang"):
        fair = per_pool[engine] / 2
        for i in range(2):
            got = after[f"{engine}-{i}"] - before[f"{engine}-{i}"]
            assert got <= 1.2 * fair, f"{engine}-{i} got {got} of {per_pool[engine]} (fair {fair})"


# -- replicas -----------------------------------------------------------------------------------------
def _weight(gw: GatewayProcess, pool: str) -> float:
    pools = HTTP.get(gw.base_url + "/admin/pools", headers=ADMIN, timeout=5).json()["pools"]
    return float(next(p["weight"] for p in pools if p["name"] == pool))


def test_three_replicas_converge_within_a_second_and_after_restart(
    urls: dict[str, list[str]], redis_url: str
) -> None:
    def config() -> dict[str, Any]:
        c = fleet_config(urls)
        c["redis"] = {"url": redis_url}
        return c

    with (
        GatewayProcess(config(), env=ENV) as a,
        GatewayProcess(config(), env=ENV) as b,
        GatewayProcess(config(), env=ENV) as c,
    ):
        r = HTTP.put(
            a.base_url + "/admin/pools/vllm/weight", json={"weight": 0.123}, headers=ADMIN, timeout=5
        )
        assert (r.json()["ok"], r.json()["shared"], r.json()["persisted"]) == (True, True, True)
        wait_until(
            lambda: _weight(b, "vllm") == 0.123 and _weight(c, "vllm") == 0.123, what="replicas to converge"
        )
        HTTP.put(
            b.base_url + "/admin/backends/sglang-1/drain", json={"draining": True}, headers=ADMIN, timeout=5
        )
        c.stop()
        with GatewayProcess(config(), env=ENV) as c2:
            assert _weight(c2, "vllm") == 0.123
            pools = HTTP.get(c2.base_url + "/admin/pools", headers=ADMIN, timeout=5).json()["pools"]
            drained = {b["name"] for p in pools for b in p["backends"] if b["draining"]}
            assert drained == {"sglang-1"}
        # leave the shared state clean for other tests
        HTTP.put(
            a.base_url + "/admin/backends/sglang-1/drain", json={"draining": False}, headers=ADMIN, timeout=5
        )
        HTTP.put(a.base_url + "/admin/pools/vllm/weight", json={"weight": 0.5}, headers=ADMIN, timeout=5)


def test_add_and_remove_backend(gateway: GatewayProcess, urls: dict[str, list[str]]) -> None:
    with (
        fast_sim("vllm") as extra,
        httpx.Client(base_url=gateway.base_url, timeout=HTTP_TIMEOUT_S, headers=ADMIN) as http,
    ):
        r = http.post("/admin/pools/vllm/backends", json={"name": "vllm-extra", "url": extra.base_url})
        assert r.status_code == 201
        assert (
            http.post(
                "/admin/pools/vllm/backends", json={"name": "vllm-extra", "url": extra.base_url}
            ).status_code
            == 409
        )
        assert (
            http.post(
                "/admin/pools/vllm/backends", json={"name": "bad name!", "url": extra.base_url}
            ).status_code
            == 400
        )
        names = {b["name"] for p in http.get("/admin/pools").json()["pools"] for b in p["backends"]}
        assert "vllm-extra" in names
        assert http.delete("/admin/backends/vllm-extra").status_code == 200
        names = {b["name"] for p in http.get("/admin/pools").json()["pools"] for b in p["backends"]}
        assert "vllm-extra" not in names
        assert http.delete("/admin/backends/vllm-extra").status_code == 404


def test_api_keys_created_shown_once_used_and_revoked(gateway: GatewayProcess) -> None:
    with httpx.Client(base_url=gateway.base_url, timeout=HTTP_TIMEOUT_S, headers=ADMIN) as http:
        created = http.post("/admin/api-keys", json={"user": "sdk-user", "tier": "default", "name": "ci"})
        assert created.status_code == 201, created.text
        key = created.json()["key"]
        key_id = created.json()["id"]
        assert key.startswith("sk-gw-")
        listed = http.get("/admin/api-keys").text
        assert key_id in listed and key not in listed, "the plaintext key is shown once, at creation"
        client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key=key, max_retries=0)
        assert client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert http.delete(f"/admin/api-keys/{key_id}").status_code == 200
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
        assert http.delete(f"/admin/api-keys/{key_id}").status_code == 404
        actions = [e["action"] for e in http.get("/admin/audit").json()["entries"]]
        assert actions[:2] == ["revoke_api_key", "create_api_key"]
