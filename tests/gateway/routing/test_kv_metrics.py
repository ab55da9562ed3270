"""The KV-event streams on `GET /metrics`: a real gateway subscribed to a real ZMQ publisher in vLLM
0.32's wire format (tests/gateway/routing/kv_publisher.py) shows what its stream did — connected,
usable, blocks held, events applied, an unfilled gap, an engine restart, an undecodable message, a
store under a parent never heard of — per backend, and nothing for a backend without events."""

from __future__ import annotations

import re

import pytest

from tests.conftest import fast_sim, single_pool_config
from tests.gateway.routing.kv_publisher import Publisher, stored
from tests.support import HTTP, GatewayProcess, wait_until

pytestmark = pytest.mark.processes


def _series(text: str, name: str, backend: str) -> float | None:
    found = re.search(rf'^{name}\{{[^}}]*backend="{backend}"[^}}]*\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else None


def test_a_streams_history_reads_off_the_metrics() -> None:
    pub = Publisher()
    try:
        with fast_sim("vllm") as s0, fast_sim("vllm") as s1:
            config = single_pool_config("vllm", [s0.base_url, s1.base_url])
            config["models"][0]["tokenizer"] = "sim"
            config["pools"][0]["backends"][0]["kv_events"] = {"endpoint": pub.endpoint, "topic": "kv"}
            with GatewayProcess(config) as gw:
                pub.wait_subscribers(1)
                pub.publish([stored(list(range(1, 65)))])  # 4 blocks
                pub.publish([stored(list(range(100, 132))), stored(list(range(200, 232)))])
                pub.publish([stored(list(range(300, 316)))], send=False)  # lost: a gap
                pub.publish([stored(list(range(400, 416)))])
                pub.restart()  # the engine restarted: its sequence starts over
                pub.publish([stored(list(range(500, 532)))])
                # under a parent never announced, and no prompt routed there to place it: an orphan
                pub.publish([stored(list(range(600, 664)), start=2)])
                pub.pub.send_multipart((pub.topic, pub.seq.to_bytes(8, "big"), b"\xc1 not msgpack"))
                want = {
                    "gateway_kv_events_total": 6.0,
                    "gateway_kv_event_gaps_total": 1.0,
                    "gateway_kv_event_restarts_total": 1.0,
                    "gateway_kv_event_errors_total": 1.0,
                    "gateway_kv_stream_connected": 1.0,
                    "gateway_kv_index_blocks": 2.0,  # what the engine stored since its restart
                    "gateway_kv_stores_orphaned_total": 1.0,
                    "gateway_kv_stores_anchored_total": 0.0,
                }

                def scrape() -> str | None:
                    text = HTTP.get(gw.base_url + "/metrics").text
                    return text if {name: _series(text, name, "vllm-0") for name in want} == want else None

                text = wait_until(scrape, what=f"the metrics {want}")
                assert _series(text, "gateway_kv_stream_usable", "vllm-0") is not None
                assert "vllm-1" not in "".join(re.findall(r"^gateway_kv_\S+", text, re.M))
    finally:
        pub.close()
