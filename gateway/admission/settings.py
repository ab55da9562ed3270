"""Typed settings of admission: `auth`, `limits` and `sanitise` (fields of `gateway.settings.Settings`).

Every default keeps a config without these sections valid and behaving as before: authentication is
on only when a key source is configured (`auth.enabled: null` = auto), every limit is 0 (unlimited),
and the sanitiser's defaults only refuse what no engine should ever see. The reference for every
field is docs/configuration.md; the behaviour behind them is docs/admission.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from policies.access import ModelAccess
from policies.budgets import DAY_S, MAX_TOKENS, MAX_USD, Budget, usd_to_nanos

#: every JWS algorithm the gateway can verify; `none` is not among them and never will be
HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
ASYMMETRIC_ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)
KNOWN_ALGORITHMS = frozenset(HMAC_ALGORITHMS + ASYMMETRIC_ALGORITHMS)
#: the public-key algorithms accepted unless `auth.jwt.algorithms` says otherwise: what identity
#: providers sign with by default (RSA, RSA-PSS, P-256, Ed25519)
DEFAULT_ALGORITHMS = ("RS256", "PS256", "ES256", "EdDSA")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_algorithms(algs: list[str], allowed: tuple[str, ...]) -> list[str]:
    for alg in algs:
        if alg not in allowed:
            raise ValueError(f"algorithm {alg!r} is not allowed here (choose from {', '.join(allowed)})")
    if not algs:
        raise ValueError("at least one algorithm is needed")
    return algs


class PublicKeySettings(_Model):
    """One static public key (PEM text or file); it verifies those of `auth.jwt.algorithms` its type
    and curve can do."""

    #: matched against the token header's `kid`; a key without `kid` matches tokens without one
    kid: str | None = None
    pem: str | None = None
    pem_file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> PublicKeySettings:
        if (self.pem is None) == (self.pem_file is None):
            raise ValueError("a public key needs exactly one of pem or pem_file")
        return self


class ClaimMapping(_Model):
    """Which claims fill the principal. Dotted paths reach into objects (`realm_access.roles`)."""

    user: str = "sub"
    tenant: str = "tenant"
    #: a list of strings, or one space-separated string (an OAuth `scope`)
    roles: str = "roles"
    tier: str = "tier"


class JwtSettings(_Model):
    #: HS256 shared secret (`GATEWAY_JWT_SECRET` sets it); tokens from `gateway token` verify with it
    secret: str | None = None
    public_keys: list[PublicKeySettings] = Field(default_factory=list)
    jwks_url: str | None = None
    #: algorithms accepted from public keys, static and JWKS (each key is further limited to its own
    #: type and curve, and a JWKS key to its `alg`)
    algorithms: list[str] = Field(default_factory=lambda: list(DEFAULT_ALGORITHMS))
    #: expected `iss` (one or any of several); null = not checked
    issuer: str | list[str] | None = "llm-gateway"
    #: expected `aud` (the token must name one of these); null = not checked
    audience: str | list[str] | None = "llm-gateway"
    claims: ClaimMapping = ClaimMapping()

    @field_validator("algorithms")
    @classmethod
    def _algs(cls, v: list[str]) -> list[str]:
        return _check_algorithms(v, ASYMMETRIC_ALGORITHMS)

    @property
    def has_keys(self) -> bool:
        return bool(self.secret or self.public_keys or self.jwks_url)


class ApiKeySettings(_Model):
    enabled: bool = True
    #: optional server-side pepper: keys are stored as HMAC-SHA256(pepper, key) instead of SHA-256(key)
    pepper: str | None = None


class AuthSettings(_Model):
    #: null = on when any JWT key source is configured; false = every request is `anonymous`
    enabled: bool | None = None
    jwt: JwtSettings = JwtSettings()
    api_keys: ApiKeySettings = ApiKeySettings()

    @property
    def active(self) -> bool:
        return self.jwt.has_keys if self.enabled is None else self.enabled


class BudgetSettings(_Model):
    """A spending limit: `usd` and/or `tokens` per `period` (UTC `day`, UTC `month`, or a sliding
    window of `window_s` seconds: `rolling`)."""

    period: Literal["day", "month", "rolling"]
    window_s: int | None = Field(None, ge=60, le=31 * DAY_S)
    usd: float | None = Field(None, gt=0, le=MAX_USD)
    tokens: int | None = Field(None, gt=0, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _complete(self) -> BudgetSettings:
        if self.usd is None and self.tokens is None:
            raise ValueError("a budget needs a limit: usd, tokens or both")
        if (self.period == "rolling") != (self.window_s is not None):
            raise ValueError("window_s is required for a rolling budget and only allowed for one")
        if self.usd is not None:
            usd_to_nanos(self.usd)  # more than nine decimals is an error, not a silent rounding
        return self

    def budgets(self) -> list[Budget]:
        out = []
        if self.usd is not None:
            out.append(Budget(self.period, "usd", usd_to_nanos(self.usd), self.window_s or 0))
        if self.tokens is not None:
            out.append(Budget(self.period, "tokens", self.tokens, self.window_s or 0))
        return out


class ModelLimits(_Model):
    """The limits of a scope on every model together (`LimitSet`), or on one (`LimitSet.models`).
    0: unlimited."""

    requests_per_minute: int = Field(0, ge=0)
    tokens_per_minute: int = Field(0, ge=0)
    #: the most output tokens a request may ask for (`limits.over_max_tokens` says how)
    max_tokens: int | None = Field(None, ge=1)


class LimitSet(ModelLimits):
    """Limits of one scope (a user of a tier, or a tenant). 0 means unlimited. `allow_models` /
    `deny_models`: the public model names the scope may use (None: every model) and may never use."""

    concurrent_requests: int = Field(0, ge=0)
    #: limits per model (public name), on top of the ones above
    models: dict[str, ModelLimits] = Field(default_factory=dict)
    allow_models: list[str] | None = None
    deny_models: list[str] = Field(default_factory=list)
    #: spending limits of the scope (each user of a tier; all users of a tenant together)
    budgets: list[BudgetSettings] = Field(default_factory=list, max_length=16)
    #: the flow-control class of the scope's requests (`flow.classes`; docs/flow-control.md): an API
    #: key's own class comes first, then the tier's, then the tenant's, else `standard`
    priority_class: str | None = Field(None, min_length=1, max_length=64)

    @property
    def spending_limits(self) -> tuple[Budget, ...]:
        return tuple(b for setting in self.budgets for b in setting.budgets())

    @property
    def access(self) -> ModelAccess | None:
        """The model grant of this scope, None when it restricts nothing."""
        if self.allow_models is None and not self.deny_models:
            return None
        return ModelAccess.of(self.allow_models, self.deny_models)

    def named_models(self) -> set[str]:
        return {*(self.allow_models or ()), *self.deny_models, *self.models}

    @property
    def unlimited(self) -> bool:
        """No rate limit and no budget (model lists and output ceilings are not limits: the parse and
        the caps stages apply them)."""
        per_model = any(m.requests_per_minute or m.tokens_per_minute for m in self.models.values())
        return not (
            self.requests_per_minute
            or self.tokens_per_minute
            or self.concurrent_requests
            or self.budgets
            or per_model
        )

    def max_tokens_for(self, model: str) -> int | None:
        """The scope's ceiling on a request's output tokens for `model` (None: none)."""
        caps = [
            c for c in (self.max_tokens, self.models[model].max_tokens if model in self.models else None) if c
        ]
        return min(caps) if caps else None


#: the tier of principals without one, or with a tier not listed (`gateway token` mints no tier),
#: and the limits of tenants not listed
DEFAULT_TIER = DEFAULT_TENANT = "default"
_NO_LIMITS = LimitSet()


class LimitsSettings(_Model):
    #: per-user limits by tier; the principal's tier (claim `auth.jwt.claims.tier`) picks one, and
    #: `default` applies to principals without a tier or with one not listed
    tiers: dict[str, LimitSet] = Field(default_factory=lambda: {DEFAULT_TIER: LimitSet()})
    #: per-tenant limits (all users of a tenant together); `default` applies to tenants not listed
    tenants: dict[str, LimitSet] = Field(default_factory=dict)
    #: what happens while Redis is unreachable: a local in-process limiter, or 503
    on_redis_error: Literal["fail_open", "fail_closed"] = "fail_open"
    #: a request asking for more output tokens than a ceiling allows (`max_tokens` of a tier, a
    #: tenant, a model): `clamp` it (the answer's `x-gateway-max-tokens` says to what) or `reject` it
    over_max_tokens: Literal["clamp", "reject"] = "clamp"

    @model_validator(mode="after")
    def _default_exists(self) -> LimitsSettings:
        if DEFAULT_TIER not in self.tiers:
            raise ValueError(f"limits.tiers needs a tier named {DEFAULT_TIER!r} (principals without a tier)")
        return self

    @property
    def default_tier(self) -> str:
        return DEFAULT_TIER

    @property
    def tenant_default(self) -> LimitSet:
        """The limits of tenants not listed: the tenant named `default`'s (none when not listed)."""
        return self.tenants.get(DEFAULT_TENANT, _NO_LIMITS)

    def scopes(self) -> list[tuple[str, LimitSet]]:
        """Every configured scope with its place in the config (for messages)."""
        out = [(f"limits.tiers.{name}", t) for name, t in self.tiers.items()]
        return out + [(f"limits.tenants.{name}", t) for name, t in self.tenants.items()]

    @property
    def unlimited(self) -> bool:
        return all(t.unlimited for t in self.tiers.values()) and all(
            t.unlimited for t in self.tenants.values()
        )


Policy = Literal["reject", "neutralise", "allow"]

#: chat-template control sequences of the common model families (ChatML, Llama 2/3, Mistral, Gemma, Phi…)
DEFAULT_SPECIAL_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "[INST]",
    "[/INST]",
    "<<SYS>>",
    "<</SYS>>",
    "<s>",
    "</s>",
)


class MediaSettings(_Model):
    """Media parts (images, audio, video) in chat, Responses and Messages requests (docs/admission.md,
    *Media*). Engines fetch media URLs themselves, so the gateway decides which may reach them."""

    #: hosts whose `http(s)` media the gateway fetches and forwards inline (`images.example.com`, or
    #: `*.example.com` for the names under it); empty: only `data:` URLs are accepted
    allowed_hosts: list[str] = Field(default_factory=list)
    #: media items in one request at most (0 refuses every media part)
    max_parts: int = Field(32, ge=0)
    #: largest media item, decoded, in bytes (a `data:` URL's payload or a fetched body)
    max_bytes: int = Field(20 * 1024 * 1024, ge=1024)

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        for host in v:
            bare = host[2:] if host.startswith("*.") else host
            if not bare or any(c in bare for c in "/@ *\t"):
                raise ValueError(f"{host!r} is not a host name (write images.example.com or *.example.com)")
        return v


class SanitiseSettings(_Model):
    #: control characters (C0 except tab, LF, CR; DEL) in user-supplied text: rejected, or removed
    control_chars: Literal["reject", "strip"] = "strip"
    special_tokens: Policy = "neutralise"
    #: the chat-template special tokens looked for in every model's prompts
    special_token_list: list[str] = Field(default_factory=lambda: list(DEFAULT_SPECIAL_TOKENS))
    #: Jinja-style markers (`{{`, `{%`, ...) in user text: `allow` (the default), `neutralise` or `reject`
    template_markers: Policy = "allow"
    media: MediaSettings = MediaSettings()

    @field_validator("special_token_list")
    @classmethod
    def _non_empty_items(cls, v: list[str]) -> list[str]:
        if any(len(s) < 2 for s in v):
            raise ValueError("every token must be at least two characters long")
        return v
