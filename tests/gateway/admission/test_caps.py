"""Output ceilings per model, tier and tenant (clamped, said in a header, or refused), limits per
model, and the spend of every user ranked — through a real gateway in front of a simulator."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engines.sim.launcher import SimProcess
from gateway.admission.tokens import mint_token
from gateway.demo import SERVED
from tests.conftest import fast_sim
from tests.support import HTTP, GatewayProcess, wait_until

pytestmark = pytest.mark.processes

SECRET = "caps-suite-secret-" + "c" * 24
ADMIN = {"authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
PRICE = {"prompt": 1.0, "completion": 2.0}


def config(sim: SimProcess, over: str = "clamp") -> dict[str, Any]:
    return {
        "server": {"graceful_shutdown_s": 1},
        "models": [
            {"name": "small", "max_tokens": 15, "price": PRICE},
            {"name": "large", "price": PRICE},
        ],
        "pools": [
            {
                "name": "p",
                "dialect": "vllm",
                "models": {"small": SERVED["vllm"], "large": SERVED["vllm"]},
                "backends": [{"name": "p-0", "url": sim.base_url}],
            }
        ],
        "auth": {"jwt": {"secret": SECRET}},
        "limits": {
            "over_max_tokens": over,
            "tiers": {
                "default": {
                    "max_tokens": 20,
                    "models": {"large": {"requests_per_minute": 2}},
                    "budgets": [{"period": "month", "tokens": 10_000_000}],  # spend is recorded
                }
            },
        },
    }


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with fast_sim("vllm") as s:
        yield s


def post(gw: GatewayProcess, user: str, model: str, **body: Any) -> httpx.Response:
    headers = {"authorization": "Bearer " + mint_token(SECRET, user)}
    payload = {"model": model, "messages": [{"role": "user", "content": "hi"}], **body}
    return HTTP.post(gw.base_url + "/v1/chat/completions", json=payload, headers=headers, timeout=10)


def asked(sim: SimProcess) -> Any:
    """The max_tokens the simulator received last."""
    last = HTTP.get(sim.base_url + "/sim/requests", params={"limit": 1}, timeout=5).json()["requests"][-1]
    return last["body"].get("max_tokens")


def test_a_request_above_a_ceiling_is_clamped_and_the_answer_says_so(sim: SimProcess) -> None:
    with GatewayProcess(config(sim)) as gw:
        r = post(gw, "alice", "large", max_tokens=100)
        assert r.status_code == 200 and r.headers["x-gateway-max-tokens"] == "20" and asked(sim) == 20
        r = post(gw, "alice", "large")  # none asked: the ceiling is the request's
        assert r.headers["x-gateway-max-tokens"] == "20" and asked(sim) == 20
        r = post(gw, "bob", "small", max_tokens=100)  # the model's own ceiling is lower
        assert r.headers["x-gateway-max-tokens"] == "15" and asked(sim) == 15
        r = post(gw, "bob", "small", max_tokens=10)
        assert r.status_code == 200 and "x-gateway-max-tokens" not in r.headers and asked(sim) == 10


def test_reject_mode_refuses_with_the_ceiling(sim: SimProcess) -> None:
    with GatewayProcess(config(sim, over="reject")) as gw:
        r = post(gw, "alice", "large", max_completion_tokens=100)
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["param"] == "max_completion_tokens" and error["code"] == "integer_above_max_value"
        assert "at most 20" in error["message"]


def test_limits_per_model_and_every_users_spend_ranked(sim: SimProcess) -> None:
    with GatewayProcess(config(sim)) as gw:
        statuses = [post(gw, "carol", "large", max_tokens=5).status_code for _ in range(3)]
        assert statuses == [200, 200, 429]
        assert post(gw, "carol", "small", max_tokens=5).status_code == 200  # another model: its own limit
        assert post(gw, "dave", "small", max_tokens=5).status_code == 200

        def ranked(**query: str) -> dict[str, Any]:
            r = HTTP.get(gw.base_url + "/admin/spend", params=query, headers=ADMIN, timeout=10)
            assert r.status_code == 200, r.text
            return dict(r.json())

        wait_until(lambda: ranked()["total"] == 2, 10, what="both users' spend reconciled")
        report = ranked()
        assert report["scope"] == "users" and report["period"]["period"] == "month"
        assert [u["user"] for u in report["users"]] == ["carol", "dave"]  # carol spent more
        assert report["users"][0]["requests"] == 3 and report["users"][0]["usd"] > report["users"][1]["usd"]
        page = ranked(limit="1", offset="1")
        assert [u["user"] for u in page["users"]] == ["dave"] and page["next_offset"] is None
        assert ranked(limit="1")["next_offset"] == 1
