"""A `/v1/completions` batch (a list of strings or of token-id lists) on both simulators: one engine
request per prompt, choice `index = prompt * n + sample`, usage summed over the prompts, streamed
chunks per choice, and each engine's errors (measured on the real servers, docs/engines.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from engines.sim.launcher import start_all, stop_all
from tests.engines.sim.helpers import post, sim, stream

pytestmark = pytest.mark.processes

TWO = ["Once upon a time", "The quick brown fox jumps over"]
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, str]]:
    procs = {
        "vllm": sim("vllm", "--enable-prompt-tokens-details"),
        "sglang": sim("sglang", "--enable-cache-report"),
    }
    start_all(list(procs.values()))
    try:
        yield {k: p.base_url for k, p in procs.items()}
    finally:
        stop_all(list(procs.values()))


def body(**extra: Any) -> dict[str, Any]:
    return {"prompt": TWO, "max_tokens": 3, "ignore_eos": True, **extra}


def alone(base: str, prompt: Any) -> int:
    r = post(base, COMPLETIONS, {"prompt": prompt, "max_tokens": 1})
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens"])


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("n", [1, 2])
def test_one_choice_per_prompt_and_sample(sims: dict[str, str], engine: str, n: int) -> None:
    base = sims[engine]
    r = post(base, COMPLETIONS, body(n=n, echo=True))
    assert r.status_code == 200, r.text
    answer = r.json()
    choices = answer["choices"]
    assert [c["index"] for c in choices] == list(range(2 * n))
    for c in choices:  # prompt-major: index = prompt * n + sample
        assert c["text"].startswith(TWO[c["index"] // n])
        assert c["finish_reason"] == "length"
    assert len({c["text"] for c in choices}) == 2 * n  # every prompt and sample answers on its own
    usage = answer["usage"]
    assert usage["prompt_tokens"] == alone(base, TWO[0]) + alone(base, TWO[1])  # once per prompt, whatever n
    assert usage["completion_tokens"] == 3 * 2 * n
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_token_id_batches_and_logprobs(sims: dict[str, str], engine: str) -> None:
    base = sims[engine]
    r = post(base, COMPLETIONS, body(prompt=[[11, 12, 13], [14, 15]], logprobs=1))
    assert r.status_code == 200, r.text
    answer = r.json()
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert all(len(c["logprobs"]["tokens"]) == 3 for c in answer["choices"])
    assert answer["usage"]["prompt_tokens"] == 5
    single = post(base, COMPLETIONS, body(prompt=[11, 12, 13])).json()  # one list of ids: one prompt
    assert [c["index"] for c in single["choices"]] == [0]
    assert single["usage"]["prompt_tokens"] == 3


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_streamed_batch(sims: dict[str, str], engine: str) -> None:
    base = sims[engine]
    evs = stream(
        base,
        COMPLETIONS,
        body(n=2, echo=True, stream_options={"include_usage": True, "continuous_usage_stats": True}),
    )
    assert evs[-1] == "[DONE]"
    usage_chunk = evs[-2]
    assert usage_chunk["choices"] == []
    chunks = evs[:-2]
    per: dict[int, list[dict[str, Any]]] = {}
    for chunk in chunks:
        (choice,) = chunk["choices"]
        per.setdefault(choice["index"], []).append(choice)
        # continuous usage counts the choice's own prompt
        expected = alone(base, TWO[choice["index"] // 2])
        assert chunk["usage"]["prompt_tokens"] == expected
    assert sorted(per) == [0, 1, 2, 3]
    for index, choices in per.items():
        assert choices[0]["text"].startswith(TWO[index // 2])  # the echo rides on the first chunk
        assert [c["finish_reason"] for c in choices][-1] == "length"
        assert all(c["finish_reason"] is None for c in choices[:-1])
    assert usage_chunk["usage"]["prompt_tokens"] == alone(base, TWO[0]) + alone(base, TWO[1])
    assert usage_chunk["usage"]["completion_tokens"] == 12


# (prompt, vLLM's status and message, SGLang's): measured on vLLM 0.32 and SGLang 0.5.23
ERRORS: list[tuple[Any, str, str]] = [
    ([], "You must pass at least one prompt", "Prompt cannot be empty"),
    ([[]], "The decoder prompt cannot be empty", "Prompt cannot be empty"),
    ([[], []], "The decoder prompt cannot be empty", "Prompt cannot be empty"),
    ([""], "The decoder prompt cannot be empty", "Prompt cannot be empty"),
    (
        "",
        "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
        "Prompt cannot be empty",
    ),
    (["Hello", 5], "5 validation errors:", "5 validation errors:"),
    ([5, "Hello"], "5 validation errors:", "5 validation errors:"),
    ([[1, 2], 3], "5 validation errors:", "5 validation errors:"),
    ([1.5], "4 validation errors:", "4 validation errors:"),
]


@pytest.mark.parametrize(("prompt", "vllm", "sglang"), ERRORS, ids=[repr(e[0]) for e in ERRORS])
def test_errors_as_each_engine(sims: dict[str, str], prompt: Any, vllm: str, sglang: str) -> None:
    for stream_it in (False, True):
        r = post(sims["vllm"], COMPLETIONS, body(prompt=prompt, stream=stream_it))
        if stream_it and vllm == "The decoder prompt cannot be empty":
            # found by vLLM's input processing, inside its stream: after the 200
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [e for e in r.text.split("\n\n") if e]
            assert events[1:] == ["data: [DONE]"]
            error = json.loads(events[0].removeprefix("data: "))["error"]
            assert error == {"message": vllm, "type": "BadRequestError", "param": None, "code": 400}
        else:
            assert r.status_code == 400, r.text
            assert r.json()["error"]["message"].startswith(vllm)
        r = post(sims["sglang"], COMPLETIONS, body(prompt=prompt, stream=stream_it))
        assert r.status_code == 400, r.text  # SGLang checks before its 200
        assert r.json()["object"] == "error"
        assert r.json()["message"].startswith(sglang)


def test_vllm_names_the_first_bad_element(sims: dict[str, str]) -> None:
    err = post(sims["vllm"], COMPLETIONS, body(prompt=[5, "Hello"])).json()["error"]
    assert err["type"] == "Bad Request"
    assert err["param"] == "body.prompt.1"
    assert "'loc': 'body.prompt.1'" in err["message"]
    sg = post(sims["sglang"], COMPLETIONS, body(prompt=[5, "Hello"])).json()
    assert "('body', 'prompt', 'list[int]', 1)" in sg["message"]


def test_vllm_prompt_count_limit(sims: dict[str, str]) -> None:
    r = post(sims["vllm"], COMPLETIONS, body(prompt=["a"] * 1025, max_tokens=1))
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith(
        "prompt list length 1025 exceeds the maximum allowed count of 1024"
    )
    assert r.json()["error"]["param"] == "prompt"
    ok = post(sims["sglang"], COMPLETIONS, body(prompt=["a"] * 1025, max_tokens=1), timeout=60)
    assert ok.status_code == 200  # SGLang has no limit
    assert len(ok.json()["choices"]) == 1025


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_too_long_prompt_anywhere_in_the_batch(sims: dict[str, str], engine: str) -> None:
    long = " ".join(["word"] * 4200)
    for prompt in (["Hello", long], [long, "Hello"]):
        r = post(sims[engine], COMPLETIONS, body(prompt=prompt))
        assert r.status_code == 400, r.text
        assert "context length" in r.text
