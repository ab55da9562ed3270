"""Two gateway replicas sharing one real redis-server: a response stored by one is read back and
continued on the other, still only by the principal that made it; limits count the new APIs and
refuse them in each API's shape (429 with `retry-after`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import anthropic
import openai
import pytest

from gateway.admission.tokens import mint_token
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.gateway.apis.conftest import SECRET
from tests.support import HTTP, GatewayProcess, RedisServer

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def replicas(redis_server: RedisServer) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    with contextlib.ExitStack() as st:
        sim = st.enter_context(fast_sim("vllm"))
        gws = []
        for _ in range(2):
            config = single_pool_config(
                "vllm",
                [sim.base_url],
                auth={"jwt": {"secret": SECRET}},
                redis={"url": redis_server.url},
                limits={"tiers": {"default": {}, "tiny": {"requests_per_minute": 2}}},
            )
            gws.append(st.enter_context(GatewayProcess(config)))
        yield gws[0], gws[1]


def _openai(gw: GatewayProcess, sub: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url + "/v1", api_key=mint_token(SECRET, sub), max_retries=0)


def test_a_response_stored_on_one_replica_is_continued_on_the_other(
    replicas: tuple[GatewayProcess, GatewayProcess],
) -> None:
    a, b = replicas
    first = _openai(a, "dora").responses.create(model=MODEL, input="Remember the number 7.")
    on_b = _openai(b, "dora")
    assert on_b.responses.retrieve(first.id).output_text == first.output_text
    second = on_b.responses.create(model=MODEL, input="Which number?", previous_response_id=first.id)
    assert second.previous_response_id == first.id and second.output_text
    # the conversation grew on b: its prompt holds the first turn as well
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    with pytest.raises(openai.NotFoundError):
        _openai(a, "eve").responses.retrieve(first.id)


def test_limits_count_the_new_apis_and_refuse_in_their_shape(
    replicas: tuple[GatewayProcess, GatewayProcess],
) -> None:
    a, b = replicas
    token = mint_token(SECRET, "tina", tier="tiny")
    ok = HTTP.post(
        a.base_url + "/v1/messages",
        json={"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": token},
    )
    assert ok.status_code == 200
    ok = HTTP.post(
        b.base_url + "/v1/responses",
        json={"model": MODEL, "input": "hi"},
        headers={"authorization": f"Bearer {token}"},
    )
    assert ok.status_code == 200  # the second of two per minute, on the other replica
    client = anthropic.Anthropic(base_url=a.base_url, api_key=token, max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as err:
        client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert isinstance(err.value.body, dict) and err.value.body["error"]["type"] == "rate_limit_error"
    assert int(err.value.response.headers["retry-after"]) >= 1
    r = HTTP.post(
        b.base_url + "/v1/embeddings",
        json={"model": MODEL, "input": "x"},
        headers={"authorization": f"Bearer {token}"},
    )
    assert r.status_code == 400  # a chat model: refused before the limiter is asked
    r = HTTP.post(
        b.base_url + "/v1/responses",
        json={"model": MODEL, "input": "hi"},
        headers={"authorization": f"Bearer {token}"},
    )
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(r.headers["retry-after"]) >= 1
