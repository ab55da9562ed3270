"""A gateway per engine with the new APIs: two chat simulators, one embedding simulator, JWT auth on
(two users, so the Responses store's owner scoping can be seen), in-memory store."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from agents.models import get_default_model

from gateway.admission.tokens import mint_token
from gateway.demo import SERVED
from tests.conftest import fast_sim, single_pool_config
from tests.support import GatewayProcess, wait_until

SECRET = "apis-suite-secret-" + "y" * 32
EMBED_MODEL = "test-embed"
EMBED_SERVED = "BAAI/bge-small-en-v1.5"
EMBED_DIM = 32
#: the model the OpenAI Agents SDK uses when an agent names none (its "default model")
AGENTS_DEFAULT_MODEL = get_default_model()


def token(sub: str) -> str:
    return mint_token(SECRET, sub)


@dataclass
class Rig:
    engine: str
    gw: GatewayProcess
    alice: str
    bob: str

    @property
    def base_url(self) -> str:
        return self.gw.base_url


def apis_config(engine: str, chat_urls: list[str], embed_url: str, **overrides: Any) -> dict[str, Any]:
    config = single_pool_config(engine, chat_urls, **overrides)
    config["models"].append({"name": AGENTS_DEFAULT_MODEL, "context_length": 8192})
    config["pools"][0]["models"][AGENTS_DEFAULT_MODEL] = SERVED[engine]
    config["models"].append({"name": EMBED_MODEL, "task": "embed", "context_length": 512})
    config["pools"].append(
        {
            "name": f"{engine}-embed",
            "dialect": engine,
            "models": {EMBED_MODEL: EMBED_SERVED},
            "backends": [{"name": f"{engine}-embed-0", "url": embed_url}],
        }
    )
    config.setdefault("auth", {"jwt": {"secret": SECRET}})
    return config


def embed_sim(engine: str, *extra: str) -> Any:
    return fast_sim(
        engine, "--model", EMBED_SERVED, "--embedding-dim", str(EMBED_DIM), "--max-model-len", "512", *extra
    )


@pytest.fixture(scope="module")
def rig(engine: str) -> Iterator[Rig]:
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(fast_sim(engine))
        b = stack.enter_context(fast_sim(engine))
        e = stack.enter_context(embed_sim(engine))
        gw = stack.enter_context(GatewayProcess(apis_config(engine, [a.base_url, b.base_url], e.base_url)))
        rig = Rig(engine, gw, token("alice"), token("bob"))
        # /readyz answers once any backend is healthy: the embedding pool's one backend may still be
        # unprobed, or out after a first probe that timed out on a busy machine (seen once, 503)
        wait_until(lambda: _embeds(rig), 30, "the embedding pool to answer")
        yield rig


def _embeds(rig: Rig) -> bool:
    r = httpx.post(
        rig.base_url + "/v1/embeddings",
        json={"model": EMBED_MODEL, "input": "ready?"},
        headers={"authorization": f"Bearer {rig.alice}"},
        timeout=10,
        trust_env=False,
    )
    return r.status_code == 200


#: the tier of `EngineRig.tight`: a few hundred tokens a minute
TIGHT_TOKENS_PER_MINUTE = 400
RERANK_MODEL = "test-rerank"
RERANK_SERVED = "BAAI/bge-reranker-base"
WHISPER_MODEL = "test-whisper"
WHISPER_SERVED = "openai/whisper-large-v3"


@dataclass
class EngineRig:
    """A gateway in front of a chat, an embedding, a reranker and a speech-to-text simulator of
    `engine`, for the engines' own APIs (tokenize, detokenize, rerank, score, audio); `tight` is a
    user whose tier allows `TIGHT_TOKENS_PER_MINUTE`."""

    engine: str
    gw: GatewayProcess
    alice: str
    tight: str

    @property
    def base_url(self) -> str:
        return self.gw.base_url

    def post(self, path: str, body: dict[str, Any], user: str | None = None) -> httpx.Response:
        return httpx.post(
            self.base_url + path,
            json=body,
            headers={"authorization": f"Bearer {user or self.alice}"},
            timeout=30,
            trust_env=False,
        )


def _pool(name: str, engine: str, models: dict[str, str], url: str) -> dict[str, Any]:
    return {
        "name": name,
        "dialect": engine,
        "models": models,
        "backends": [{"name": f"{name}-0", "url": url}],
    }


@pytest.fixture(scope="module")
def engine_rig(engine: str) -> Iterator[EngineRig]:
    with contextlib.ExitStack() as stack:
        chat = stack.enter_context(fast_sim(engine))
        e = stack.enter_context(embed_sim(engine))
        limits = {"tiers": {"default": {}, "tight": {"tokens_per_minute": TIGHT_TOKENS_PER_MINUTE}}}
        rerank = stack.enter_context(
            fast_sim(engine, "--model", RERANK_SERVED, "--reranker", "--max-model-len", "512")
        )
        config = apis_config(engine, [chat.base_url], e.base_url, limits=limits)
        config["models"].append({"name": RERANK_MODEL, "task": "score", "context_length": 512})
        config["pools"].append(
            _pool(f"{engine}-rerank", engine, {RERANK_MODEL: RERANK_SERVED}, rerank.base_url)
        )
        speech = stack.enter_context(fast_sim(engine, "--model", WHISPER_SERVED, "--speech-to-text"))
        config["models"].append({"name": WHISPER_MODEL, "task": "transcribe", "default_max_tokens": 448})
        config["pools"].append(
            _pool(f"{engine}-audio", engine, {WHISPER_MODEL: WHISPER_SERVED}, speech.base_url)
        )
        gw = stack.enter_context(GatewayProcess(config))
        rig = EngineRig(engine, gw, token("alice"), mint_token(SECRET, "carol", tier="tight"))
        wait_until(lambda: _embeds(Rig(engine, gw, rig.alice, rig.alice)), 30, "the embedding pool")
        yield rig
