"""Nothing about KV events or tokenization may fail a request.

Real gateways and simulators under a steady stream of requests while the event publishers send
garbage, die and come back; a chat template that raises for some requests; a tokenizer path that is
not there (a start-up error that names it, before any worker starts).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import msgpack
import pytest
import yaml

from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.gateway.routing.kv_publisher import Publisher, stored
from tests.gateway.routing.local_tokenizer import save_tokenizer
from tests.support import GatewayProcess, wait_until

pytestmark = pytest.mark.processes


class Load:
    """Client threads sending chat requests (conversations of growing length) until stopped."""

    def __init__(self, base_url: str, threads: int = 3) -> None:
        self.base_url = base_url
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def answered(self, more: int) -> None:
        """Wait until `more` requests more have been answered (the chaos so far held for that many)."""
        wanted = len(self.statuses) + more
        wait_until(lambda: len(self.statuses) >= wanted, what=f"{more} more answers")

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=self.base_url, timeout=20) as http:
            while not self._stop.is_set():
                doc = " ".join(f"w{rng.randrange(300)}" for _ in range(rng.randrange(20, 400)))
                messages = [
                    {"role": "system", "content": "Answer briefly."},
                    {"role": "user", "content": doc},
                ]
                for turn in range(3):
                    try:
                        r = http.post(
                            "/v1/chat/completions",
                            json={"model": MODEL, "messages": messages, "max_tokens": 3, "stream": turn == 1},
                        )
                        self.statuses.append(r.status_code)
                        if r.status_code != 200:
                            self.errors.append(r.text[:300])
                    except httpx.HTTPError as exc:
                        self.statuses.append(0)
                        self.errors.append(repr(exc))
                    messages += [
                        {"role": "assistant", "content": "ok"},
                        {"role": "user", "content": f"and {turn}?"},
                    ]

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def garbage(pub: Publisher, rng: random.Random) -> None:
    """Everything a broken or hostile publisher could send, once each."""
    topic = pub.topic
    sends: list[tuple[bytes, ...]] = [
        (topic,),
        (topic, b"x"),
        (topic, b"\x00" * 8, b"\xc1\xc1", b"extra"),
        (topic, (pub.seq + 1000).to_bytes(8, "big"), b"\xc1 not msgpack"),  # a jump, undecodable
        (topic, (2**63 - 1).to_bytes(8, "big"), msgpack.packb({"not": "a batch"})),
        (topic, b"", msgpack.packb([0.0, "events?", 0])),
        (
            topic,
            (3).to_bytes(8, "big"),
            msgpack.packb([0.0, [{"type": "BlockStored", "medium": ["GPU"]}, 5, None]]),
        ),
        (topic, (4).to_bytes(8, "big"), bytes(rng.randrange(256) for _ in range(200))),
    ]
    for frames in sends:
        pub.pub.send_multipart(frames)
    pub.publish([{"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": 99, "token_ids": [1] * 32,
                  "block_size": 16}])  # fmt: skip
    pub.publish([{"type": "BlockRemoved", "block_hashes": list(range(10_000))}, {"type": "AllBlocksCleared"}])


def test_dying_and_garbled_event_streams_fail_no_request() -> None:
    rng = random.Random(5)
    pubs = [Publisher(replay=True), Publisher()]
    try:
        with fast_sim("vllm") as s0, fast_sim("vllm") as s1:
            config = single_pool_config("vllm", [s0.base_url, s1.base_url])
            config["models"][0]["tokenizer"] = "sim"
            config["server"]["workers"] = 2
            for backend, pub in zip(config["pools"][0]["backends"], pubs, strict=True):
                backend["kv_events"] = {
                    "endpoint": pub.endpoint,
                    "topic": "kv",
                    "replay_endpoint": pub.replay_endpoint,
                }
            with GatewayProcess(config) as gw:
                for pub in pubs:
                    pub.wait_subscribers(2)
                with Load(gw.base_url) as load:
                    for _ in range(3):
                        garbage(pubs[0], rng)
                        pubs[1].publish([stored([rng.randrange(1, 5000) for _ in range(64)])])
                        load.answered(2)
                    port = pubs[0].port
                    pubs[0].close()  # the engine's publisher dies
                    load.answered(5)
                    pubs[1].close()
                    load.answered(5)
                    pubs[0] = Publisher(port=port)  # and comes back, sequence from 0
                    pubs[0].wait_subscribers(2)
                    garbage(pubs[0], rng)
                    load.answered(5)
                assert len(load.statuses) >= 20, load.statuses
                assert set(load.statuses) == {200}, load.errors[:5]
                log = gw.log()
                assert "Traceback" not in log, log[-3000:]
                assert "KV events of vllm-0" in log  # what went wrong was said
    finally:
        for pub in pubs:
            pub.close()


CHATML_ONE_TURN = (
    "{% if messages|length > 2 %}{{ raise_exception('this template takes one question') }}{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE trained here on local text (no download), whose template raises past one turn."""
    return save_tokenizer(tmp_path_factory.mktemp("tok"), CHATML_ONE_TURN, vocab_size=400)


def test_a_template_that_raises_fails_no_request(tokenizer_dir: Path) -> None:
    pub = Publisher()
    try:
        with fast_sim("vllm") as s0, fast_sim("vllm") as s1:
            config = single_pool_config("vllm", [s0.base_url, s1.base_url])
            config["models"][0]["tokenizer"] = str(tokenizer_dir)
            config["pools"][0]["backends"][0]["kv_events"] = {"endpoint": pub.endpoint, "topic": "kv"}
            with GatewayProcess(config) as gw:
                with Load(gw.base_url, threads=2) as load:
                    pub.wait_subscribers(1)
                    load.answered(10)
                assert len(load.statuses) >= 10 and set(load.statuses) == {200}, load.errors[:5]
                log = gw.log()
                assert "this template takes one question" in log and "Traceback" not in log, log[-2000:]
    finally:
        pub.close()


def test_a_missing_tokenizer_is_a_start_up_error_that_names_it(tmp_path: Path) -> None:
    config = single_pool_config("vllm", ["http://127.0.0.1:9"])
    config["models"][0]["tokenizer"] = str(tmp_path / "no-such-model")
    config["server"]["workers"] = 2
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert proc.returncode != 0
    assert f"model {MODEL!r}: tokenizer {str(tmp_path / 'no-such-model')!r} is not a directory" in proc.stderr
    assert "Traceback" not in proc.stderr and "Started" not in proc.stderr
