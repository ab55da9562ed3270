"""A `/v1/completions` batch (`prompt` a list of strings or of token-id lists), simulator against the
real engine of its dialect, value by value where random weights cannot matter: statuses and error
messages (pydantic's union errors by their count and, for vLLM, `param`), the choices' indexes
(`prompt * n + sample`), their echoed prompts and finish reasons, the usage's rule (each prompt's tokens
once, whatever `n`: the sum of what each prompt costs alone), and in streams each choice's chunks, its
echo first and its finish last, and the usage chunk after every choice. Generated text and token counts
(another tokenizer) are never compared, nor the streams' interleaving of choices, which the engines'
schedulers decide.

Not sent: an empty prompt among others and negative token ids. SGLang 0.5.23 serves the first and its
scheduler died on an empty or negative token array (the server exits: measured); the gateway refuses
them (engines/validate.py) and docs/engines.md records it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engines.sim.launcher import SimProcess, free_port
from tests.real_engines.cases import SERVED
from tests.real_engines.rig import ENGINE_HEADERS
from tests.real_engines.servers import EngineServer
from tests.real_engines.test_sim_vs_real import SIM_FLAGS

pytestmark = [
    pytest.mark.processes,
    pytest.mark.timeout(300),
]  # the first test may wait for a server's startup

TWO = ["Once upon a time", "The quick brown fox jumps"]
IDS = [[10, 20, 30], [40, 50]]
LONG = " ".join(["word"] * 4300)


@pytest.fixture(scope="module")
def list_sims() -> Iterator[dict[str, SimProcess]]:
    procs = {e: SimProcess(e, free_port(), [*f, "--model", SERVED, "--fast"]) for e, f in SIM_FLAGS.items()}
    for p in procs.values():
        p.start()
    try:
        yield procs
    finally:
        for p in procs.values():
            p.stop()


def post(base: str, body: dict[str, Any]) -> httpx.Response:
    full = {"model": SERVED, "max_tokens": 3, "ignore_eos": True, **body}
    return httpx.post(
        base + "/v1/completions", json=full, headers=ENGINE_HEADERS, timeout=120, trust_env=False
    )


def alone(base: str, prompt: Any) -> int:
    r = post(base, {"prompt": prompt, "max_tokens": 1})
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens"])


def whole(base: str, body: dict[str, Any]) -> dict[str, Any]:
    """What must be equal between a simulator and its engine for a whole (non-streamed) answer."""
    r = post(base, body)
    assert r.status_code == 200, r.text
    answer = r.json()
    n = body.get("n", 1)
    prompts = body["prompt"]
    usage = answer["usage"]
    return {
        "indexes": [c["index"] for c in answer["choices"]],
        "finish": [c["finish_reason"] for c in answer["choices"]],
        "echo": [
            c["text"].startswith(prompts[c["index"] // n])
            for c in answer["choices"]
            if isinstance(prompts[0], str)
        ],
        "completion_tokens": usage["completion_tokens"],
        "prompt_tokens_summed": usage["prompt_tokens"] == sum(alone(base, p) for p in prompts),
        "total": usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"],
        "keys": sorted(answer),
        "usage_keys": sorted(usage),
    }


WHOLE: dict[str, dict[str, Any]] = {
    "texts": {"prompt": TWO},
    "texts-n2": {"prompt": TWO, "n": 2},
    "token-lists": {"prompt": IDS},
    "echo": {"prompt": TWO, "echo": True},
    "logprobs": {"prompt": TWO, "logprobs": 1},
    "three-max-tokens-2": {"prompt": [*TWO, "Hello"], "max_tokens": 2},
}


@pytest.mark.parametrize("name", list(WHOLE))
def test_whole_batch_as_the_engine(
    name: str, real_engine: EngineServer, list_sims: dict[str, SimProcess]
) -> None:
    body = WHOLE[name]
    real = whole(real_engine.base_url, body)
    sim = whole(list_sims[real_engine.engine].base_url, body)
    assert sim == real


def streamed(base: str, body: dict[str, Any]) -> dict[str, Any]:
    r = post(base, {**body, "stream": True})
    assert r.status_code == 200, r.text
    events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [httpx.Response(200, content=e).json() for e in events[:-1]]
    per: dict[int, list[dict[str, Any]]] = {}
    usage_at: list[int] = []
    for k, chunk in enumerate(chunks):
        if not chunk["choices"]:
            usage_at.append(k)
            continue
        (choice,) = chunk["choices"]  # one choice per chunk
        per.setdefault(choice["index"], []).append({**choice, "usage": chunk.get("usage")})
    n = body.get("n", 1)
    out: dict[str, Any] = {
        "indexes": sorted(per),
        "finish_last": all(
            c[-1]["finish_reason"] == "length" and not any(x["finish_reason"] for x in c[:-1])
            for c in per.values()
        ),
        "usage_chunk_last": usage_at == ([len(chunks) - 1] if usage_at else []),
    }
    if body.get("echo"):
        out["echo_first"] = all(c[0]["text"].startswith(body["prompt"][i // n]) for i, c in per.items())
    if usage_at:
        usage = chunks[usage_at[0]]["usage"]
        out["usage_keys"] = sorted(usage)
        out["completion_tokens"] = usage["completion_tokens"]
        out["summed"] = usage["prompt_tokens"] == sum(alone(base, p) for p in body["prompt"])
    if (body.get("stream_options") or {}).get("continuous_usage_stats"):
        out["own_prompt"] = all(
            x["usage"]["prompt_tokens"] == alone(base, body["prompt"][i // n])
            for i, c in per.items()
            for x in c
        )
    return out


USAGE = {"include_usage": True}
STREAMED: dict[str, dict[str, Any]] = {
    "texts": {"prompt": TWO},
    "texts-usage-n2": {"prompt": TWO, "n": 2, "stream_options": USAGE},
    "token-lists-usage": {"prompt": IDS, "stream_options": USAGE},
    "echo": {"prompt": TWO, "echo": True, "stream_options": USAGE},
    "continuous": {"prompt": TWO, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
}


@pytest.mark.parametrize("name", list(STREAMED))
def test_streamed_batch_as_the_engine(
    name: str, real_engine: EngineServer, list_sims: dict[str, SimProcess]
) -> None:
    body = STREAMED[name]
    real = streamed(real_engine.base_url, body)
    sim = streamed(list_sims[real_engine.engine].base_url, body)
    assert sim == real


ERRORS: dict[str, Any] = {
    "empty-list": [],
    "list-of-empty": [[]],
    "lists-of-empty": [[], []],
    "empty-string": "",
    "list-of-empty-string": [""],
    "empty-strings": ["", ""],
    "str-then-int": ["Hello", 5],
    "int-then-str": [5, "Hello"],
    "list-then-int": [[1, 2], 3],
    "nested-str": [["Hello"]],
    "float": [1.5],
    "too-long-second": ["Hello", LONG],
    "too-long-first": [LONG, "Hello"],
}


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The error's status, message, param and type; of a stream's error event too (vLLM finds an
    empty prompt of a batch after a stream's 200: `data: {"error": …}`, then `[DONE]`)."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        events = [e.removeprefix("data: ") for e in response.text.split("\n\n") if e]
        assert events[1:] == ["[DONE]"], events
        body = {**httpx.Response(200, content=events[0]).json(), "sse": True}
    else:
        body = response.json()
    err = body.get("error", body)
    message = str(err["message"])
    # pydantic's wording carries its version: compare the count; token counts: the simulator's
    # tokenizer is not the model's
    message = message.split(":", 1)[0] if "validation error" in message else re.sub(r"\d+", "N", message)
    return {
        "status": response.status_code,
        "sse": bool(body.get("sse")),
        "message": message,
        "param": err.get("param"),
        "type": err["type"],
        "code": err.get("code"),
    }


@pytest.mark.parametrize("name", list(ERRORS))
@pytest.mark.parametrize("stream", [False, True])
def test_refused_as_the_engine(
    name: str, stream: bool, real_engine: EngineServer, list_sims: dict[str, SimProcess]
) -> None:
    body = {"prompt": ERRORS[name], "stream": stream}
    real = error_of(post(real_engine.base_url, body))
    sim = error_of(post(list_sims[real_engine.engine].base_url, body))
    assert real["status"] == 400 or real["sse"]
    assert sim == real


def test_vllm_prompt_limit(real_vllm: EngineServer, list_sims: dict[str, SimProcess]) -> None:
    body = {"prompt": ["a"] * 1025, "max_tokens": 1}
    assert error_of(post(list_sims["vllm"].base_url, body)) == error_of(post(real_vllm.base_url, body))
