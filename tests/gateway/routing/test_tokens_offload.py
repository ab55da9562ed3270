"""The route stage tokenizes a long prompt in its worker thread and still routes by the engines' KV
events: a real gateway with a Hugging Face tokenizer in front of two vLLM simulators, whose events
come from publishers on real ZMQ sockets announcing the document's blocks, tokenized as the gateway
tokenizes them, on the backend that is not the document's home."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.admission.tokens import mint_token
from gateway.routing.tokens import HfTokenizer, PromptTokens
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.gateway.routing.kv_publisher import Publisher, stored
from tests.gateway.routing.local_tokenizer import save_tokenizer
from tests.gateway.routing.test_kv_routing_e2e import events_applied, home_of
from tests.support import GatewayProcess, wait_until

pytestmark = pytest.mark.processes

SECRET = "test-secret-for-tokenize-offload-0123456789"
ADMIN = {"Authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tokenizer(tmp_path_factory.mktemp("tok"), CHATML, vocab_size=500)


@pytest.fixture
def fleet(tokenizer_dir: Path) -> Iterator[tuple[GatewayProcess, list[Publisher]]]:
    pubs = [Publisher(), Publisher()]
    try:
        with fast_sim("vllm") as s0, fast_sim("vllm") as s1:
            config = single_pool_config("vllm", [s0.base_url, s1.base_url])
            config["models"][0]["tokenizer"] = str(tokenizer_dir)
            for backend, pub in zip(config["pools"][0]["backends"], pubs, strict=True):
                backend["kv_events"] = {"endpoint": pub.endpoint, "topic": "kv"}
            with GatewayProcess(config, env={"GATEWAY_JWT_SECRET": SECRET}) as gw:
                for pub in pubs:
                    pub.wait_subscribers(1)
                yield gw, pubs
    finally:
        for pub in pubs:
            pub.close()


def ask(doc: str, question: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"{doc}\n\n{question}"}],
        "max_tokens": 4,
    }


def test_long_prompts_tokenized_in_the_worker_are_routed_by_the_events(
    fleet: tuple[GatewayProcess, list[Publisher]], tokenizer_dir: Path
) -> None:
    gw, pubs = fleet
    rng = random.Random(5)
    doc = " ".join(f"w{rng.randrange(5000)}" for _ in range(1500))  # ~9k characters: the worker's
    names = ["vllm-0", "vllm-1"]
    holder = 1 - names.index(home_of(ask(doc, "question 0"), names))
    # the holder's engine stored the document (as the gateway tokenizes it: a question's own
    # tokens start after the document's, so its blocks are the shared prefix)
    prompt = PromptTokens({MODEL: HfTokenizer(tokenizer_dir)}).blocks(ask(doc, "question 0"))
    assert prompt is not None and prompt.tokens > 1000
    applied = events_applied(gw, names[holder])
    pubs[holder].publish([stored(prompt.token_ids())])
    wait_until(lambda: events_applied(gw, names[holder]) > applied, what="the event applied")

    routes = []
    with httpx.Client(base_url=gw.base_url, timeout=10) as http:
        for i in range(1, 9):
            r = http.post("/v1/chat/completions", json=ask(doc, f"question {i}"), headers=ADMIN)
            assert r.status_code == 200, r.text
            routes.append(r.headers["x-gateway-route"])
        # a short prompt is tokenized inline and routed as before (nothing held: home)
        r = http.post("/v1/chat/completions", json=ask("hello", "a short one"), headers=ADMIN)
        assert r.status_code == 200, r.text
        explained = http.post("/admin/routes/explain", json=ask(doc, "question 9"), headers=ADMIN).json()
    assert routes == ["default+affinity:index"] * 8, f"holder {holder}: {routes}\n{gw.log()[-2000:]}"
    assert explained["backend"] == names[holder], explained
    # every long question went through the worker (the short one and the dry run did not)
    assert explained["tokenize"] == {"offloaded": 8, "overflowed": 0}, explained
