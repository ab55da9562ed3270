"""JWT verification and the authenticate stage, with real keys (RSA, EC, Ed25519) and a real JWKS
endpoint on loopback: every algorithm family, the hostile-token catalogue, caching, JWKS rotation
and outage, claim mapping, the admin guard."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import jwt
import pytest

from engines.errors import ApiError
from gateway.admission.auth import Authenticator, require_admin
from gateway.admission.jwks import JwksCache
from gateway.admission.jwt_auth import AuthFailure, JwtVerifier
from gateway.admission.settings import ClaimMapping, JwtSettings, PublicKeySettings
from gateway.admission.tokens import mint_token
from gateway.core.context import ANONYMOUS, Principal
from tests.gateway.admission.jwt_support import JwksServer, Keys, claims, hostile_catalogue, pem_public

SECRET = "test-secret-" + "s" * 64
ALL_ASYMMETRIC = ["RS256", "PS256", "ES256", "EdDSA"]


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


@pytest.fixture
def jwks_server(keys: Keys) -> Iterator[JwksServer]:
    with JwksServer() as server:
        server.set_keys(Keys.jwk(keys.rsa, "rsa-1"), Keys.jwk(keys.ec, "ec-1"), Keys.jwk(keys.ed, "ed-1"))
        yield server


@pytest.fixture
async def jwks(jwks_server: JwksServer) -> AsyncIterator[JwksCache]:
    cache = JwksCache(jwks_server.url, ALL_ASYMMETRIC, refresh_s=3600, min_refresh_s=0, timeout_s=2)
    await cache.start()
    yield cache
    await cache.aclose()


def settings(**over: object) -> JwtSettings:
    base: dict[str, object] = {"secret": SECRET, "algorithms": ALL_ASYMMETRIC}
    base.update(over)
    return JwtSettings.model_validate(base)


def bearer(token: str) -> dict[bytes, bytes]:
    return {b"authorization": b"Bearer " + token.encode()}


@pytest.mark.parametrize(
    ("key", "alg", "kid"),
    [("rsa", "RS256", "rsa-1"), ("rsa", "PS256", "rsa-1"), ("ec", "ES256", "ec-1"), ("ed", "EdDSA", "ed-1")],
)
async def test_jwks_keys_of_every_family_verify(
    keys: Keys, jwks: JwksCache, key: str, alg: str, kid: str
) -> None:
    verifier = JwtVerifier(settings(), jwks)
    token = Keys.sign(getattr(keys, key), alg, kid, tenant="acme", roles=["admin", "dev"], tier="pro")
    p = await verifier.verify(token.encode())
    assert (p.user, p.tenant, p.roles, p.tier) == ("alice", "acme", frozenset({"admin", "dev"}), "pro")


async def test_static_pem_keys_and_their_algorithms(keys: Keys) -> None:
    verifier = JwtVerifier(
        settings(
            secret=None,
            algorithms=["RS256", "EdDSA"],
            public_keys=[
                PublicKeySettings(pem=pem_public(keys.rsa), kid="r"),
                PublicKeySettings(pem=pem_public(keys.ed)),
            ],
        )
    )
    assert (await verifier.verify(Keys.sign(keys.rsa, "RS256", "r").encode())).user == "alice"
    assert (await verifier.verify(Keys.sign(keys.ed, "EdDSA").encode())).user == "alice"
    with pytest.raises(AuthFailure) as info:  # PS256 is not among the algorithms
        await verifier.verify(Keys.sign(keys.rsa, "PS256", "r").encode())
    assert info.value.reason == "bad_algorithm"


def test_a_pem_key_cannot_be_given_another_familys_algorithm(keys: Keys) -> None:
    with pytest.raises(ValueError, match="cannot verify"):
        JwtVerifier(settings(algorithms=["RS256"], public_keys=[PublicKeySettings(pem=pem_public(keys.ec))]))


async def test_gateway_token_command_is_accepted_by_the_defaults() -> None:
    verifier = JwtVerifier(JwtSettings(secret=SECRET))
    token = mint_token(SECRET, "bob", roles=["admin"], tier="gold", tenant="t1")
    p = await verifier.verify(token.encode())
    assert (p.user, p.tenant, p.roles, p.tier, p.is_admin) == (
        "bob",
        "t1",
        frozenset({"admin"}),
        "gold",
        True,
    )
    plain = await verifier.verify(mint_token(SECRET, "carol").encode())
    assert (plain.tenant, plain.roles, plain.tier) == (None, frozenset(), "default")


async def test_claim_mapping_with_paths_and_scope_strings() -> None:
    mapping = ClaimMapping(user="email", tenant="org.id", roles="scope", tier="plan")
    verifier = JwtVerifier(JwtSettings(secret=SECRET, claims=mapping))
    token = jwt.encode(
        claims(email="a@x.io", org={"id": "org-7"}, scope="read admin", plan="team"),
        SECRET,
        algorithm="HS256",
    )
    p = await verifier.verify(token.encode())
    assert (p.user, p.tenant, p.roles, p.tier) == ("a@x.io", "org-7", frozenset({"read", "admin"}), "team")


async def test_hostile_catalogue_is_refused_with_401(
    keys: Keys, jwks_server: JwksServer, jwks: JwksCache
) -> None:
    rejected: list[tuple[str, str, object]] = []
    auth = Authenticator(
        JwtVerifier(settings(), jwks), None, lambda stage, reason, ctx: rejected.append((stage, reason, ctx))
    )
    jwks_server.down = True
    catalogue = hostile_catalogue(keys, SECRET)
    assert len(catalogue) >= 20
    for name, header in catalogue:
        headers = {} if header is None else {b"authorization": header}
        with pytest.raises(ApiError) as info:
            await auth.authenticate(headers)
        err = info.value
        assert err.status == 401, (name, err)
        assert err.payload()["error"]["type"] == "invalid_request_error"
        secret_part = (header or b"")[16:-6]
        if len(secret_part) > 8:
            assert secret_part.decode("latin-1") not in err.message, f"{name}: a credential was echoed"
    assert len(rejected) == len(catalogue)
    assert {r[0] for r in rejected} == {"auth"}
    # and a good token still passes with the JWKS endpoint down (last good keys kept)
    assert (await auth.authenticate(bearer(Keys.sign(keys.ec, "ES256", "ec-1")))).user == "alice"


async def test_verified_tokens_are_cached_but_never_past_exp() -> None:
    now = [time.time()]
    verifier = JwtVerifier(JwtSettings(secret=SECRET), clock=lambda: now[0], cache_ttl_s=1000)
    exp = int(now[0]) + 100
    token = jwt.encode(claims(exp=exp), SECRET, algorithm="HS256").encode()
    for _ in range(5):
        await verifier.verify(token)
    assert verifier.verifications == 1
    now[0] = exp + 1  # past exp (pyjwt's leeway would still accept it): the cache must not answer
    await verifier.verify(token)
    assert verifier.verifications == 2


async def test_token_cache_is_bounded() -> None:
    verifier = JwtVerifier(JwtSettings(secret=SECRET), cache_size=3)
    tokens = [jwt.encode(claims(sub=f"u{i}"), SECRET, algorithm="HS256").encode() for i in range(5)]
    for t in tokens:
        await verifier.verify(t)
    assert len(verifier._cache) == 3
    await verifier.verify(tokens[0])  # evicted: verified again
    assert verifier.verifications == 6


async def test_jwks_rotation_without_restart(keys: Keys, jwks_server: JwksServer, jwks: JwksCache) -> None:
    verifier = JwtVerifier(settings(), jwks)
    assert (await verifier.verify(Keys.sign(keys.rsa, "RS256", "rsa-1").encode())).user == "alice"
    # the identity provider rotates: rsa-1 is withdrawn, rsa-2 published
    jwks_server.set_keys(Keys.jwk(keys.rsa2, "rsa-2", "RS256"))
    p = await verifier.verify(Keys.sign(keys.rsa2, "RS256", "rsa-2", sub="bob").encode())
    assert p.user == "bob"
    with pytest.raises(AuthFailure) as info:  # a new token from the withdrawn key
        await verifier.verify(Keys.sign(keys.rsa, "RS256", "rsa-1", sub="carol").encode())
    assert info.value.reason == "unknown_key"


async def test_unknown_kids_refresh_at_most_once_per_floor(keys: Keys, jwks_server: JwksServer) -> None:
    cache = JwksCache(jwks_server.url, ALL_ASYMMETRIC, refresh_s=3600, min_refresh_s=60, timeout_s=2)
    await cache.start()
    verifier = JwtVerifier(settings(), cache)
    before = jwks_server.fetches
    for i in range(20):
        with pytest.raises(AuthFailure):
            await verifier.verify(Keys.sign(keys.rsa2, "RS256", f"invented-{i}", sub=f"x{i}").encode())
    assert jwks_server.fetches - before <= 1
    await cache.aclose()


async def test_jwks_outage_keeps_last_good_keys(keys: Keys, jwks_server: JwksServer, jwks: JwksCache) -> None:
    jwks_server.down = True
    assert await jwks.refresh() is False
    assert jwks.size == 3 and jwks.failures >= 1
    jwks_server.down = False
    jwks_server.set_keys({"keys": "broken"})  # a bad document is an outage too
    jwks_server.doc = {"keys": "broken"}
    assert await jwks.refresh() is False
    verifier = JwtVerifier(settings(), jwks)
    assert (await verifier.verify(Keys.sign(keys.ed, "EdDSA", "ed-1").encode())).user == "alice"


def test_require_admin() -> None:
    require_admin(Principal("root", roles=frozenset({"admin"})))
    for p in (ANONYMOUS, Principal("u", roles=frozenset({"dev"}))):
        with pytest.raises(ApiError) as info:
            require_admin(p)
        assert info.value.status == 403


async def test_no_jwt_source_refuses_tokens_but_not_api_keys() -> None:
    auth = Authenticator(None, None)
    with pytest.raises(ApiError) as info:
        await auth.authenticate(bearer(mint_token(SECRET, "x")))
    assert info.value.status == 401
