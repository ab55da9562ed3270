"""JWT verification: the token → a `Principal`, or `AuthFailure` with a reason.

Order of checks, cheapest first, so hostile input costs little: size cap → cache of recently
verified tokens (by BLAKE2b digest) → header parse → algorithm in the allow-list (`none` never is)
→ keys for that algorithm family and `kid` → signature, `exp`/`nbf`/`iat` (with leeway), `iss`,
`aud`, required claims → claim mapping. The cache keeps a principal at most `CACHE_TTL_S` and never
past the token's `exp`, in a bounded LRU.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jwt
from jwt import exceptions as jwt_errors

from gateway.admission.jwks import JwksCache
from gateway.admission.jwt_keys import VerifyKey, load_pem
from gateway.admission.settings import HMAC_ALGORITHMS, KNOWN_ALGORITHMS, ClaimMapping, JwtSettings
from gateway.core.context import Principal

_HMAC = frozenset(HMAC_ALGORITHMS)

#: the shared secret's algorithm: the secret is the development path (`gateway token` signs HS256);
#: an identity provider's tokens verify with its public keys
SECRET_ALGORITHMS = ("HS256",)
#: claims every token must carry: an expiry (no token is valid for ever) and a subject
REQUIRED_CLAIMS = ("exp", "sub")
#: clock skew tolerated between the token's issuer and the gateway on `exp`, `nbf` and `iat`
LEEWAY_S = 30.0
#: longest token accepted, in bytes (401 above, before any parsing): a token with many group or
#: role claims stays far below
MAX_TOKEN_BYTES = 8192
#: verified tokens kept this long (never past their `exp`), at most this many: a client's token is
#: checked once a minute, not on every request
CACHE_TTL_S = 60.0
CACHE_SIZE = 10_000


class AuthFailure(Exception):
    """Credentials were refused. `reason` is a short metric label; `detail` a sentence for the client."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


_DECODE_ERRORS: tuple[tuple[type[Exception], str, str], ...] = (
    (jwt_errors.ExpiredSignatureError, "expired", "The token has expired."),
    (jwt_errors.ImmatureSignatureError, "not_yet_valid", "The token is not valid yet."),
    (jwt_errors.InvalidAudienceError, "bad_audience", "The token is not meant for this service (aud)."),
    (jwt_errors.InvalidIssuerError, "bad_issuer", "The token's issuer is not trusted (iss)."),
    (jwt_errors.MissingRequiredClaimError, "missing_claim", "The token lacks a required claim."),
    (jwt_errors.InvalidSignatureError, "bad_signature", "The token's signature is invalid."),
)


def _claim(claims: Mapping[str, Any], path: str) -> Any:
    node: Any = claims
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def principal_from_claims(claims: Mapping[str, Any], mapping: ClaimMapping) -> Principal:
    """Map verified claims to a principal; `AuthFailure` when the user claim is missing or a claim
    has the wrong type (a token that does not say who it is must not be accepted as anyone)."""
    user = _claim(claims, mapping.user)
    if not isinstance(user, str) or not user:
        raise AuthFailure("bad_claims", f"The token has no usable '{mapping.user}' claim.")
    tenant = _claim(claims, mapping.tenant)
    if tenant is not None and not isinstance(tenant, str):
        raise AuthFailure("bad_claims", f"The token's '{mapping.tenant}' claim must be a string.")
    raw_roles = _claim(claims, mapping.roles)
    if raw_roles is None:
        roles: frozenset[str] = frozenset()
    elif isinstance(raw_roles, str):
        roles = frozenset(raw_roles.split())
    elif isinstance(raw_roles, list) and all(isinstance(r, str) for r in raw_roles):
        roles = frozenset(raw_roles)
    else:
        raise AuthFailure("bad_claims", f"The token's '{mapping.roles}' claim must be a list or a string.")
    tier = _claim(claims, mapping.tier)
    if tier is not None and not isinstance(tier, str):
        raise AuthFailure("bad_claims", f"The token's '{mapping.tier}' claim must be a string.")
    return Principal(user=user, tenant=tenant or None, roles=roles, tier=tier or "default")


class JwtVerifier:
    """Verifies bearer JWTs against the configured secret, PEM keys and JWKS."""

    def __init__(
        self,
        settings: JwtSettings,
        jwks: JwksCache | None = None,
        clock: Callable[[], float] = time.time,
        *,
        cache_ttl_s: float = CACHE_TTL_S,
        cache_size: int = CACHE_SIZE,
    ) -> None:
        self._s = settings
        self._jwks = jwks
        self._clock = clock
        self._secret: VerifyKey | None = None
        if settings.secret:
            self._secret = VerifyKey(None, settings.secret.encode(), frozenset(SECRET_ALGORITHMS))
        self._static: list[VerifyKey] = []
        for pk in settings.public_keys:
            pem = pk.pem if pk.pem is not None else Path(pk.pem_file or "").read_text()
            self._static.append(load_pem(pem, settings.algorithms, pk.kid))
        self._allowed = frozenset(SECRET_ALGORITHMS if settings.secret else ()) | frozenset(
            a for k in self._static for a in k.algorithms
        )
        if jwks is not None:
            self._allowed |= frozenset(settings.algorithms)
        self._allowed &= KNOWN_ALGORITHMS
        self._issuer = settings.issuer
        self._audience = settings.audience
        self._require = list(REQUIRED_CLAIMS)
        self._options: Any = {"require": self._require, "verify_aud": settings.audience is not None}
        self._cache: OrderedDict[bytes, tuple[Principal, float]] = OrderedDict()
        self._cache_ttl = cache_ttl_s
        self._cache_size = cache_size
        self._max_bytes = MAX_TOKEN_BYTES
        self.verifications = 0  # full signature checks (cache misses), for tests and benchmarks

    async def verify(self, token: bytes) -> Principal:
        """The principal a bearer token proves, or `AuthFailure`."""
        if len(token) > self._max_bytes:
            raise AuthFailure("too_large", f"The token is larger than {self._max_bytes} bytes.")
        digest = hashlib.blake2b(token, digest_size=16).digest()
        now = self._clock()
        hit = self._cache.get(digest)
        if hit is not None:
            if hit[1] > now:
                self._cache.move_to_end(digest)
                return hit[0]
            del self._cache[digest]
        try:
            text = token.decode("ascii")
        except UnicodeDecodeError:
            raise AuthFailure("malformed", "The token is not a JWT.") from None
        claims = await self._decode(text)
        principal = principal_from_claims(claims, self._s.claims)
        self._remember(digest, principal, claims, now)
        return principal

    async def _decode(self, token: str) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except (jwt_errors.PyJWTError, ValueError, TypeError):
            raise AuthFailure("malformed", "The token is not a JWT.") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self._allowed:
            raise AuthFailure("bad_algorithm", "The token's signing algorithm is not accepted.")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise AuthFailure("malformed", "The token's key id (kid) must be a string.")
        keys = await self._keys(alg, kid)
        if not keys:
            raise AuthFailure("unknown_key", "The token was signed with an unknown key.")
        failure: AuthFailure | None = None
        self.verifications += 1
        for key in keys:
            try:
                claims: dict[str, Any] = jwt.decode(
                    token,
                    key.key,
                    algorithms=[alg],
                    audience=self._audience,
                    issuer=self._issuer,
                    leeway=LEEWAY_S,
                    options=self._options,
                )
                return claims
            except jwt_errors.InvalidSignatureError:
                failure = AuthFailure("bad_signature", "The token's signature is invalid.")
            except jwt_errors.PyJWTError as exc:
                raise _classify(exc) from None
            except (ValueError, TypeError):  # a key unfit for this token; try the next one
                failure = AuthFailure("bad_signature", "The token's signature is invalid.")
        assert failure is not None
        raise failure

    async def _keys(self, alg: str, kid: str | None) -> Sequence[VerifyKey]:
        if alg in _HMAC:
            return [self._secret] if self._secret is not None and alg in self._secret.algorithms else []
        out = [
            k for k in self._static if alg in k.algorithms and (k.kid == kid or kid is None or k.kid is None)
        ]
        if self._jwks is not None and alg in self._s.algorithms:
            out += [k for k in await self._jwks.keys_for(kid) if alg in k.algorithms]
        return out[:4]

    def _remember(self, digest: bytes, principal: Principal, claims: Mapping[str, Any], now: float) -> None:
        if self._cache_size <= 0 or self._cache_ttl <= 0:
            return
        until = now + self._cache_ttl
        exp = claims.get("exp")
        if isinstance(exp, int | float) and not isinstance(exp, bool):
            until = min(until, float(exp))
        if until <= now:
            return
        cache = self._cache
        cache[digest] = (principal, until)
        if len(cache) > self._cache_size:
            cache.popitem(last=False)

    def forget(self) -> None:
        """Drop every cached verification (e.g. after a key was withdrawn)."""
        self._cache.clear()


def _classify(exc: Exception) -> AuthFailure:
    for cls, reason, detail in _DECODE_ERRORS:
        if isinstance(exc, cls):
            return AuthFailure(reason, detail)
    return AuthFailure("malformed", "The token could not be verified.")
