"""`POST /admin/reload` tells the truth: a broken file changes nothing and says why; a good one
applies what can change live, on every replica, and names what needs a restart."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from gateway.admission.tokens import mint_token
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.support import HTTP, GatewayProcess, RedisServer

pytestmark = pytest.mark.processes

SECRET = "reload-suite-secret-" + "r" * 24
ADMIN = {"authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
USER = {"authorization": "Bearer " + mint_token(SECRET, "alice")}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    with contextlib.ExitStack() as stack:
        sim = stack.enter_context(fast_sim("vllm"))
        redis = stack.enter_context(RedisServer())

        def config() -> dict[str, Any]:
            return single_pool_config(
                "vllm",
                [sim.base_url],
                redis={"url": redis.url},
                auth={"jwt": {"secret": SECRET}},
                limits={"tiers": {"default": {"requests_per_minute": 1000}}},
            )

        yield stack.enter_context(GatewayProcess(config())), stack.enter_context(GatewayProcess(config()))


def reload(gw: GatewayProcess) -> httpx.Response:
    return HTTP.post(gw.base_url + "/admin/reload", headers=ADMIN)


def weight(gw: GatewayProcess) -> float:
    return float(
        HTTP.get(gw.base_url + "/admin/pools", headers=ADMIN, timeout=5).json()["pools"][0]["weight"]
    )


def test_a_broken_file_changes_nothing_and_says_where(pair: tuple[GatewayProcess, GatewayProcess]) -> None:
    a, _ = pair
    good = a.config_path.read_text()
    try:
        broken = yaml.safe_load(good)
        broken["pools"][0]["dialct"] = broken["pools"][0].pop("dialect")
        broken["pools"][0]["weight"] = 0.3
        a.config_path.write_text(yaml.safe_dump(broken))
        r = reload(a)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "invalid_config" and error["type"] == "invalid_request_error"
        keys = {p["key"]: p for p in error["problems"]}
        assert keys["pools[0].dialct"]["message"] == "unknown key (did you mean 'dialect'?)"
        assert keys["pools[0].dialct"]["line"] > 0 and keys["pools[0].dialct"]["file"] == str(a.config_path)
        assert "did you mean 'dialect'" in error["message"]
        assert weight(a) == 1.0

        a.config_path.write_text("pools: [\n")
        r = reload(a)
        assert r.status_code == 400 and r.json()["error"]["problems"][0]["message"].startswith(
            "not valid YAML"
        )
        audit = HTTP.get(a.base_url + "/admin/audit", headers=ADMIN, timeout=5).json()["entries"]
        assert [e["action"] for e in audit[:2]] == ["reload_refused", "reload_refused"]
    finally:
        a.config_path.write_text(good)


def test_a_good_file_applies_live_everywhere_and_names_what_needs_a_restart(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    a, b = pair
    for gw in (a, b):  # the file every replica reads (a ConfigMap, say) changes
        config = yaml.safe_load(gw.config_path.read_text())
        config["limits"]["tiers"]["default"]["requests_per_minute"] = 2
        config["pools"][0]["weight"] = 0.4
        config["server"]["workers"] = 2
        gw.config_path.write_text(yaml.safe_dump(config))
    r = reload(a)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert {"limits.tiers.default.requests_per_minute", "pools[0].weight", "server.workers"} <= set(
        answer["changed"]
    )
    assert set(answer["applied"]) == {"limits.tiers.default.requests_per_minute", "pools[0].weight"}
    assert answer["restart_required"] == ["server.workers"]
    assert len(answer["replicas"]) == 2  # both replicas reported within the answer's wait
    for report in answer["replicas"].values():
        assert report["restart_required"] == ["server.workers"]
    assert weight(a) == weight(b) == 0.4
    # the tier's new limit holds at once on the other replica
    statuses = [
        HTTP.post(b.base_url + "/v1/chat/completions", json=CHAT, headers=USER, timeout=10).status_code
        for _ in range(3)
    ]
    assert statuses == [200, 200, 429]
