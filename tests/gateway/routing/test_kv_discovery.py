"""Where an engine says it publishes its KV events: vLLM's `GET /kv_event_sources`, SGLang's `GET
/server_info`, in the shapes the real servers answer (vLLM 0.32, SGLang 0.5.23: ../shared/REAL_ENGINES.md,
and `tests/real_engines/test_kv_events.py` against the servers themselves)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.routing.kv_discovery import DISCOVERY, KvSource, discover_sglang, discover_vllm

pytestmark = pytest.mark.processes


def test_vllm_kv_event_sources() -> None:
    answer = {
        "0": {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": "tcp://*:5557",
            "replay_endpoint": "tcp://*:5558",
            "buffer_steps": 10000,
            "hwm": 100000,
            "max_queue_size": 100000,
            "topic": "kv",
        }
    }
    src = discover_vllm(answer, "http://10.1.2.3:8000")
    assert src == KvSource("tcp://10.1.2.3:5557", "kv", "tcp://10.1.2.3:5558")
    assert discover_vllm({}, "http://h:1") is None
    assert discover_vllm({"0": {**answer["0"], "enable_kv_cache_events": False}}, "http://h:1") is None
    two = {"0": answer["0"], "1": {**answer["0"], "endpoint": "tcp://*:5558"}}
    assert discover_vllm(two, "http://h:1") is None  # data-parallel ranks: not used
    assert discover_vllm({"0": {**answer["0"], "endpoint": "tcp://engine:6000"}}, "http://h:1") == KvSource(
        "tcp://engine:6000", "kv", "tcp://h:5558"
    )
    assert discover_vllm({"0": {**answer["0"], "endpoint": "inproc://cache"}}, "http://h:1") is None
    assert discover_vllm({"0": {**answer["0"], "replay_endpoint": None}}, "http://[::1]:8000") == KvSource(
        "tcp://[::1]:5557", "kv"
    )


#: SGLang 0.5.23's `/server_info` for `--kv-events-config '{"publisher": "zmq", "endpoint":
#: "tcp://*:35239", "topic": "kv"}'` (the keys that matter here; the real answer has ~500)
SGLANG_INFO: dict[str, Any] = {
    "version": "0.5.23",
    "dp_size": 1,
    "page_size": 1,
    "kv_events_config": '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:35239", "topic": "kv"}',
    "kv_events": {
        "publisher": "zmq",
        "endpoint_host": "*",
        "endpoint_port_base": 35239,
        "topic": "kv",
        "block_size": 1,
        "dp_size": 1,
    },
}


def test_sglang_server_info_descriptor() -> None:
    url = "http://10.1.2.3:30000"
    assert discover_sglang(SGLANG_INFO, url) == KvSource("tcp://10.1.2.3:35239", "kv")
    described = SGLANG_INFO["kv_events"]
    with_replay = {**SGLANG_INFO, "kv_events": {**described, "replay_endpoint_port_base": 35240}}
    assert discover_sglang(with_replay, url) == KvSource("tcp://10.1.2.3:35239", "kv", "tcp://10.1.2.3:35240")
    at = {**SGLANG_INFO, "kv_events": {**described, "endpoint_host": "engine-7"}}
    assert discover_sglang(at, url) == KvSource("tcp://engine-7:35239", "kv")
    for wildcard in ("0.0.0.0", "::"):
        anywhere = {**SGLANG_INFO, "kv_events": {**described, "endpoint_host": wildcard}}
        assert discover_sglang(anywhere, "http://[fd00::7]:30000") == KvSource("tcp://[fd00::7]:35239", "kv")
    v6 = {**SGLANG_INFO, "kv_events": {**described, "endpoint_host": "fd00::9"}}
    assert discover_sglang(v6, url) == KvSource("tcp://[fd00::9]:35239", "kv")


def test_sglang_without_a_usable_publisher() -> None:
    url = "http://h:30000"
    described = SGLANG_INFO["kv_events"]
    # events off: SGLang answers `kv_events: null` and `kv_events_config: null`
    assert discover_sglang({**SGLANG_INFO, "kv_events": None, "kv_events_config": None}, url) is None
    ranks = {**SGLANG_INFO, "dp_size": 2, "kv_events": {**described, "dp_size": 2}}
    assert discover_sglang(ranks, url) is None  # one cache per rank behind one URL: not used
    for bad in ({"endpoint_port_base": "35239"}, {"endpoint_port_base": 0}, {"endpoint_port_base": True},
                {"publisher": "null"}, {"endpoint_host": None}):  # fmt: skip
        assert discover_sglang({**SGLANG_INFO, "kv_events": {**described, **bad}}, url) is None, bad
    for answer in (None, [], "text", {"version": "0.5.23"}):
        assert discover_sglang(answer, url) is None


def test_sglang_without_the_descriptor_reads_its_flag() -> None:
    """Servers older than the `kv_events` key: the `--kv-events-config` JSON they were started with,
    with SGLang's defaults (`tcp://*:5557`, topic "", publisher "null")."""
    url = "http://10.1.2.3:30000"
    older = {k: v for k, v in SGLANG_INFO.items() if k != "kv_events"}
    assert discover_sglang(older, url) == KvSource("tcp://10.1.2.3:35239", "kv")

    def flag(**config: Any) -> dict[str, Any]:
        return {**older, "kv_events_config": json.dumps(config)}

    assert discover_sglang(flag(publisher="zmq"), url) == KvSource("tcp://10.1.2.3:5557")
    assert discover_sglang(flag(publisher="zmq", replay_endpoint="tcp://*:5558"), url) == KvSource(
        "tcp://10.1.2.3:5557", "", "tcp://10.1.2.3:5558"
    )
    assert discover_sglang(flag(enable_kv_cache_events=True), url) is None  # SGLang's default publisher: null
    assert discover_sglang(flag(publisher="zmq", endpoint="inproc://x"), url) is None
    assert discover_sglang({**older, "kv_events_config": "{not json"}, url) is None
    assert discover_sglang({**flag(publisher="zmq"), "dp_size": 4}, url) is None


def test_each_dialect_is_asked_at_its_own_path() -> None:
    assert {d: path for d, (path, _) in DISCOVERY.items()} == {
        "vllm": "/kv_event_sources",
        "sglang": "/server_info",
    }
