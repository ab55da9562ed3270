"""The attack matrix: admin access, leaks, logs, request smuggling, oversized and slow heads, injection.

One gateway (auth on, Redis for API keys, short head timeout) in front of a vLLM simulator and an
SGLang simulator, plus a third backend address nobody listens on (so "connection refused" errors
are in the battery too).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jwt
import orjson
import pytest
from redis.asyncio import Redis

from engines.sim.launcher import SimProcess
from gateway.admission.api_keys import ApiKeys, ApiKeySpec, RedisBackend
from gateway.demo import SERVED
from gateway.edge.http_guard import HEADER_TIMEOUT_S
from tests.conftest import MODEL, fast_sim
from tests.reliability.support import SECRET, RawClient, bearer, chat, http_request, sim_stats, token
from tests.support import HTTP, GatewayProcess, RedisServer, free_port

pytestmark = pytest.mark.processes

CANARY = "CANARY-7f3a9c-the-users-private-prompt"
SAFE_RID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class Target:
    def __init__(self, gw: GatewayProcess, sims: list[SimProcess], dead_port: int, api_key: str) -> None:
        self.gw = gw
        self.sims = sims
        self.dead_port = dead_port
        self.api_key = api_key
        self.url = gw.base_url
        self.tokens = {
            "none": None,
            "user": token("mallory"),
            "expired": token("root", admin=True, now=time.time() - 7200, ttl_s=60),
            "admin": token("root", admin=True),
            "forged": jwt.encode(
                {"sub": "root", "roles": ["admin"], "iss": "llm-gateway", "aud": "llm-gateway", "exp": 2**31},
                "not-the-secret-" + "y" * 24,
                algorithm="HS256",
            ),
            "alg_none": jwt.encode(
                {"sub": "root", "roles": ["admin"], "iss": "llm-gateway", "aud": "llm-gateway", "exp": 2**31},
                None,
                algorithm="none",
            ),
        }

    def secrets(self) -> list[str]:
        """Strings that must never appear in a response or in the log."""
        out = [SECRET, self.api_key]
        out += [t for t in self.tokens.values() if t]
        return out

    def addresses(self) -> list[str]:
        ports = [s.port for s in self.sims] + [self.dead_port]
        return [f":{p}" for p in ports] + [f"127.0.0.1:{p}" for p in ports]


async def _create_key(redis_url: str) -> str:
    redis = Redis.from_url(redis_url)
    try:
        keys = ApiKeys(RedisBackend(redis))
        _, plaintext = await keys.create(ApiKeySpec(user="sdk-user", name="security-suite"))
        return plaintext
    finally:
        await redis.aclose()


@pytest.fixture(scope="module")
def target(redis_server: RedisServer) -> Iterator[Target]:
    vllm, sglang = fast_sim("vllm"), fast_sim("sglang")
    dead_port = free_port()
    with vllm, sglang:
        config: dict[str, Any] = {
            "server": {
                "graceful_shutdown_s": 1,
                "max_body_bytes": 65536,
            },
            "models": [{"name": MODEL, "context_length": 8192}],
            "pools": [
                {
                    "name": "vllm",
                    "dialect": "vllm",
                    "models": {MODEL: SERVED["vllm"]},
                    "backends": [
                        {"name": "vllm-0", "url": vllm.base_url},
                        {"name": "vllm-dead", "url": f"http://127.0.0.1:{dead_port}"},
                    ],
                },
                {
                    "name": "sglang",
                    "dialect": "sglang",
                    "models": {MODEL: SERVED["sglang"]},
                    "backends": [{"name": "sglang-0", "url": sglang.base_url}],
                },
            ],
            "upstream": {"health": {"interval_s": 3600, "failure_threshold": 1000}},
            "routing": {"scrape_interval_s": 0, "policy": "round_robin"},
            "redis": {"url": redis_server.url},
            "auth": {"jwt": {"secret": SECRET}},
        }
        api_key = asyncio.run(_create_key(redis_server.url))
        with GatewayProcess(config) as gw:
            yield Target(gw, [vllm, sglang], dead_port, api_key)


def _assert_clean(t: Target, r: httpx.Response, *, admin_view: bool = False) -> None:
    """No secret, no stack trace, no backend address in the body or the headers."""
    blob = r.text + "\n" + "\n".join(f"{k}: {v}" for k, v in r.headers.items())
    for s in t.secrets():
        assert s not in blob, f"secret leaked in {r.request.method} {r.request.url}: {blob[:300]}"
    assert "Traceback" not in blob and 'File "/' not in blob, blob[:500]
    if not admin_view:
        for a in t.addresses():
            assert a not in blob, f"backend address {a} in {r.request.url}: {blob[:300]}"
    rid = r.headers.get("x-request-id")
    if rid is not None:
        assert SAFE_RID.match(rid), rid
    if r.status_code >= 400 and r.headers.get("content-type", "").startswith("application/json"):
        body = r.json()
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body


# -- the admin matrix -----------------------------------------------------------------------------


def _admin_operations() -> list[tuple[str, str]]:
    from gateway.app import Gateway
    from gateway.settings import parse_settings

    s = parse_settings(
        {"models": [{"name": MODEL}], "pools": [{"name": "p", "dialect": "vllm", "models": {MODEL: "x"}}]}, {}
    )
    doc = Gateway(s)._admin_app.openapi()
    return [
        (method.upper(), path)
        for path, item in doc["paths"].items()
        if path.startswith("/admin/")
        for method in item
    ]


_BODIES: dict[tuple[str, str], Any] = {
    ("PUT", "/admin/pools/{pool}/weight"): {"weight": 1.0},
    ("POST", "/admin/pools/{pool}/backends"): {"name": "sec-added", "url": "http://127.0.0.1:9"},
    ("PUT", "/admin/backends/{name}/drain"): {"draining": False},
    ("GET", "/admin/routes/explain"): chat(),
    ("POST", "/admin/routes/explain"): chat(),
}


@pytest.mark.parametrize("who", ["none", "user", "expired", "forged", "alg_none", "admin"])
@pytest.mark.parametrize("method,path", _admin_operations())
def test_admin_matrix(target: Target, method: str, path: str, who: str) -> None:
    # Harmless targets: the real pool for weight/add, a backend name that does not exist otherwise.
    url = path.replace("{pool}", "vllm").replace("{name}", "no-such-backend")
    tok = target.tokens[who]
    headers = bearer(tok) if tok else {}
    body = _BODIES.get((method, path))
    r = HTTP.request(
        method,
        target.url + url,
        headers=headers,
        content=orjson.dumps(body) if body is not None else None,
        timeout=10,
    )
    _assert_clean(target, r, admin_view=who == "admin")
    expected = {"none": 401, "user": 403, "expired": 401, "forged": 401, "alg_none": 401}
    if who in expected:
        assert r.status_code == expected[who], (who, r.status_code, r.text)
        assert "pools" not in r.json() and "entries" not in r.json()
    else:
        assert r.status_code < 500 and r.status_code not in (401, 403), (r.status_code, r.text)
    if (method, path) == ("POST", "/admin/pools/{pool}/backends") and r.status_code == 201:
        HTTP.delete(target.url + "/admin/backends/sec-added", headers=headers, timeout=10)


@pytest.mark.parametrize(
    "path",
    [
        "/admin/pools/",
        "//admin/pools",
        "/ADMIN/pools",
        "/admin//pools",
        "/v1/../admin/pools",
        "/admin/./pools",
        "/admin/%70ools",
        "/admin/pools%00",
        "/admin/pools?x=/v1/models",
        "/docs/../admin/pools",
    ],
)
def test_admin_paths_cannot_be_reached_sideways(target: Target, path: str) -> None:
    # A raw request line, exactly as written (no client-side normalisation).
    with RawClient(target.gw.port) as c:
        c.send(http_request(path, method="GET", headers=bearer(target.tokens["user"])))
        status, _, body = c.read_response()
    with RawClient(target.gw.port) as c:
        c.send(http_request(path, method="GET"))
        status_anon, _, body_anon = c.read_response()
    for st, b in ((status, body), (status_anon, body_anon)):
        # 307: FastAPI's trailing-slash redirect (to /admin/pools, which then asks for the admin role)
        assert st in (307, 400, 401, 403, 404, 405), (path, st, b[:200])
        assert b'"pools"' not in b and b"backends" not in b, (path, b[:200])


# -- leaks ----------------------------------------------------------------------------------------


def _battery(t: Target) -> list[tuple[str, str, dict[str, str], bytes | None]]:
    user, key = bearer(t.tokens["user"]), bearer(t.api_key)
    good = orjson.dumps(chat(content=CANARY))
    canary_chat = orjson.dumps({**chat(), "messages": [{"role": "user", "content": CANARY}]})
    return [
        ("POST", "/v1/chat/completions", {}, canary_chat),
        ("POST", "/v1/chat/completions", {"authorization": "Bearer garbage"}, canary_chat),
        ("POST", "/v1/chat/completions", {"authorization": "Basic dXNlcjpwYXNz"}, canary_chat),
        ("POST", "/v1/chat/completions", bearer(t.tokens["forged"]), canary_chat),
        ("POST", "/v1/chat/completions", bearer(t.tokens["alg_none"]), canary_chat),
        ("POST", "/v1/chat/completions", bearer(t.tokens["expired"]), canary_chat),
        ("POST", "/v1/chat/completions", bearer(t.api_key + "x"), canary_chat),
        ("POST", "/v1/chat/completions", bearer(t.api_key[:-4]), canary_chat),
        ("POST", "/v1/chat/completions", key, b"{not json " + CANARY.encode()),
        ("POST", "/v1/chat/completions", user, b'{"model": 5}'),
        ("POST", "/v1/chat/completions", user, orjson.dumps({**chat(), "model": CANARY + "<script>"})),
        ("POST", "/v1/chat/completions", user, orjson.dumps({**chat(), "temperature": CANARY})),
        ("POST", "/v1/chat/completions", user, orjson.dumps({**chat(), "max_tokens": 10**9})),
        (
            "POST",
            "/v1/chat/completions",
            user,
            orjson.dumps({**chat(), "tool_choice": {"type": "function", "function": {"name": CANARY}}}),
        ),
        ("POST", "/v1/chat/completions", user, b"[" * 5000 + b"]" * 5000),
        ("POST", "/v1/chat/completions", user, b'{"model":"test-model","messages":"' + b"a" * 70000 + b'"}'),
        (
            "POST",
            "/v1/completions",
            user,
            orjson.dumps({"model": MODEL, "prompt": CANARY, "max_tokens": 2, "echo": "yes"}),
        ),
        ("POST", "/v1/completions", key, orjson.dumps({"model": MODEL, "prompt": CANARY, "max_tokens": 2})),
        ("POST", "/v1/chat/completions", user, good),
        ("POST", "/v1/chat/completions", key, orjson.dumps({**chat(content=CANARY), "stream": True})),
        ("GET", "/v1/chat/completions", user, None),
        ("DELETE", "/v1/models", user, None),
        ("GET", "/v1/models/" + CANARY, user, None),
        ("GET", "/v1/models/%0d%0ax-injected:%20yes", user, None),
        ("GET", "/nope/" + CANARY, user, None),
        ("GET", "/metrics", {}, None),
        ("GET", "/openapi.json", {}, None),
        ("GET", "/docs", {}, None),
    ]


def test_no_secret_address_or_trace_in_any_response(target: Target) -> None:
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=target.url, timeout=15) as http:
        for method, path, headers, body in _battery(target):
            r = http.request(method, path, headers=headers, content=body)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            _assert_clean(target, r)
            assert "x-injected" not in r.headers
            assert r.status_code < 500 or r.status_code == 503, (path, r.status_code, r.text[:300])
        # Round robin puts every other request on the dead backend: failover hides it, and a run
        # of requests stays clean whichever backend it met.
        for i in range(6):
            r = http.post("/v1/chat/completions", json=chat(i), headers=bearer(target.tokens["user"]))
            assert r.status_code == 200, r.text
            _assert_clean(target, r)
    assert statuses.get(200, 0) >= 4 and statuses.get(401, 0) >= 7, statuses


def test_engine_errors_are_reshaped_without_internals(target: Target) -> None:
    sim = target.sims[0]
    with httpx.Client(base_url=target.url, timeout=15) as http:
        for kind in ("500", "context"):
            HTTP.post(sim.base_url + "/sim/faults", json={"fault_rate": 1, "fault_kind": kind}, timeout=5)
            try:
                for i in range(3):
                    r = http.post(
                        "/v1/chat/completions",
                        json=chat(i),
                        headers={**bearer(target.tokens["admin"]), "x-gateway-pool": "vllm"},
                    )
                    _assert_clean(target, r)
                    assert r.status_code in (400, 500, 503), r.text
            finally:
                HTTP.post(sim.base_url + "/sim/faults", json={"reset": True}, timeout=5)


def test_no_prompt_text_or_secret_in_default_logs(target: Target) -> None:
    test_no_secret_address_or_trace_in_any_response(target)
    log = target.gw.log()
    assert "request_id" in log, "the access log is on by default and was captured"
    assert CANARY not in log, [line for line in log.splitlines() if CANARY in line][:3]
    for s in target.secrets():
        assert s not in log
    assert "Traceback" not in log


# -- injection through echoed values -------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["abc<script>", "a" * 129, "ünïcode", "req_1 2", "x;y=1", "ok-id_1.2:3", "%0d%0aset-cookie:%20a=b"],
)
def test_request_id_is_echoed_only_when_safe(target: Target, value: str) -> None:
    with RawClient(target.gw.port) as c:
        c.send(
            http_request(
                "/v1/models", method="GET", headers={**bearer(target.tokens["user"]), "x-request-id": value}
            ).replace(b"\xc3\xbc", b"\xfc")
        )
        status, headers, _ = c.read_response()
    assert status == 200
    rid = headers["x-request-id"]
    assert SAFE_RID.match(rid)
    assert (rid == value) == bool(SAFE_RID.match(value))
    assert "set-cookie" not in headers


def test_pool_pin_header_is_ignored_for_users_and_never_reflected(target: Target) -> None:
    with httpx.Client(base_url=target.url, timeout=15) as http:
        for pin in ("sglang", "nope", "vllm;x=1", "<b>x</b>", "a" * 300):
            r = http.post(
                "/v1/chat/completions",
                json=chat(),
                headers={**bearer(target.tokens["user"]), "x-gateway-pool": pin},
            )
            assert r.status_code == 200, r.text
            assert r.headers["x-gateway-pool"] in ("vllm", "sglang")
            assert "pin" not in r.headers["x-gateway-route"]
            _assert_clean(target, r)
            r = http.post(
                "/v1/chat/completions",
                json=chat(),
                headers={**bearer(target.tokens["admin"]), "x-gateway-pool": pin},
            )
            if pin == "sglang":
                assert r.status_code == 200 and r.headers["x-gateway-pool"] == "sglang"
            else:
                assert r.status_code in (400, 404), r.text
                assert pin not in "".join(r.headers.values())
            _assert_clean(target, r, admin_view=True)


# -- HTTP framing: smuggling, oversized heads, slow heads ------------------------------------------

_BODY = orjson.dumps(chat())
_SMUGGLED = b"GET /admin/pools HTTP/1.1\r\nhost: x\r\n\r\n"


@pytest.mark.parametrize(
    "head",
    [
        b"content-length: %d\r\ntransfer-encoding: chunked\r\n" % len(_BODY),
        b"transfer-encoding: chunked\r\ncontent-length: %d\r\n" % len(_BODY),
        b"content-length: 5\r\ncontent-length: %d\r\n" % len(_BODY),
        b"content-length: %d, 5\r\n" % len(_BODY),
        b"transfer-encoding: xchunked\r\ncontent-length: %d\r\n" % len(_BODY),
        b"transfer-encoding : chunked\r\n",
        b"transfer-encoding: chunked\r\ntransfer-encoding: identity\r\n",
        b"content-length: -1\r\n",
        b"content-length: +%d\r\n" % len(_BODY),
    ],
)
def test_conflicting_framing_is_refused_and_nothing_is_smuggled(target: Target, head: bytes) -> None:
    before = sum(sim_stats(s.base_url)["requests_total"] for s in target.sims)
    auth = f"authorization: Bearer {target.tokens['admin']}\r\n".encode()
    raw = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" + auth + head + b"\r\n"
    raw += b"0\r\n\r\n" + _SMUGGLED + _BODY
    with RawClient(target.gw.port, timeout=3) as c:
        c.send(raw)
        data = c.read_until(b"\x00never\x00")
    assert data.startswith(b"HTTP/1.1 400"), data[:200]
    assert data.count(b"HTTP/1.1 ") == 1, data[:500]
    assert b'"pools"' not in data
    assert sum(sim_stats(s.base_url)["requests_total"] for s in target.sims) == before


@pytest.mark.parametrize(
    "extra,expected",
    [
        (b"x-big: " + b"a" * 16_000 + b"\r\n", 200),
        (b"x-big: " + b"a" * 1_000_000 + b"\r\n", 431),
        (b"".join(b"x-h%d: v\r\n" % i for i in range(20_000)), 431),
    ],
    ids=["16KB", "1MB", "20000-headers"],
)
def test_oversized_heads_are_refused(target: Target, extra: bytes, expected: int) -> None:
    raw = b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + extra + b"\r\n"
    with RawClient(target.gw.port, timeout=5) as c:
        with contextlib.suppress(OSError):  # the gateway may close while the client still sends
            c.send(raw)
        status, headers, body = c.read_response()
    assert status == expected, body[:200]
    if expected == 431:
        assert orjson.loads(body)["error"]["code"] == "headers_too_large"
        assert headers.get("connection") == "close"


def test_a_head_sent_while_the_gateway_was_stopped_is_answered_not_cut(target: Target) -> None:
    """A host that stops the gateway for longer than the head deadline (a busy machine, a paused
    container) must not cut the clients whose heads arrived meanwhile: the deadline then fires late,
    measuring the gateway's stall, before uvloop has read the sockets (gateway/edge/http_guard.py)."""
    assert target.gw.proc is not None
    pid = target.gw.proc.pid
    with RawClient(target.gw.port, timeout=HEADER_TIMEOUT_S + 10) as c:
        time.sleep(0.5)  # accepted by the idle gateway: its head deadline runs from here
        os.kill(pid, signal.SIGSTOP)
        try:
            c.send(http_request("/healthz", method="GET"))  # the kernel holds it for the stopped process
            time.sleep(HEADER_TIMEOUT_S + 1.5)  # the stall: longer than the head deadline
        finally:
            os.kill(pid, signal.SIGCONT)
        status, _, body = c.read_response()
    assert status == 200, body[:200]


def test_slow_and_silent_heads_are_cut_and_do_not_starve_others(target: Target) -> None:
    silent = [RawClient(target.gw.port, timeout=HEADER_TIMEOUT_S + 5) for _ in range(20)]
    dripping = RawClient(target.gw.port, timeout=HEADER_TIMEOUT_S + 5)
    opened = time.monotonic()
    try:
        # Meanwhile, ordinary requests are served at once.
        r = HTTP.get(target.url + "/v1/models", headers=bearer(target.tokens["user"]), timeout=5)
        assert r.status_code == 200
        cut_at = None
        drip = b"b" * int((HEADER_TIMEOUT_S + 3) / 0.1)  # more bytes than the deadline lets through
        for ch in b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-a: " + drip:
            try:
                dripping.send(bytes([ch]))
            except OSError:
                cut_at = time.monotonic() - opened
                break
            time.sleep(0.1)  # a slow client: a byte every 0.1 s
        assert cut_at is not None and cut_at < HEADER_TIMEOUT_S + 2.5, cut_at
        for c in silent:
            data = c.read_until(b"\x00never\x00")
            assert data.startswith(b"HTTP/1.1 408"), data[:100]
        assert time.monotonic() - opened < HEADER_TIMEOUT_S + 5
    finally:
        for c in [*silent, dripping]:
            c.close()
    # A kept-alive connection that starts a second request and stalls is cut as well.
    with RawClient(target.gw.port, timeout=HEADER_TIMEOUT_S + 5) as c:
        c.send(http_request("/healthz", method="GET"))
        status, _, _ = c.read_response()
        assert status == 200
        c.send(b"GET /healthz HTTP/1.1\r\nho")
        assert c.read_until(b"\x00never\x00").startswith(b"HTTP/1.1 408")
