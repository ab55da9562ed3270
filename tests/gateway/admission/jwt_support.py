"""Real keys and a real JWKS endpoint on loopback, for the auth tests.

`Keys` generates RSA, EC (P-256) and Ed25519 key pairs with `cryptography`; `JwksServer` serves a
JWKS document from a thread (`set_keys` rotates it, `down = True` makes it answer 503) and counts
fetches. `raw_jwt` builds tokens pyjwt refuses to build (alg none, HMAC with a PEM public key…).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

ISS = AUD = "llm-gateway"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def raw_jwt(
    header: dict[str, Any], claims: dict[str, Any], secret: bytes | None = None, signature: bytes = b""
) -> str:
    """A compact JWS assembled by hand (HMAC-SHA256 with `secret` when given)."""
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    if secret is not None:
        signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


def claims(**over: Any) -> dict[str, Any]:
    now = int(time.time())
    base: dict[str, Any] = {"sub": "alice", "iss": ISS, "aud": AUD, "iat": now, "exp": now + 600}
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


def pem_public(private: Any) -> str:
    return (
        private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


class Keys:
    def __init__(self) -> None:
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.rsa2 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.ed = ed25519.Ed25519PrivateKey.generate()

    @staticmethod
    def jwk(private: Any, kid: str, alg: str | None = None) -> dict[str, Any]:
        pub = private.public_key()
        if isinstance(pub, rsa.RSAPublicKey):
            d = json.loads(RSAAlgorithm.to_jwk(pub))
        elif isinstance(pub, ec.EllipticCurvePublicKey):
            d = json.loads(ECAlgorithm.to_jwk(pub))
        else:
            d = json.loads(OKPAlgorithm.to_jwk(pub))
        d["kid"] = kid
        d["use"] = "sig"
        if alg:
            d["alg"] = alg
        return d

    @staticmethod
    def sign(private: Any, alg: str, kid: str | None = None, **over: Any) -> str:
        headers = {"kid": kid} if kid else None
        return jwt.encode(claims(**over), private, algorithm=alg, headers=headers)


class JwksServer:
    def __init__(self) -> None:
        self.doc: dict[str, Any] = {"keys": []}
        self.down = False
        self.fetches = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.fetches += 1
                if outer.down:
                    self.send_response(503)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                body = json.dumps(outer.doc).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/.well-known/jwks.json"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def set_keys(self, *jwks: dict[str, Any]) -> None:
        self.doc = {"keys": list(jwks)}

    def __enter__(self) -> JwksServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def hostile_catalogue(keys: Keys, secret: str) -> list[tuple[str, bytes | None]]:
    """(name, Authorization header value) pairs that must each be refused with 401.

    Assumes a gateway trusting `secret` (HS256 only), and a JWKS with `keys.rsa` as kid `rsa-1`,
    `keys.ec` as `ec-1`, `keys.ed` as `ed-1` — and that the JWKS endpoint is down while they run.
    """
    now = int(time.time())
    s = secret.encode()
    good_rs = Keys.sign(keys.rsa, "RS256", "rsa-1")
    h, _, sig = good_rs.split(".")
    forged_payload = b64(json.dumps(claims(sub="root", roles=["admin"])).encode())
    es = Keys.sign(keys.ec, "ES256", "ec-1")
    _, es_p, es_s = es.split(".")
    es_as_rs = f"{b64(json.dumps({'alg': 'RS256', 'kid': 'ec-1', 'typ': 'JWT'}).encode())}.{es_p}.{es_s}"
    tokens: list[tuple[str, str | bytes | None]] = [
        ("alg_none", raw_jwt({"alg": "none", "typ": "JWT"}, claims(roles=["admin"]))),
        ("alg_None_mixed_case", raw_jwt({"alg": "None", "typ": "JWT"}, claims())),
        (
            "hs256_signed_with_rsa_public_pem",
            raw_jwt({"alg": "HS256", "kid": "rsa-1"}, claims(), secret=pem_public(keys.rsa).encode()),
        ),
        ("hs256_wrong_secret", jwt.encode(claims(), "not-the-secret-" * 3, algorithm="HS256")),
        ("expired", Keys.sign(keys.rsa, "RS256", "rsa-1", exp=now - 3600, iat=now - 7200)),
        ("future_nbf", Keys.sign(keys.rsa, "RS256", "rsa-1", nbf=now + 3600)),
        ("future_iat", Keys.sign(keys.rsa, "RS256", "rsa-1", iat=now + 3600)),
        ("wrong_aud", Keys.sign(keys.rsa, "RS256", "rsa-1", aud="someone-else")),
        ("wrong_iss", Keys.sign(keys.rsa, "RS256", "rsa-1", iss="https://evil.example")),
        ("missing_exp", jwt.encode(claims(exp=None), secret, algorithm="HS256")),
        ("missing_sub", jwt.encode(claims(sub=None), secret, algorithm="HS256")),
        ("sub_not_a_string", raw_jwt({"alg": "HS256", "typ": "JWT"}, claims(sub=123), secret=s)),
        ("tampered_payload", f"{h}.{forged_payload}.{sig}"),
        ("stripped_signature", f"{h}.{good_rs.split('.')[1]}."),
        ("unknown_kid_jwks_down", Keys.sign(keys.rsa2, "RS256", "rotated-9")),
        ("other_key_same_kid", Keys.sign(keys.rsa2, "RS256", "rsa-1")),
        ("oversized", jwt.encode(claims(pad="x" * 12000), secret, algorithm="HS256")),
        ("garbage", "not-a-jwt"),
        ("two_segments", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0"),
        ("five_segments_jwe", "a.b.c.d.e"),
        ("header_not_json", f"{b64(b'{nope')}.{b64(json.dumps(claims()).encode())}.{b64(b'sig')}"),
        ("non_ascii_bytes", "eyJ\u00e9\u00e9.x.y".encode()),
        ("es256_relabelled_rs256", es_as_rs),
        ("hs512_not_allowed", jwt.encode(claims(), secret, algorithm="HS512")),
        (
            "roles_wrong_type",
            raw_jwt({"alg": "HS256", "typ": "JWT"}, claims(roles={"admin": True}), secret=s),
        ),
        ("exp_not_a_number", raw_jwt({"alg": "HS256", "typ": "JWT"}, claims(exp="tomorrow"), secret=s)),
        (
            "unknown_crit_header",
            raw_jwt({"alg": "HS256", "typ": "JWT", "crit": ["x-magic"], "x-magic": 1}, claims(), secret=s),
        ),
        ("kid_not_a_string", raw_jwt({"alg": "RS256", "kid": 42}, claims(), signature=b"x" * 256)),
        ("empty_bearer", b"Bearer "),
        ("basic_scheme", b"Basic dXNlcjpwYXNz"),
        ("unknown_api_key", "sk-gw-" + "A" * 43),
        ("no_header", None),
    ]
    out: list[tuple[str, bytes | None]] = []
    for name, tok in tokens:
        if tok is None or (isinstance(tok, bytes) and tok.split(b" ")[0] in (b"Bearer", b"Basic")):
            out.append((name, tok if isinstance(tok, bytes) or tok is None else tok.encode()))
        else:
            out.append((name, b"Bearer " + (tok if isinstance(tok, bytes) else tok.encode())))
    return out
