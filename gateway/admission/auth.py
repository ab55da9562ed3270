"""Authentication: `Authorization: Bearer <JWT | sk-gw-… API key>` → `ctx.principal`.

    AuthenticateStage   the first pipeline stage: reads only headers, so an unauthenticated request
                        is refused before its body is read or parsed
    Authenticator       headers → Principal; ApiError 401 (bad or missing credentials, OpenAI's
                        `invalid_api_key`) or 503 (the key store is unreachable)
    require_admin       Principal → None, or ApiError 403 without the admin role

Errors never echo a credential beyond a masked hint, and every refusal is counted by reason.
"""

from __future__ import annotations

from collections.abc import Callable

from redis.exceptions import RedisError

from engines.errors import ApiError
from gateway.admission.api_keys import PREFIX as API_KEY_PREFIX
from gateway.admission.api_keys import ApiKeys
from gateway.admission.jwt_auth import AuthFailure, JwtVerifier
from gateway.core.context import Principal, RequestContext
from gateway.core.responses import Response

#: (stage, reason, ctx) → count a rejection (gateway_rejections; `Metrics.reject`)
RejectHook = Callable[[str, str, RequestContext | None], None]

_MISSING = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header using "
    "Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)
_API_KEY_PREFIX = API_KEY_PREFIX.encode()


def _mask(token: bytes) -> str:
    text = token.decode("ascii", "replace")
    if len(text) <= 12:
        return "*" * len(text)
    return f"{text[:6]}{'*' * 8}{text[-4:]}"


def unauthorized(token: bytes, detail: str) -> ApiError:
    return ApiError(
        401,
        f"Incorrect API key provided: {_mask(token)}. {detail}",
        type="invalid_request_error",
        code="invalid_api_key",
    )


def require_admin(principal: Principal) -> None:
    """Raise 403 unless `principal` holds the admin role (the guard of `/admin/*`)."""
    if not principal.is_admin:
        raise ApiError(
            403,
            "You have insufficient permissions for this operation. Missing role: admin.",
            type="invalid_request_error",
            code="insufficient_permissions",
        )


class Authenticator:
    """Resolves bearer credentials. Either source may be absent (None): its credentials are refused."""

    def __init__(
        self,
        jwt: JwtVerifier | None,
        api_keys: ApiKeys | None,
        on_reject: RejectHook | None = None,
    ) -> None:
        self.jwt = jwt
        self.api_keys = api_keys
        self._on_reject = on_reject

    async def authenticate(self, headers: dict[bytes, bytes], ctx: RequestContext | None = None) -> Principal:
        """The principal proven by the request's `Authorization` header; ApiError 401/503 if none.
        `ctx` (when called from the pipeline) only marks a refusal as counted."""
        raw = headers.get(b"authorization")
        if not raw:
            raise self._fail("missing", ApiError(401, _MISSING, type="invalid_request_error"), ctx)
        scheme, _, token = raw.strip().partition(b" ")
        token = token.strip()
        if scheme.lower() != b"bearer" or not token:
            raise self._fail("malformed", ApiError(401, _MISSING, type="invalid_request_error"), ctx)
        if token.startswith(_API_KEY_PREFIX):
            return await self._api_key(token, ctx)
        if self.jwt is None:
            raise self._fail("unknown_api_key", unauthorized(token, "The key is not valid."), ctx)
        try:
            return await self.jwt.verify(token)
        except AuthFailure as f:
            raise self._fail(f.reason, unauthorized(token, f.detail), ctx) from None

    async def _api_key(self, token: bytes, ctx: RequestContext | None) -> Principal:
        if self.api_keys is None:
            raise self._fail("unknown_api_key", unauthorized(token, "API keys are not enabled."), ctx)
        try:
            principal = await self.api_keys.resolve(token)
        except (RedisError, OSError):
            raise self._fail(
                "unavailable",
                ApiError(
                    503, "API keys cannot be checked right now. Please retry shortly.", type="server_error"
                ),
                ctx,
            ) from None
        if principal is None:
            raise self._fail(
                "unknown_api_key", unauthorized(token, "The key is not valid or was revoked."), ctx
            )
        return principal

    def _fail(self, reason: str, error: ApiError, ctx: RequestContext | None) -> ApiError:
        if self._on_reject is not None:
            self._on_reject("auth", reason, ctx)
        return error


class AuthenticateStage:
    name = "authenticate"

    def __init__(self, authenticator: Authenticator) -> None:
        self._auth = authenticator

    async def __call__(self, ctx: RequestContext) -> Response | None:
        ctx.principal = await self._auth.authenticate(ctx.headers, ctx)
        return None
