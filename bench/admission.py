"""Micro-benchmark: gateway CPU added by the admission stages per request.

    python -m bench.admission [--n 5000]

Runs the real stages in one process on the same chat request, sequentially, and reports process CPU
per request (time.process_time: the Redis server's own CPU is another process and not counted):

    baseline     parse + validate (the proxy core's intake)
    admission    + authenticate (JWT, cache hit) + sanitise + admit (one EVALSHA on a real
                 redis-server: requests/min, tokens/min, concurrency, reconciled in the finalizer)
Plus the parts alone, a JWT cache miss (HS256 and RS256 verification) and the local limiter, and
what model access and budgets add over limits alone (`access_budgets_added_*`: a tier with an
allow- and a deny-list and three budgets — UTC day and month in money, a rolling hour in tokens —
checked and reconciled in the same round trips).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import jwt
import orjson
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.admission.access import ModelAccessRules
from gateway.admission.admit import AdmitStage
from gateway.admission.auth import AuthenticateStage, Authenticator
from gateway.admission.intake import ParseStage, ValidateStage
from gateway.admission.jwt_auth import JwtVerifier
from gateway.admission.limits import FailoverLimiter
from gateway.admission.limits_local import LocalLimiter
from gateway.admission.limits_redis import RedisLimiter
from gateway.admission.sanitise import SanitiseStage
from gateway.admission.settings import (
    BudgetSettings,
    JwtSettings,
    LimitSet,
    LimitsSettings,
    PublicKeySettings,
    SanitiseSettings,
)
from gateway.admission.tokens import mint_token
from gateway.core.context import RequestContext
from gateway.core.redis_client import open_redis
from gateway.core.redis_wire import RespClient
from gateway.core.settings import PriceSettings
from gateway.pipeline import run_finalizers
from gateway.settings import ModelSettings

SECRET = "bench-secret-" + "x" * 40
BODY = orjson.dumps(
    {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Answer briefly and precisely."},
            {"role": "user", "content": "Explain in two sentences why the sky is blue, for a ten-year-old."},
        ],
        "max_tokens": 128,
        "temperature": 0.7,
    }
)
MODELS = {"m": ModelSettings(name="m", context_length=8192)}
LIMITS = LimitsSettings(
    tiers={
        "default": LimitSet(requests_per_minute=10**9, tokens_per_minute=10**12, concurrent_requests=10**6)
    }
)
#: the same model with prices, and the same limits plus model access and budgets (never reached):
#: a UTC day and a UTC month in money, a rolling hour in tokens, and the spend ledgers they need
PRICED = {
    "m": ModelSettings(
        name="m", context_length=8192, price=PriceSettings(prompt=0.15, cached_prompt=0.075, completion=0.6)
    )
}
BUDGETED = LimitsSettings(
    tiers={
        "default": LimitSet(
            requests_per_minute=10**9,
            tokens_per_minute=10**12,
            concurrent_requests=10**6,
            allow_models=["m", "other"],
            deny_models=["forbidden"],
            budgets=[
                BudgetSettings(period="day", usd=10**6),
                BudgetSettings(period="month", usd=10**6),
                BudgetSettings(period="rolling", window_s=3600, tokens=10**12),
            ],
        )
    }
)

Stage = Callable[[RequestContext], Awaitable[Any]]


def _ctx(headers: dict[bytes, bytes]) -> RequestContext:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    return RequestContext(request_id="r", endpoint="chat", started=0.0, headers=headers, receive=receive)  # type: ignore[arg-type]


async def _cpu_per_request(stages: list[Stage], headers: dict[bytes, bytes], n: int) -> float:
    for _ in range(200):  # warm caches, connections, script load
        ctx = _ctx(headers)
        for s in stages:
            await s(ctx)
        await run_finalizers(ctx)
    t0 = time.process_time()
    for _ in range(n):
        ctx = _ctx(headers)
        for s in stages:
            await s(ctx)
        await run_finalizers(ctx)
    return (time.process_time() - t0) / n * 1e6


async def run(n: int, redis_url: str) -> dict[str, float]:
    token = mint_token(SECRET, "bench-user").encode()
    headers = {b"authorization": b"Bearer " + token, b"content-type": b"application/json"}
    auth = AuthenticateStage(Authenticator(JwtVerifier(JwtSettings(secret=SECRET)), None))
    no_cache = AuthenticateStage(Authenticator(JwtVerifier(JwtSettings(secret=SECRET), cache_size=0), None))
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = (
        key.public_key()
        .public_bytes(
            encoding=__import__(
                "cryptography.hazmat.primitives.serialization", fromlist=["Encoding"]
            ).Encoding.PEM,
            format=__import__(
                "cryptography.hazmat.primitives.serialization", fromlist=["PublicFormat"]
            ).PublicFormat.SubjectPublicKeyInfo,
        )
        .decode()
    )
    rs_token = jwt.encode(
        {"sub": "u", "iss": "llm-gateway", "aud": "llm-gateway", "exp": int(time.time()) + 3600},
        key,
        algorithm="RS256",
    ).encode()
    rs_auth = AuthenticateStage(
        Authenticator(JwtVerifier(JwtSettings(public_keys=[PublicKeySettings(pem=pem)]), cache_size=0), None)
    )
    parse, validate, sanitise = (
        ParseStage(MODELS, 1 << 22),
        ValidateStage(),
        SanitiseStage(SanitiseSettings()),
    )
    redis = open_redis(redis_url)
    shared = FailoverLimiter(LocalLimiter(window_s=60), "fail_open", 0.25)
    wire = RespClient(redis_url)
    shared.bind(RedisLimiter(redis, window_s=60, lease_s=30, wire=wire), redis.ping)
    admit = AdmitStage(shared, LIMITS)
    local_admit = AdmitStage(FailoverLimiter(LocalLimiter(window_s=60), "fail_open", 0.25), LIMITS)
    # limits alone vs limits + model access + budgets, with the same stages otherwise: the parse
    # stage asks the model grants, the admit stage checks three budgets and writes two ledgers in its
    # one EVALSHA (and the finalizer's)
    priced_parse = ParseStage(PRICED, 1 << 22)
    access_parse = ParseStage(PRICED, 1 << 22, ModelAccessRules(BUDGETED).permits)
    budget_admit = AdmitStage(shared, BUDGETED)
    local_budget_admit = AdmitStage(FailoverLimiter(LocalLimiter(window_s=60), "fail_open", 0.25), BUDGETED)
    base = [parse, validate]
    out = {
        "baseline_parse_validate_us": await _cpu_per_request(base, headers, n),
        "admission_total_us": await _cpu_per_request([auth, parse, validate, sanitise, admit], headers, n),
        "auth_jwt_cache_hit_us": await _cpu_per_request([auth], headers, n),
        "auth_hs256_verify_us": await _cpu_per_request([no_cache], headers, n),
        "auth_rs256_verify_us": await _cpu_per_request(
            [rs_auth], {b"authorization": b"Bearer " + rs_token}, n // 5
        ),
        "sanitise_us": await _cpu_per_request([*base, sanitise], headers, n),
        "admit_redis_us": await _cpu_per_request([*base, sanitise, admit], headers, n),
        "admit_local_us": await _cpu_per_request([*base, sanitise, local_admit], headers, n),
    }
    # alternated rounds, best of each: the difference is a few µs on a ~100 µs path
    limits_only, with_budgets, local_only, local_budgets = [], [], [], []
    for _ in range(3):
        limits_only.append(await _cpu_per_request([priced_parse, validate, sanitise, admit], headers, n))
        with_budgets.append(
            await _cpu_per_request([access_parse, validate, sanitise, budget_admit], headers, n)
        )
        local_only.append(await _cpu_per_request([priced_parse, validate, sanitise, local_admit], headers, n))
        local_budgets.append(
            await _cpu_per_request([access_parse, validate, sanitise, local_budget_admit], headers, n)
        )
    out["intake_admit_limits_redis_us"] = min(limits_only)
    out["intake_admit_limits_access_budgets_redis_us"] = min(with_budgets)
    out["access_budgets_added_redis_us"] = min(with_budgets) - min(limits_only)
    out["access_budgets_added_local_us"] = min(local_budgets) - min(local_only)
    out["sanitise_us"] -= out["baseline_parse_validate_us"]
    out["admit_redis_us"] -= out["sanitise_us"] + out["baseline_parse_validate_us"]
    out["admit_local_us"] -= out["sanitise_us"] + out["baseline_parse_validate_us"]
    out["admission_added_us"] = out["admission_total_us"] - out["baseline_parse_validate_us"]
    await shared.aclose()
    await wire.aclose()
    await redis.aclose()
    return {k: round(v, 1) for k, v in out.items()}


def main() -> None:
    from tests.support import RedisServer

    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=5000)
    args = p.parse_args()
    import uvloop

    with RedisServer() as server:
        print(json.dumps(uvloop.run(run(args.n, server.url)), indent=2))


if __name__ == "__main__":
    main()
