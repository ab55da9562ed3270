"""`/v1/audio/transcriptions` and `/v1/audio/translations` through a gateway with the real `openai`
SDK, over both engines' speech-to-text simulators: OpenAI's shapes from either engine, the upload
capped, admitted, limited, metered, and translations only where an engine serves them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from engines.sim.audio import transcript
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.engines.sim.helpers import wav
from tests.gateway.apis.conftest import TIGHT_TOKENS_PER_MINUTE, WHISPER_MODEL, WHISPER_SERVED, EngineRig
from tests.support import GatewayProcess

pytestmark = pytest.mark.processes

AUDIO = wav(3.2)
TEXT = transcript(AUDIO, "transcribe")


@pytest.fixture(scope="module")
def client(engine_rig: EngineRig) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=engine_rig.base_url + "/v1", api_key=engine_rig.alice, max_retries=0, timeout=30
    )


def _post(
    rig: EngineRig, path: str, fields: dict[str, Any], audio: bytes = AUDIO, user: str | None = None
) -> httpx.Response:
    return httpx.post(
        rig.base_url + path,
        data=fields,
        files={"file": ("speech.wav", audio, "audio/wav")},
        headers={"authorization": f"Bearer {user or rig.alice}"},
        timeout=30,
        trust_env=False,
    )


def test_json(client: openai.OpenAI, engine_rig: EngineRig) -> None:
    t = client.audio.transcriptions.create(model=WHISPER_MODEL, file=("speech.wav", AUDIO), language="en")
    assert t.text == TEXT
    raw = _post(engine_rig, "/v1/audio/transcriptions", {"model": WHISPER_MODEL})
    assert raw.headers["x-gateway-pool"] == f"{engine_rig.engine}-audio"
    assert raw.json() == {"text": TEXT, "usage": {"type": "duration", "seconds": 4}}


def test_text_is_plain_text_from_either_engine(client: openai.OpenAI) -> None:
    t = client.audio.transcriptions.create(
        model=WHISPER_MODEL, file=("speech.wav", AUDIO), response_format="text"
    )
    assert t == TEXT


def test_verbose_json(client: openai.OpenAI) -> None:
    t = client.audio.transcriptions.create(
        model=WHISPER_MODEL, file=("speech.wav", AUDIO), response_format="verbose_json", language="en"
    )
    assert t.text == TEXT and t.language == "en" and t.duration == pytest.approx(3.2)
    assert t.segments and t.segments[0].text.strip()
    assert t.usage is not None and t.usage.type == "duration" and t.usage.seconds == 4


def test_translations_where_an_engine_serves_them(client: openai.OpenAI, engine_rig: EngineRig) -> None:
    if engine_rig.engine == "vllm":
        t = client.audio.translations.create(model=WHISPER_MODEL, file=("speech.wav", AUDIO))
        assert t.text == transcript(AUDIO, "translate")
        assert _post(engine_rig, "/v1/audio/translations", {"model": WHISPER_MODEL}).json() == {
            "text": t.text
        }
    else:  # SGLang has no translations endpoint: refused before any engine
        with pytest.raises(openai.BadRequestError) as err:
            client.audio.translations.create(model=WHISPER_MODEL, file=("speech.wav", AUDIO))
        assert isinstance(err.value.body, dict) and err.value.body["param"] == "model"


@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        ({"model": WHISPER_MODEL, "response_format": "srt"}, 400, "response_format"),
        ({"model": WHISPER_MODEL, "temperature": "1.5"}, 400, "temperature"),
        ({"model": WHISPER_MODEL, "temperature": "hot"}, 400, "temperature"),
        ({"model": WHISPER_MODEL, "stream": "true"}, 400, "stream"),
        ({"model": MODEL}, 400, "model"),
        ({"model": "no-such-model"}, 404, None),
        ({}, 400, "model"),
    ],
)
def test_refused_alike_for_both_engines(
    engine_rig: EngineRig, fields: dict[str, Any], status: int, param: str | None
) -> None:
    r = _post(engine_rig, "/v1/audio/transcriptions", fields)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_the_file_part(engine_rig: EngineRig) -> None:
    no_file = httpx.post(
        engine_rig.base_url + "/v1/audio/transcriptions",
        files={"model": (None, WHISPER_MODEL)},
        headers={"authorization": f"Bearer {engine_rig.alice}"},
        trust_env=False,
    )
    assert no_file.status_code == 400 and no_file.json()["error"]["param"] == "file"
    assert (
        _post(engine_rig, "/v1/audio/transcriptions", {"model": WHISPER_MODEL}, audio=b"").status_code == 400
    )
    two_files = httpx.post(
        engine_rig.base_url + "/v1/audio/transcriptions",
        data={"model": WHISPER_MODEL},
        files={"file": ("a.wav", AUDIO), "language": ("en.txt", b"en")},
        headers={"authorization": f"Bearer {engine_rig.alice}"},
        trust_env=False,
    )
    assert two_files.status_code == 400 and two_files.json()["error"]["param"] == "language"
    as_json = engine_rig.post("/v1/audio/transcriptions", {"model": WHISPER_MODEL, "file": "x"})
    assert as_json.status_code == 400 and "multipart/form-data" in as_json.json()["error"]["message"]


def test_a_vllm_only_field(engine_rig: EngineRig) -> None:
    r = _post(
        engine_rig, "/v1/audio/transcriptions", {"model": WHISPER_MODEL, "seed": "7", "prompt": "Hello."}
    )
    if engine_rig.engine == "vllm":
        assert r.status_code == 200, r.text
    else:  # SGLang would ignore them
        assert r.status_code == 400 and r.json()["error"]["param"] in ("seed", "prompt")


def test_limited_by_the_audios_seconds(engine_rig: EngineRig) -> None:
    short = _post(
        engine_rig,
        "/v1/audio/transcriptions",
        {"model": WHISPER_MODEL},
        audio=wav(0.5),
        user=engine_rig.tight,
    )
    # 0.5 s is 25 tokens, but the model's 448 output tokens are reserved too: over the tier's 400
    assert short.status_code == 429 and short.json()["error"]["type"] == "tokens"
    assert short.headers["x-ratelimit-limit-tokens"] == str(TIGHT_TOKENS_PER_MINUTE)


def test_metered_as_seconds_and_text(engine_rig: EngineRig) -> None:
    before = _counter(engine_rig, "gateway_prompt_tokens_total")
    _post(engine_rig, "/v1/audio/transcriptions", {"model": WHISPER_MODEL})
    assert _counter(engine_rig, "gateway_prompt_tokens_total") - before == 4 * 50  # 4 s at 50 a second
    text = httpx.get(engine_rig.base_url + "/metrics", trust_env=False).text
    line = f'gateway_requests_total{{endpoint="audio.transcriptions",model="{WHISPER_MODEL}",pool="{engine_rig.engine}-audio",status="200"}}'
    assert line in text


def _counter(rig: EngineRig, name: str) -> float:
    text = httpx.get(rig.base_url + "/metrics", trust_env=False).text
    prefix = f'{name}{{model="{WHISPER_MODEL}",pool="{rig.engine}-audio"}} '
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


@pytest.fixture(scope="module")
def capped() -> Iterator[tuple[GatewayProcess, str]]:
    """A gateway whose uploads are capped at 64 KiB, over a vLLM and an SGLang speech pool."""
    with contextlib.ExitStack() as stack:
        v = stack.enter_context(fast_sim("vllm", "--model", WHISPER_SERVED, "--speech-to-text"))
        s = stack.enter_context(fast_sim("sglang", "--model", WHISPER_SERVED, "--speech-to-text"))
        config = single_pool_config("vllm", [v.base_url], sanitise={"media": {"max_bytes": 65536}})
        config["models"] = [{"name": WHISPER_MODEL, "task": "transcribe"}]
        config["pools"][0]["models"] = {WHISPER_MODEL: WHISPER_SERVED}
        config["pools"].append(
            {
                "name": "sglang",
                "dialect": "sglang",
                "models": {WHISPER_MODEL: WHISPER_SERVED},
                "backends": [{"name": "s", "url": s.base_url}],
            }
        )
        yield stack.enter_context(GatewayProcess(config)), s.base_url


def test_an_upload_over_the_cap(capped: tuple[GatewayProcess, str]) -> None:
    gw, _ = capped

    def post(audio: bytes) -> httpx.Response:
        files = {"file": ("a.wav", audio)}
        return httpx.post(
            gw.base_url + "/v1/audio/transcriptions",
            data={"model": WHISPER_MODEL},
            files=files,
            trust_env=False,
        )

    over = post(wav(3.0))  # 96 kB: a file over the cap, in a body within it and its form's room
    assert over.status_code == 413 and over.json()["error"]["param"] == "file"
    assert "65536 bytes" in over.json()["error"]["message"]
    body = post(wav(5.0))  # 160 kB: the body is refused as it grows past the cap, unread
    assert body.status_code == 413 and body.json()["error"]["code"] == "request_too_large"
    assert post(wav(1.0)).status_code == 200


def test_translations_go_only_to_the_pools_that_serve_them(capped: tuple[GatewayProcess, str]) -> None:
    gw, sglang = capped
    for i in range(8):  # recordings that differ: each its own routing key
        r = httpx.post(
            gw.base_url + "/v1/audio/translations",
            data={"model": WHISPER_MODEL},
            files={"file": ("a.wav", wav(0.5 + i / 10))},
            trust_env=False,
        )
        assert r.status_code == 200 and r.headers["x-gateway-pool"] == "vllm", r.text
    seen = httpx.get(sglang + "/sim/requests", trust_env=False).json()["requests"]
    assert not [x for x in seen if x["path"] == "/v1/audio/translations"]
