"""Model access per tier, tenant and API key, end to end: a real gateway process (auth on, Redis for
API keys) in front of a real simulator serving three public models.

A model the caller may not use is answered exactly like a model that does not exist (404
`model_not_found`, same message) on chat, completions and `/v1/models/{id}`, and `/v1/models` lists only
what the caller may use. API keys are created with a model list through the admin API, and a `PUT`
changes it (audited) with effect at once on the replica that made the change.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import redis as redis_sync

from engines.sim.launcher import SimProcess
from gateway.admission.tokens import mint_token
from gateway.demo import SERVED
from tests.conftest import fast_sim
from tests.support import GatewayProcess, RedisServer

pytestmark = pytest.mark.processes

SECRET = "access-secret-" + "a" * 40
MODELS = ("small", "medium", "large")


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def token(user: str, *, tier: str | None = None, tenant: str | None = None, admin: bool = False) -> str:
    return mint_token(SECRET, user, tier=tier, tenant=tenant, roles=["admin"] if admin else None)


ADMIN = bearer(token("ops", admin=True))


def access_config(url: str, redis_url: str) -> dict[str, Any]:
    return {
        "server": {"graceful_shutdown_s": 1},
        "models": [{"name": m} for m in MODELS],
        "pools": [
            {
                "name": "vllm",
                "dialect": "vllm",
                "models": dict.fromkeys(MODELS, SERVED["vllm"]),
                "backends": [{"name": "vllm-0", "url": url}],
            }
        ],
        "upstream": {"health": {"interval_s": 0.5}},
        "routing": {"scrape_interval_s": 0},
        "redis": {"url": redis_url},
        "auth": {"jwt": {"secret": SECRET}},
        "limits": {
            "tiers": {
                "default": {},
                "basic": {"allow_models": ["small"]},
                "standard": {"allow_models": ["small", "medium"]},
            },
            "tenants": {"acme": {"deny_models": ["medium"]}, "default": {"deny_models": ["large"]}},
        },
    }


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with fast_sim("vllm") as s:
        yield s


@pytest.fixture(scope="module")
def gw(sim: SimProcess, redis_server: RedisServer) -> Iterator[GatewayProcess]:
    redis_sync.Redis.from_url(redis_server.url).delete("gw:{apikeys}:by_digest", "gw:{apikeys}:by_id")
    with GatewayProcess(access_config(sim.base_url, redis_server.url)) as g:
        yield g


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def usable(http: httpx.Client, headers: dict[str, str]) -> set[str]:
    """The models `headers` may use, asked every way the API has, which must all agree."""
    listed = http.get("/v1/models", headers=headers)
    assert listed.status_code == 200, listed.text
    names = {m["id"] for m in listed.json()["data"]}
    unknown = http.post("/v1/chat/completions", json=chat("no-such-model"), headers=headers)
    assert unknown.status_code == 404
    for model in MODELS:
        one = http.get(f"/v1/models/{model}", headers=headers)
        answer = http.post("/v1/chat/completions", json=chat(model), headers=headers)
        legacy = http.post(
            "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2}, headers=headers
        )
        if model in names:
            assert (one.status_code, answer.status_code, legacy.status_code) == (200, 200, 200), answer.text
            assert answer.json()["model"] == model
        else:
            for r in (one, answer, legacy):
                assert r.status_code == 404, r.text
                err = r.json()["error"]
                assert (err["type"], err["code"], err["param"]) == (
                    "invalid_request_error",
                    "model_not_found",
                    None,
                )
                # word for word what a model that does not exist gets: no existence leak
                assert err["message"] == unknown.json()["error"]["message"].replace("no-such-model", model)
    return names


def test_model_access_per_tier_and_tenant(gw: GatewayProcess) -> None:
    with httpx.Client(base_url=gw.base_url, timeout=30) as http:
        # a tier without lists and no tenant: everything
        assert usable(http, bearer(token("ann"))) == {"small", "medium", "large"}
        assert usable(http, bearer(token("bob", tier="basic"))) == {"small"}
        assert usable(http, bearer(token("cid", tier="standard"))) == {"small", "medium"}
        # a tenant's deny-list narrows what the tier allows, never the other way round
        assert usable(http, bearer(token("dee", tenant="acme"))) == {"small", "large"}
        assert usable(http, bearer(token("eve", tier="standard", tenant="acme"))) == {"small"}
        assert usable(http, bearer(token("fay", tenant="other"))) == {"small", "medium"}  # tenants.default
        # an unknown tier is the default tier
        assert usable(http, bearer(token("gus", tier="no-such-tier"))) == {"small", "medium", "large"}


def test_the_sdk_sees_a_forbidden_model_as_not_found(gw: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=gw.base_url + "/v1", api_key=token("bob", tier="basic"), max_retries=0)
    assert [m.id for m in client.models.list().data] == ["small"]
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(**chat("large"))
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("medium")
    assert client.chat.completions.create(**chat("small")).model == "small"


def test_api_key_with_a_model_list_then_changed_and_audited(gw: GatewayProcess) -> None:
    with httpx.Client(base_url=gw.base_url, timeout=30) as http:
        # a key may only narrow what its tier and tenant allow
        created = http.post(
            "/admin/api-keys",
            json={"user": "svc", "tier": "standard", "allow_models": ["medium", "large"], "name": "ci"},
            headers=ADMIN,
        )
        assert created.status_code == 201, created.text
        record = created.json()
        assert (record["allow_models"], record["deny_models"]) == (["medium", "large"], [])
        key = bearer(record["key"])
        assert usable(http, key) == {"medium"}  # large: allowed by the key, not by the tier

        changed = http.put(
            f"/admin/api-keys/{record['id']}",
            json={"allow_models": None, "deny_models": ["small"]},
            headers=ADMIN,
        )
        assert changed.status_code == 200, changed.text
        assert (changed.json()["allow_models"], changed.json()["deny_models"]) == (None, ["small"])
        assert usable(http, key) == {"medium"}  # now the tier decides, minus the key's deny-list
        assert http.get(f"/admin/api-keys/{record['id']}", headers=ADMIN).json()["deny_models"] == ["small"]

        entry = http.get("/admin/audit?limit=1", headers=ADMIN).json()["entries"][0]
        assert (entry["actor"], entry["action"], entry["target"]) == ("ops", "change_api_key", record["id"])
        assert entry["before"] == {"allow_models": ["medium", "large"], "deny_models": [], "budgets": []}
        assert entry["after"] == {"allow_models": None, "deny_models": ["small"], "budgets": []}

        # bad input: a clear 400 naming the field, nothing created or changed
        typo = http.post("/admin/api-keys", json={"user": "x", "allow_models": ["smal"]}, headers=ADMIN)
        assert typo.status_code == 400 and typo.json()["error"]["param"] == "allow_models", typo.text
        assert "'smal'" in typo.json()["error"]["message"]
        bad = http.put(f"/admin/api-keys/{record['id']}", json={"deny_models": ["nope"]}, headers=ADMIN)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "deny_models"
        extra = http.put(f"/admin/api-keys/{record['id']}", json={"user": "root"}, headers=ADMIN)
        assert extra.status_code == 400, extra.text  # who a key speaks for never changes
        missing = http.put("/admin/api-keys/key_nope", json={"deny_models": []}, headers=ADMIN)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "api_key_not_found"
        user = http.put(f"/admin/api-keys/{record['id']}", json={}, headers=bearer(token("svc")))
        assert user.status_code == 403
        assert usable(http, key) == {"medium"}


def test_config_naming_an_unknown_model_fails_at_start_up() -> None:
    from gateway.settings import parse_settings

    config = access_config("http://127.0.0.1:9", "redis://127.0.0.1:9/0")
    config["limits"]["tiers"]["basic"]["allow_models"] = ["smalll"]
    with pytest.raises(
        ValueError, match=r"limits.tiers.basic names models not listed under models: \['smalll'\]"
    ):
        parse_settings(config, {})
