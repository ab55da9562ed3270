"""Admin answers tell the resulting state: the tiers a key may name, each value's source (the file or
an override) and its return to the file's, and no API documentation to strangers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.admission.tokens import mint_token
from tests.conftest import fast_sim, single_pool_config
from tests.support import HTTP, GatewayProcess

pytestmark = pytest.mark.processes

SECRET = "admin-answers-secret-" + "a" * 24
ADMIN = {"authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}


def config(urls: list[str], **server: Any) -> dict[str, Any]:
    c = single_pool_config(
        "vllm",
        urls,
        auth={"jwt": {"secret": SECRET}},
        limits={"tiers": {"default": {}, "pro": {"requests_per_minute": 100}}},
    )
    c["pools"][0]["weight"] = 0.5
    c["server"].update(server)
    return c


@pytest.fixture(scope="module")
def urls() -> Iterator[list[str]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(fast_sim("vllm")).base_url for _ in range(2)]


@pytest.fixture(scope="module")
def http(urls: list[str]) -> Iterator[httpx.Client]:
    with (
        GatewayProcess(config(urls)) as gw,
        httpx.Client(base_url=gw.base_url, headers=ADMIN, timeout=10) as c,
    ):
        yield c


def test_api_keys_name_only_configured_tiers(http: httpx.Client) -> None:
    r = http.post("/admin/api-keys", json={"user": "bob", "tier": "platinum"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tier" and "default, pro" in error["message"]
    created = http.post("/admin/api-keys", json={"user": "bob"}).json()
    assert created["tier"] == "default"  # the tier of principals without one
    listed = http.get("/admin/api-keys").json()
    assert listed["tiers"] == ["default", "pro"] and listed["default_tier"] == "default"


def test_writes_answer_the_resulting_state_with_its_source(http: httpx.Client) -> None:
    r = http.put("/admin/pools/vllm/weight", json={"weight": 0.25}).json()
    assert (r["ok"], r["persisted"]) == (True, True)
    assert (r["pool"]["weight"], r["pool"]["weight_source"]) == (0.25, "override")
    r = http.delete("/admin/pools/vllm/weight").json()
    assert (r["pool"]["weight"], r["pool"]["weight_source"]) == (0.5, "file")

    r = http.put("/admin/backends/vllm-0/drain", json={"draining": True}).json()
    assert (r["backend"]["draining"], r["backend"]["draining_source"]) == (True, "override")
    r = http.put("/admin/backends/vllm-0/drain", json={"draining": False}).json()
    assert (r["backend"]["draining"], r["backend"]["draining_source"]) == (False, "file")

    r = http.post("/admin/pools/vllm/backends", json={"name": "extra", "url": "http://127.0.0.1:9"})
    assert r.status_code == 201 and r.json()["backend"]["source"] == "override"
    assert http.delete("/admin/backends/extra").json()["removed"] == "extra"
    r = http.delete("/admin/backends/vllm-1").json()
    assert http.get("/admin/pools").json()["removed_backends"] == ["vllm-1"]
    audit = [e["action"] for e in http.get("/admin/audit").json()["entries"]]
    assert audit[:6] == [
        "remove_backend",
        "remove_backend",
        "add_backend",
        "undrain",
        "drain",
        "reset_weight",
    ]


def test_api_documentation_is_off_unless_asked(http: httpx.Client, urls: list[str]) -> None:
    for path in ("/openapi.json", "/docs"):
        assert http.get(path).status_code == 404
        assert http.get(path, headers={"authorization": ""}).status_code == 404
    with GatewayProcess(config(urls, api_docs=True)) as gw:
        doc = HTTP.get(gw.base_url + "/openapi.json", timeout=10).json()
        assert "/v1/chat/completions" in doc["paths"] and "/admin/pools" in doc["paths"]
        assert HTTP.get(gw.base_url + "/docs", timeout=10).status_code == 200


def test_an_api_keys_class_must_be_defined_and_is_the_class_of_its_requests(
    http: httpx.Client, urls: list[str]
) -> None:
    r = http.post("/admin/api-keys", json={"user": "carol", "priority_class": "urgent"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority_class", r.text
    created = http.post("/admin/api-keys", json={"user": "carol", "priority_class": "batch"})
    assert created.status_code == 201 and created.json()["priority_class"] == "batch", created.text
    body = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    chat = http.post(
        "/v1/chat/completions", json=body, headers={"authorization": "Bearer " + created.json()["key"]}
    )
    assert chat.status_code == 200, chat.text
    explained = http.post("/admin/routes/explain", json=body, headers={"x-gateway-priority": "batch"})
    assert explained.json()["flow"]["class"] == "batch" and explained.json()["flow"]["state"] == "free"
    flow = http.get("/admin/flow").json()
    assert list(flow["classes"]) == ["interactive", "standard", "batch"] and flow["enabled"] is True
    assert flow["classes"]["batch"]["max_kv_use"] == 0.8 and flow["classes"]["standard"]["max_kv_use"] is None
