"""Minting development JWTs (`gateway token`): HS256 with `GATEWAY_JWT_SECRET`.

The claims match what the gateway's default auth settings read: `sub` (user), `tenant`, `roles`
(a list), `tier`; `iss` and `aud` are `llm-gateway`; `iat` and `exp` from `ttl`.
"""

from __future__ import annotations

import secrets
import time

import jwt

ISSUER = "llm-gateway"
AUDIENCE = "llm-gateway"


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def mint_token(
    secret: str,
    sub: str,
    *,
    roles: list[str] | None = None,
    ttl_s: int = 3600,
    tier: str | None = None,
    tenant: str | None = None,
    now: float | None = None,
) -> str:
    issued = int(time.time() if now is None else now)
    claims: dict[str, object] = {
        "sub": sub,
        "iss": ISSUER,
        "aud": AUDIENCE,
        "iat": issued,
        "exp": issued + ttl_s,
    }
    if roles:
        claims["roles"] = list(roles)
    if tier:
        claims["tier"] = tier
    if tenant:
        claims["tenant"] = tenant
    return jwt.encode(claims, secret, algorithm="HS256")
