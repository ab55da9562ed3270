"""Media URLs end to end: a real gateway in front of a vLLM and an SGLang simulator.

No client can make an engine fetch an internal address: every refused URL is a 400 naming the part,
and the simulator behind the gateway never receives the request. `data:` URLs pass as they are.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from engines.sim.launcher import SimProcess
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.support import HTTP, GatewayProcess

pytestmark = pytest.mark.processes

PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[GatewayProcess, SimProcess]]:
    with fast_sim(request.param) as sim:
        media = {"allowed_hosts": ["localhost", "*.localhost"], "max_parts": 3}
        config = single_pool_config(request.param, [sim.base_url], sanitise={"media": media})
        with GatewayProcess(config) as gateway:
            yield gateway, sim


def seen_by(sim: SimProcess) -> list[dict[str, Any]]:
    r = HTTP.get(sim.base_url + "/sim/requests", params={"limit": 1000}, timeout=5)
    return list(r.json()["requests"])


def chat(*parts: dict[str, Any]) -> dict[str, Any]:
    content = [{"type": "text", "text": "What is this?"}, *parts]
    return {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": content}]}


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def refused(gateway: GatewayProcess, sim: SimProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    before = len(seen_by(sim))
    r = HTTP.post(gateway.base_url + path, json=body)
    assert r.status_code == 400, r.text
    assert len(seen_by(sim)) == before, "the refused request reached the engine"
    return dict(r.json())


def internal_urls(gateway: GatewayProcess) -> list[str]:
    return [
        "http://169.254.169.254/latest/meta-data/",
        f"http://127.0.0.1:{gateway.port}/admin/pools",
        f"http://localhost:{gateway.port}/admin/pools",  # an allowed name that resolves to loopback
        "http://[::ffff:169.254.169.254]/",
        "http://2130706433/",
        "http://10.0.0.1/x.png",
        "file:///etc/passwd",
        "/etc/passwd",
        "data:image/png,notbase64",
    ]


def test_internal_image_urls_are_refused_naming_the_part(served: tuple[GatewayProcess, SimProcess]) -> None:
    gateway, sim = served
    for url in internal_urls(gateway):
        error = refused(gateway, sim, "/v1/chat/completions", chat(image(url)))["error"]
        assert error["type"] == "invalid_request_error", url
        assert error["param"] == "messages[0].content[1].image_url", url
        assert error["code"] == "invalid_image_url", url
        assert "messages[0].content[1].image_url" in error["message"], url


def test_parts_an_engine_reads_by_key_alone_are_checked_too(
    served: tuple[GatewayProcess, SimProcess],
) -> None:
    gateway, sim = served
    smuggled = [
        ({"image_url": "http://169.254.169.254/"}, "type"),  # untyped: vLLM would read it by its key
        ({"type": "text", "text": "x", "uuid": "u1", "video_url": {"url": "http://10.1.1.1/v"}}, "video_url"),
        ({"type": "audio_url", "audio_url": {"url": "http://192.168.0.1/a.wav"}}, "audio_url"),
        ({"type": "image_embeds", "image_embeds": "gASVAAAA"}, "image_embeds"),
        ({"type": "image_url", "image_url": None}, "image_url"),  # no URL and no uuid to reuse
    ]
    for part, key in smuggled:
        error = refused(gateway, sim, "/v1/chat/completions", chat(part))["error"]
        assert error["param"] == f"messages[0].content[1].{key}", part


def test_the_openai_sdk_gets_a_bad_request(served: tuple[GatewayProcess, SimProcess]) -> None:
    gateway, _ = served
    client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(**chat(image("http://169.254.169.254/latest/meta-data/")))
    assert raised.value.param == "messages[0].content[1].image_url"


def test_data_urls_reach_the_engine_as_they_are(served: tuple[GatewayProcess, SimProcess]) -> None:
    gateway, sim = served
    part = {**image(PNG), "uuid": "my-image"}
    r = HTTP.post(gateway.base_url + "/v1/chat/completions", json=chat(part))
    assert r.status_code == 200, r.text
    forwarded = seen_by(sim)[-1]["body"]["messages"][0]["content"][1]
    assert forwarded["image_url"]["url"] == PNG
    # a uuid names an engine-cached item: it is kept in the caller's own namespace
    assert forwarded["uuid"] not in ("my-image", None)


def test_media_item_count_and_size_are_capped(served: tuple[GatewayProcess, SimProcess]) -> None:
    gateway, sim = served
    error = refused(gateway, sim, "/v1/chat/completions", chat(*[image(PNG)] * 4))["error"]
    assert error["param"] == "messages[0].content[4].image_url" and "at most 3" in error["message"]


def test_responses_and_messages_apply_the_same_rules(served: tuple[GatewayProcess, SimProcess]) -> None:
    gateway, sim = served
    content = [{"type": "input_text", "text": "What is this?"}]
    responses = {
        "model": MODEL,
        "input": [
            {
                "role": "user",
                "content": [*content, {"type": "input_image", "image_url": "http://169.254.169.254/"}],
            }
        ],
    }
    error = refused(gateway, sim, "/v1/responses", responses)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_image_url"
    assert error["message"].startswith("Invalid image (http://169.254.169.254/): ")
    source = {"type": "url", "url": "http://169.254.169.254/latest/meta-data/"}
    messages = {
        "model": MODEL,
        "max_tokens": 2,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image", "source": source}]}
        ],
    }
    body = refused(gateway, sim, "/v1/messages", messages)
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "169.254.169.254" in body["error"]["message"]

    ok = {"type": "base64", "media_type": "image/png", "data": PNG.split(",", 1)[1]}
    messages["messages"][0]["content"][1]["source"] = ok  # type: ignore[index]
    r = HTTP.post(gateway.base_url + "/v1/messages", json=messages)
    assert r.status_code == 200, r.text
