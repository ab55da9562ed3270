"""The prefill a routing process has queued on a backend (`Backend.prefill`, docs/routing.md, *Queued
prefill*): a request's prompt tokens the routing expects the engine to compute count there from the
moment the request is sent until its first token comes back, then no longer, while the request stays
in flight. Against a simulator whose first token takes 3 s; read through `GET /admin/pools` and the
`gateway_backend_prefill_tokens` gauge."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import httpx
import pytest

from gateway.admission.tokens import mint_token
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.support import HTTP, GatewayProcess, wait_until

pytestmark = pytest.mark.processes

SECRET = "test-secret-for-the-queued-prefill-0123456789"
ADMIN = {"Authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}


def test_a_prompt_counts_as_queued_prefill_on_its_backend_until_its_first_token() -> None:
    slow = ("--ttft-ms", "3000", "--itl-ms", "100", "--min-output-tokens", "20", "--max-output-tokens", "20")
    with fast_sim("vllm", *slow) as sim:
        config = single_pool_config("vllm", [sim.base_url])
        config["auth"] = {"enabled": True}
        with (
            GatewayProcess(config, env={"GATEWAY_JWT_SECRET": SECRET}) as gw,
            httpx.Client(base_url=gw.base_url, headers=ADMIN, timeout=10) as client,
        ):

            def backend() -> dict[str, Any]:
                pools = client.get("/admin/pools").json()["pools"]
                return dict(pools[0]["backends"][0])

            first_at: list[float] = []
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(400))}],
                "max_tokens": 20,
                "stream": True,
            }

            def stream() -> None:
                with HTTP.stream("POST", gw.base_url + "/v1/chat/completions", json=body, headers=ADMIN) as r:
                    for _ in r.iter_bytes():
                        if not first_at:
                            first_at.append(time.monotonic())

            reader = threading.Thread(target=stream, daemon=True)
            reader.start()
            wait_until(lambda: backend()["in_flight"] == 1, 5, what="the stream in flight")
            waiting = backend()
            assert not first_at, "the first token came before the gateway was read"
            assert waiting["prefill_tokens"] > 100, waiting  # ~400 words of prompt, nothing cached

            def gauge() -> float:
                text = client.get("/metrics").text
                found = re.search(
                    r'^gateway_backend_prefill_tokens\{[^}]*backend="vllm-0"[^}]*\} (\S+)', text, re.M
                )
                return float(found[1]) if found else -1.0

            wait_until(
                lambda: gauge() == waiting["prefill_tokens"], 1, what="the gauge of the queued prefill"
            )
            wait_until(lambda: bool(first_at), 10, what="the first token")
            wait_until(lambda: backend()["prefill_tokens"] == 0, 2, what="the prefill counted as done")
            assert backend()["in_flight"] == 1, "the stream is still decoding"
            reader.join(15)
            assert not reader.is_alive()
            wait_until(lambda: backend()["in_flight"] == 0, 5, what="the stream's end")
            assert backend()["prefill_tokens"] == 0
            wait_until(lambda: gauge() == 0, 2, what="the gauge back at 0")
