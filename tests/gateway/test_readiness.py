"""Readiness reflects capacity: a configured model that no backend can serve makes the replica not
ready, and its requests get a 503 that names the cause, with `retry-after`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from gateway.admission.tokens import mint_token
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.support import HTTP, GatewayProcess

pytestmark = pytest.mark.processes

SECRET = "readiness-suite-secret-" + "q" * 24
ADMIN = {"authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(fast_sim("vllm")).base_url for _ in range(2)]
        config = single_pool_config("vllm", urls, auth={"jwt": {"secret": SECRET}})
        config["upstream"]["health"]["interval_s"] = 3  # the retry-after a drained fleet answers
        yield stack.enter_context(GatewayProcess(config))


def drain(gw: GatewayProcess, name: str, draining: bool) -> None:
    r = HTTP.put(f"{gw.base_url}/admin/backends/{name}/drain", json={"draining": draining}, headers=ADMIN)
    assert r.status_code == 200, r.text


def test_a_model_without_a_routable_backend_is_not_ready_and_says_why(gateway: GatewayProcess) -> None:
    assert HTTP.get(gateway.base_url + "/readyz").json() == {"status": "ready"}
    drain(gateway, "vllm-0", True)
    assert HTTP.get(gateway.base_url + "/readyz").status_code == 200  # one backend still serves it
    drain(gateway, "vllm-1", True)
    try:
        r = HTTP.get(gateway.base_url + "/readyz")
        assert r.status_code == 503
        assert r.json() == {
            "status": "not ready",
            "reasons": [f"model {MODEL}: no routable backend (2 draining)"],
        }
        r = HTTP.post(gateway.base_url + "/v1/chat/completions", json=CHAT, headers=ADMIN, timeout=10)
        assert r.status_code == 503
        error = r.json()["error"]
        assert error["code"] == "no_backend" and error["type"] == "server_error"
        assert (
            error["message"]
            == f"No backend can serve the model `{MODEL}` now (2 draining). You can retry your request."
        )
        assert r.headers["retry-after"] == "3"
    finally:
        drain(gateway, "vllm-0", False)
        drain(gateway, "vllm-1", False)
    assert HTTP.get(gateway.base_url + "/readyz").status_code == 200
