"""The simulators' speech to text, in each engine's dialect (real simulator processes)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engines.sim.audio import duration, transcript
from tests.conftest import fast_sim
from tests.engines.sim.helpers import wav
from tests.support import HTTP

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, str]]:
    with (
        fast_sim("vllm", "--speech-to-text", "--model", "whisper") as v,
        fast_sim("sglang", "--speech-to-text", "--model", "whisper") as s,
        fast_sim("vllm") as plain_v,
        fast_sim("sglang") as plain_s,
    ):
        yield {
            "vllm": v.base_url,
            "sglang": s.base_url,
            "plain_vllm": plain_v.base_url,
            "plain_sglang": plain_s.base_url,
        }


def _post(url: str, data: dict[str, Any] | None = None, audio: bytes | None = None) -> httpx.Response:
    files = {"file": ("a.wav", audio if audio is not None else wav(3.2), "audio/wav")}
    return HTTP.post(url, data=data or {}, files=files, timeout=10)


def test_the_transcript_is_the_recordings() -> None:
    audio = wav(4.0)
    assert duration(audio) == 4.0 and duration(b"\1" * 32_000) == 2.0
    assert transcript(audio, "transcribe") == transcript(audio, "transcribe")
    assert transcript(audio, "transcribe") != transcript(wav(4.5), "transcribe")
    assert len(transcript(audio, "transcribe").split()) == 10  # 2.5 words a second


def test_json_and_text_in_each_dialect(sims: dict[str, str]) -> None:
    text = transcript(wav(3.2), "transcribe")
    for engine in ("vllm", "sglang"):
        r = _post(sims[engine] + "/v1/audio/transcriptions", {"model": "whisper"})
        assert r.status_code == 200, r.text
        assert r.json() == {"text": text, "usage": {"type": "duration", "seconds": 4}}
    assert (
        _post(sims["vllm"] + "/v1/audio/transcriptions", {"response_format": "text"}).json()["text"] == text
    )
    plain = _post(sims["sglang"] + "/v1/audio/transcriptions", {"response_format": "text"})
    assert plain.headers["content-type"].startswith("text/plain") and plain.text == text


def test_verbose_json_in_each_dialect(sims: dict[str, str]) -> None:
    v = _post(
        sims["vllm"] + "/v1/audio/transcriptions", {"response_format": "verbose_json", "language": "de"}
    ).json()
    assert set(v) == {"duration", "language", "text", "segments", "words"} and v["language"] == "de"
    assert v["words"] is None and {"seek", "tokens", "avg_logprob"} <= set(v["segments"][0])
    s = _post(sims["sglang"] + "/v1/audio/transcriptions", {"response_format": "verbose_json"}).json()
    assert s["task"] == "transcribe" and s["usage"] == {"type": "duration", "seconds": 4}
    assert set(s["segments"][0]) == {"id", "start", "end", "text"}


def test_translations_are_vllms(sims: dict[str, str]) -> None:
    r = _post(sims["vllm"] + "/v1/audio/translations")
    assert r.status_code == 200 and r.json() == {"text": transcript(wav(3.2), "translate")}
    assert _post(sims["sglang"] + "/v1/audio/translations").status_code == 404


def test_each_dialects_refusals(sims: dict[str, str]) -> None:
    assert _post(sims["plain_vllm"] + "/v1/audio/transcriptions").status_code == 404
    assert _post(sims["plain_sglang"] + "/v1/audio/transcriptions").status_code == 500
    r = _post(sims["vllm"] + "/v1/audio/transcriptions", {"response_format": "srt"})
    assert r.status_code == 400 and "only support response_format" in r.json()["error"]["message"]
    r = _post(sims["sglang"] + "/v1/audio/transcriptions", {"response_format": "vtt"})
    assert r.status_code == 400 and r.json() == {
        "error": {"message": "Only 'json', 'text', and 'verbose_json' formats supported"}
    }
    assert _post(sims["vllm"] + "/v1/audio/transcriptions", {"model": "other"}).status_code == 404
