"""Verification keys and the algorithms each may verify.

A key's algorithms are the intersection of what the operator allowed and what its type can do, so
no key can ever verify a token under another family's algorithm (the HS/RS confusion attack needs
an RSA public key accepted as an HMAC secret; here HMAC algorithms only ever meet the configured
shared secret, and public keys only asymmetric algorithms of their own type and curve):

    RSA          RS256 RS384 RS512 PS256 PS384 PS512
    EC P-256     ES256          EC P-384  ES384          EC P-521  ES512
    Ed25519/448  EdDSA
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from jwt import PyJWK
from jwt.exceptions import PyJWKError

_RSA = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_EC = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


@dataclass(frozen=True, slots=True)
class VerifyKey:
    """One key usable by `jwt.decode`: a crypto public key or (HMAC) the secret bytes."""

    kid: str | None
    key: Any
    algorithms: frozenset[str]


def algorithms_of(key: Any) -> frozenset[str]:
    """Every JWS algorithm a public key of this type (and curve) can verify."""
    if isinstance(key, rsa.RSAPublicKey):
        return _RSA
    if isinstance(key, ec.EllipticCurvePublicKey):
        alg = _EC.get(key.curve.name)
        return frozenset({alg}) if alg else frozenset()
    if isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return frozenset({"EdDSA"})
    return frozenset()


def load_pem(pem: str | bytes, allowed: Collection[str], kid: str | None = None) -> VerifyKey:
    """A public key from PEM; `ValueError` when it is not a public key or none of `allowed` fits it."""
    data = pem.encode() if isinstance(pem, str) else pem
    key = load_pem_public_key(data)
    algs = algorithms_of(key) & frozenset(allowed)
    if not algs:
        raise ValueError(
            f"the public key {kid or ''} cannot verify any of {sorted(allowed)}".replace("  ", " ")
        )
    return VerifyKey(kid, key, algs)


def from_jwk(jwk: Mapping[str, Any], allowed: Collection[str]) -> VerifyKey | None:
    """A verification key from one JWKS entry, or None when it is not one we may use: an
    encryption key (`use` ≠ `sig`), a symmetric (`oct`) or private key, or an `alg` not allowed."""
    if jwk.get("use", "sig") != "sig" or jwk.get("kty") == "oct" or "d" in jwk:
        return None
    try:
        key = PyJWK(dict(jwk)).key
    except (PyJWKError, ValueError, TypeError, KeyError):
        return None
    algs = algorithms_of(key) & frozenset(allowed)
    declared = jwk.get("alg")
    if declared is not None:
        algs &= {declared}
    if not algs:
        return None
    kid = jwk.get("kid")
    return VerifyKey(kid if isinstance(kid, str) else None, key, algs)
