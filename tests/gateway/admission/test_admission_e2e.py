"""Admission end to end: real gateway processes, real simulators, a real redis-server.

- exactness: 4 gateways sharing one Redis, 400 concurrent requests of one user limited to 100/min
  → exactly 100 admitted, 300 refused with OpenAI's 429 and a true `retry-after`;
- tokens/min across the 4 gateways, with the reconciliation visible in Redis and in the headers;
- concurrency slots freed on client disconnect and, after a replica is killed, by lease expiry;
- Redis stopped mid-test → `fail_open` serves from the local limiter, `fail_closed` answers 503;
  Redis back → shared limits again without a restart;
- the hostile-token catalogue over HTTP on chat and on `/v1/models*` (401 each, never 5xx, no model
  named) and JWKS rotation without restart.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import openai
import orjson
import pytest
import redis as redis_sync

from engines.sim.launcher import SimProcess
from gateway.admission.jwks import MIN_REFRESH_S
from gateway.admission.limits_redis import LEASE_S
from gateway.admission.tokens import mint_token
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.gateway.admission.jwt_support import JwksServer, Keys, hostile_catalogue
from tests.support import HTTP, GatewayProcess, RedisServer, wait_until

pytestmark = pytest.mark.processes

SECRET = "e2e-secret-" + "k" * 64
TPM = 2000
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Say hello to the sea, please."}],
    "max_tokens": 1,
}


def auth_header(user: str, tier: str | None = None) -> dict[str, str]:
    return {"authorization": f"Bearer {mint_token(SECRET, user, tier=tier)}"}


def limits_config(urls: list[str], redis_url: str | None, **limits: Any) -> dict[str, Any]:
    base_limits: dict[str, Any] = {
        "tiers": {
            "default": {"requests_per_minute": 100},
            "tok": {"tokens_per_minute": TPM},
            "conc": {"concurrent_requests": 1},
        },
    }
    base_limits.update(limits)
    cfg = single_pool_config("vllm", urls, auth={"jwt": {"secret": SECRET}}, limits=base_limits)
    if redis_url is not None:
        cfg["redis"] = {"url": redis_url}
    return cfg


def start_all(gateways: list[GatewayProcess]) -> None:
    with concurrent.futures.ThreadPoolExecutor(len(gateways)) as pool:
        list(pool.map(lambda g: g.start(), gateways))


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    # 10 ms between tokens: `max_tokens: 1` answers at once, a long stream lasts long enough to hold
    with fast_sim("vllm", "--itl-ms", "10") as s:
        yield s


@pytest.fixture(scope="module")
def four(sim: SimProcess, redis_server: RedisServer) -> Iterator[list[GatewayProcess]]:
    redis_sync.Redis.from_url(redis_server.url).flushdb()
    gateways = [GatewayProcess(limits_config([sim.base_url], redis_server.url)) for _ in range(4)]
    try:
        start_all(gateways)
        yield gateways
    finally:
        for g in gateways:
            g.stop()


class Answer:
    """One burst response (status, headers, JSON body)."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status_code = status
        self.headers = {k.lower(): v for k, v in headers.items()}
        self._body = body

    def json(self) -> Any:
        return orjson.loads(self._body)


async def _burst(
    gateways: list[GatewayProcess], headers: dict[str, str], n: int, body: dict[str, Any]
) -> list[Answer]:
    """`n` requests in flight at once, spread over `gateways` (aiohttp: httpx's pool is too slow
    with hundreds of connections, and a slow client would not make the requests concurrent)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(i: int) -> Answer:
            url = gateways[i % len(gateways)].base_url + "/v1/chat/completions"
            async with session.post(url, json=body, headers=headers) as r:
                return Answer(r.status, dict(r.headers), await r.read())

        return list(await asyncio.gather(*(one(i) for i in range(n))))


def test_exact_across_four_gateways(four: list[GatewayProcess]) -> None:
    responses = asyncio.run(_burst(four, auth_header("exact-user"), 400, CHAT))
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == 100, {s: statuses.count(s) for s in set(statuses)}
    assert statuses.count(429) == 300
    for r in responses:
        assert r.headers["x-ratelimit-limit-requests"] == "100"
        assert re.fullmatch(r"(\d+m)?\d+(\.\d+)?m?s", r.headers["x-ratelimit-reset-requests"])
        if r.status_code == 429:
            err = r.json()["error"]
            assert (err["type"], err["code"], err["param"]) == ("requests", "rate_limit_exceeded", None)
            assert (
                "Limit 100, Used 100, Requested 1" in err["message"]
                and "requests per min (RPM)" in err["message"]
            )
            # the first admission leaves the window 60 s after it happened: that is the true wait (to
            # the millisecond on a clock the test moves: tests/gateway/admission/test_limits_local.py)
            retry = int(r.headers["retry-after"])
            assert 1 <= retry <= 60, retry
            assert 0 < int(r.headers["retry-after-ms"]) <= 60_000
            assert r.headers["x-ratelimit-remaining-requests"] == "0"
    remaining = sorted(
        int(r.headers["x-ratelimit-remaining-requests"]) for r in responses if r.status_code == 200
    )
    assert remaining == list(range(100))  # every admission saw a distinct count: one atomic sequence


def test_sdk_sees_rate_limit_and_auth_errors(four: list[GatewayProcess]) -> None:
    client = openai.OpenAI(
        base_url=four[0].base_url + "/v1", api_key=mint_token(SECRET, "exact-user"), max_retries=0
    )
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(**CHAT)
    assert info.value.status_code == 429
    bad = openai.OpenAI(base_url=four[0].base_url + "/v1", api_key="sk-gw-nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(**CHAT)


def test_tokens_per_minute_with_visible_reconciliation(
    four: list[GatewayProcess], redis_server: RedisServer
) -> None:
    r = redis_sync.Redis.from_url(redis_server.url)
    headers = auth_header("tok-user", tier="tok")
    body = {**CHAT, "max_tokens": 300}
    sum_key = "gw:rl:{u:tok-user}:u:sum"
    first = HTTP.post(four[0].base_url + "/v1/chat/completions", json=body, headers=headers)
    assert first.status_code == 200, first.text
    reserved = TPM - int(first.headers["x-ratelimit-remaining-tokens"])
    used = first.json()["usage"]["total_tokens"]
    assert used < reserved  # the sim stopped early: the reservation was generous
    # the finalizer replaces the reservation by the real usage once the response has ended
    wait_until(lambda: int(r.get(sum_key) or 0) == used, 5, what="token reconciliation")
    second = HTTP.post(four[1].base_url + "/v1/chat/completions", json=body, headers=headers)
    assert second.status_code == 200
    assert int(second.headers["x-ratelimit-remaining-tokens"]) == TPM - used - reserved
    # a burst over all four gateways: whatever was admitted, never more than the limit was counted
    responses = asyncio.run(_burst(four, headers, 40, body))
    refused = [x for x in responses if x.status_code == 429]
    assert refused and any(x.status_code == 200 for x in responses)
    for x in refused:
        err = x.json()["error"]
        assert (err["type"], err["code"]) == ("tokens", "rate_limit_exceeded")
        m = re.search(
            r"Limit (\d+), Used (\d+), Requested (\d+)\. Please try again in (\S+)\.", err["message"]
        )
        assert m is not None, err["message"]
        limit, was_used, requested = (int(g) for g in m.groups()[:3])
        assert limit == TPM and was_used + requested > limit  # refused only when it truly did not fit
        assert int(x.headers["retry-after"]) >= 1
    wait_until(lambda: int(r.get(sum_key) or 0) <= TPM, 5, what="reconciled burst")
    assert int(r.get(sum_key) or 0) <= TPM


def test_tokens_per_minute_count_every_prompt_of_a_batch(
    four: list[GatewayProcess], redis_server: RedisServer
) -> None:
    """A completions batch runs one engine request per prompt: its reservation holds every prompt's
    tokens and `max_tokens` for each, and the reconciliation counts the whole batch's usage."""
    r = redis_sync.Redis.from_url(redis_server.url)

    def client(user: str) -> openai.OpenAI:
        key = mint_token(SECRET, user, tier="tok")
        return openai.OpenAI(base_url=four[2].base_url + "/v1", api_key=key, max_retries=0)

    prompts = ["Say hello to the sea.", "Say hello to the hills, please.", "And to the sky above them."]
    raw = client("batch-user").completions.with_raw_response.create(
        model=MODEL, prompt=prompts, max_tokens=40
    )
    done = raw.parse()
    assert sorted(c.index for c in done.choices) == [0, 1, 2]
    assert done.usage is not None
    reserved = TPM - int(raw.headers["x-ratelimit-remaining-tokens"])
    assert reserved >= 3 * 40 + done.usage.prompt_tokens // 2, reserved  # all three outputs, every prompt
    wait_until(
        lambda: int(r.get("gw:rl:{u:batch-user}:u:sum") or 0) == done.usage.total_tokens,  # type: ignore[union-attr]
        5,
        what="the batch's reconciliation",
    )
    one = client("single-user").completions.create(model=MODEL, prompt=prompts[0], max_tokens=40)
    assert one.usage is not None and one.usage.prompt_tokens < done.usage.prompt_tokens
    # 3 x 700 output tokens do not fit 2,000 a minute, one prompt's 700 do; the refusal costs nothing
    big = client("big-user")
    with pytest.raises(openai.RateLimitError) as info:
        big.completions.create(model=MODEL, prompt=prompts, max_tokens=700)
    m = re.search(r"Requested (\d+)", str(info.value))
    assert m is not None and int(m.group(1)) >= 3 * 700, str(info.value)
    assert int(r.get("gw:rl:{u:big-user}:u:sum") or 0) == 0
    assert big.completions.create(model=MODEL, prompt=prompts[0], max_tokens=700).choices


def _open_stream(base_url: str, headers: dict[str, str]) -> tuple[httpx.Client, Iterator[bytes]]:
    client = httpx.Client(timeout=30)
    body = {**CHAT, "max_tokens": 3000, "stream": True, "ignore_eos": True}
    req = client.build_request("POST", base_url + "/v1/chat/completions", json=body, headers=headers)
    resp = client.send(req, stream=True)
    assert resp.status_code == 200, resp.read()
    chunks = resp.iter_raw()
    next(chunks)  # the stream is running: the slot is held (keep `chunks` alive: dropping it closes)
    return client, chunks


def _status(base_url: str, headers: dict[str, str]) -> int:
    return HTTP.post(base_url + "/v1/chat/completions", json=CHAT, headers=headers).status_code


def test_concurrency_slot_freed_on_client_disconnect(four: list[GatewayProcess]) -> None:
    headers = auth_header("conc-user", tier="conc")
    client, chunks = _open_stream(four[0].base_url, headers)
    refused = HTTP.post(four[1].base_url + "/v1/chat/completions", json=CHAT, headers=headers)
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "requests"
    assert "concurrent requests" in refused.json()["error"]["message"]
    next(chunks)  # still streaming
    client.close()  # the client goes away mid-stream
    wait_until(lambda: _status(four[2].base_url, headers) == 200, 10, what="slot freed after disconnect")


def test_concurrency_slot_of_a_killed_replica_expires(four: list[GatewayProcess]) -> None:
    """Runs after the other tests of `four`: it kills one of them."""
    headers = auth_header("kill-user", tier="conc")
    doomed, survivor = four[3], four[0]
    client, _chunks = _open_stream(doomed.base_url, headers)
    assert doomed.proc is not None
    doomed.proc.kill()  # SIGKILL: no finalizer, no release — only the lease can free the slot
    doomed.proc.wait(5)
    client.close()
    assert _status(survivor.base_url, headers) == 429  # the lease still holds the slot
    wait_until(lambda: _status(survivor.base_url, headers) == 200, LEASE_S * 2, what="lease expiry")


def _metric(base_url: str, name: str) -> float:
    text = HTTP.get(base_url + "/metrics", timeout=5).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_redis_outage_fail_open_and_fail_closed_then_recovery(sim: SimProcess) -> None:
    own = RedisServer().start()
    opened = GatewayProcess(limits_config([sim.base_url], own.url, on_redis_error="fail_open"))
    closed = GatewayProcess(limits_config([sim.base_url], own.url, on_redis_error="fail_closed"))
    start_all([opened, closed])
    r = redis_sync.Redis.from_url(own.url)
    headers = auth_header("outage-user")
    try:
        for g in (opened, closed):
            assert _status(g.base_url, headers) == 200
        assert r.zcard("gw:rl:{u:outage-user}:u:req") == 2
        own.stop()  # Redis gone mid-test
        for _ in range(3):
            assert _status(opened.base_url, headers) == 200  # the local limiter took over
        down = HTTP.post(closed.base_url + "/v1/chat/completions", json=CHAT, headers=headers)
        assert down.status_code == 503, down.text  # an outage is not the client's rate limit
        assert down.json()["error"]["code"] == "rate_limiter_unavailable"
        assert _metric(opened.base_url, "gateway_limiter_local_decisions_total") >= 3
        assert _metric(opened.base_url, "gateway_limiter_redis_down") == 1
        # Redis back on the same port, empty: both gateways share it again without a restart
        own = RedisServer(port=own.port).start()
        back = time.monotonic()
        r = redis_sync.Redis.from_url(own.url)
        wait_until(lambda: _status(closed.base_url, headers) == 200, 5, what="fail_closed recovery")
        recovered_s = time.monotonic() - back
        wait_until(
            lambda: _metric(opened.base_url, "gateway_limiter_redis_down") == 0, 5, what="fail_open recovery"
        )
        assert _status(opened.base_url, headers) == 200
        assert r.zcard("gw:rl:{u:outage-user}:u:req") == 2  # both counted in Redis again
        print(f"fail_closed gateway recovered {recovered_s:.2f} s after Redis came back")
    finally:
        opened.stop()
        closed.stop()
        own.stop()


def _raw_post(port: int, authorization: bytes | None) -> tuple[int, bytes]:
    """POST CHAT with the Authorization header sent byte for byte (clients refuse some of these)."""
    return _raw(port, b"POST", b"/v1/chat/completions", authorization, orjson.dumps(CHAT))


def _raw(
    port: int, method: bytes, path: bytes, authorization: bytes | None, body: bytes = b""
) -> tuple[int, bytes]:
    """One request with the Authorization header sent byte for byte; (status, body)."""
    head = method + b" " + path + b" HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
    if authorization is not None:
        head += b"authorization: " + authorization + b"\r\n"
    head += b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def test_hostile_tokens_over_http_and_jwks_rotation(sim: SimProcess) -> None:
    keys = Keys()
    with JwksServer() as jwks:
        jwks.set_keys(Keys.jwk(keys.rsa, "rsa-1"), Keys.jwk(keys.ec, "ec-1"), Keys.jwk(keys.ed, "ed-1"))
        cfg = single_pool_config(
            "vllm",
            [sim.base_url],
            auth={
                "jwt": {
                    "secret": SECRET,
                    "jwks_url": jwks.url,
                    "algorithms": ["RS256", "ES256", "EdDSA"],
                }
            },
        )
        with GatewayProcess(cfg) as gw, httpx.Client(base_url=gw.base_url, timeout=30) as http:
            ok = http.post(
                "/v1/chat/completions",
                json=CHAT,
                headers={"authorization": "Bearer " + Keys.sign(keys.ec, "ES256", "ec-1")},
            )
            assert ok.status_code == 200, ok.text
            good = {"authorization": "Bearer " + Keys.sign(keys.ec, "ES256", "ec-1")}
            listed = http.get("/v1/models", headers=good)
            assert listed.status_code == 200 and [m["id"] for m in listed.json()["data"]] == [MODEL]
            assert http.get(f"/v1/models/{MODEL}", headers=good).json()["id"] == MODEL
            assert http.get("/v1/models/nope", headers=good).json()["error"]["code"] == "model_not_found"
            jwks.down = True
            catalogue = hostile_catalogue(keys, SECRET)
            model_path = f"/v1/models/{MODEL}".encode()
            for name, header in catalogue:
                status, body = _raw_post(gw.port, header)
                assert status == 401, (name, status, body)
                assert orjson.loads(body)["error"]["code"] in ("invalid_api_key", None)
                # the model inventory answers strangers no more than chat does
                for path in (b"/v1/models", model_path, b"/v1/models/no-such-model"):
                    status, body = _raw(gw.port, b"GET", path, header)
                    assert status == 401, (name, path, status, body)
                    error = orjson.loads(body)["error"]
                    assert (
                        error["code"] in ("invalid_api_key", None)
                        and error["type"] == "invalid_request_error"
                    )
                    assert MODEL.encode() not in body, (name, path, body)
            # rotation: the provider publishes a new key; the running gateway accepts it
            jwks.down = False
            # (an unknown kid refetches the keys at most every MIN_REFRESH_S: the catalogue's kids
            # may have just done so)
            jwks.set_keys(Keys.jwk(keys.rsa2, "rsa-2", "RS256"))
            rotated = {"authorization": "Bearer " + Keys.sign(keys.rsa2, "RS256", "rsa-2")}
            wait_until(
                lambda: http.post("/v1/chat/completions", json=CHAT, headers=rotated).status_code == 200,
                MIN_REFRESH_S + 5,
                "the rotated key accepted",
            )
            metrics = http.get("/metrics").text
            assert 'gateway_rejections_total{reason="expired",stage="auth"}' in metrics
