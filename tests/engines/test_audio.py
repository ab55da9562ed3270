"""engines.multipart and engines.audio: the form read and written, the engine request per dialect,
both engines' answers in OpenAI's shapes."""

from __future__ import annotations

import httpx
import orjson
import pytest

from engines import multipart
from engines.audio import (
    Transcript,
    Upload,
    billed_seconds,
    build_audio_request,
    decode_transcript,
    encode_transcript,
    wav_seconds,
)
from engines.errors import ApiError
from engines.multipart import Part
from engines.sglang import DIALECT as SGLANG
from engines.vllm import DIALECT as VLLM
from tests.engines.sim.helpers import wav


def _httpx_form(fields: dict[str, str | list[str]], audio: bytes) -> tuple[str, bytes]:
    """The content type and body httpx (the openai SDK's client) sends for a form upload."""
    request = httpx.Request(
        "POST", "http://x/", data=fields, files={"file": ('a "b".wav', audio, "audio/wav")}
    )
    return request.headers["content-type"], request.read()


def test_a_form_as_httpx_writes_it() -> None:
    content_type, body = _httpx_form(
        {"model": "m", "timestamp_granularities[]": ["word", "segment"]}, b"\0\r\n--x\r\n"
    )
    boundary = multipart.boundary(content_type)
    assert boundary is not None
    parts = multipart.parse(body, boundary)
    assert [(p.name, p.data) for p in parts if p.filename is None] == [
        ("model", b"m"),
        ("timestamp_granularities[]", b"word"),
        ("timestamp_granularities[]", b"segment"),
    ]
    [file] = [p for p in parts if p.filename is not None]
    assert file.name == "file" and file.filename == "a %22b%22.wav" and file.data == b"\0\r\n--x\r\n"
    assert file.content_type == "audio/wav"


def test_written_back_and_read_again() -> None:
    parts = [Part("model", "é".encode()), Part("file", b"--abc\r\n", 'x"y.wav', "audio/wav")]
    boundary = multipart.new_boundary(parts)
    again = multipart.parse(multipart.encode(parts, boundary), boundary)
    assert again == [Part("model", "é".encode()), Part("file", b"--abc\r\n", "x%22y.wav", "audio/wav")]
    assert again[0].text == "é"


@pytest.mark.parametrize(
    "body",
    [
        b"no boundary here",
        b'--b\r\nContent-Disposition: form-data; name="a"\r\n\r\nunclosed',
        b"--b\r\nContent-Disposition: form-data\r\n\r\nx\r\n--b--",  # no name
        b'--b\r\nContent-Disposition: attachment; name="a"\r\n\r\nx\r\n--b--',
        b"--bX",
        b"--b\r\n" + b'Content-Disposition: form-data; name="a"\r\n\r\nx\r\n--b\r\n' * 70,
    ],
)
def test_malformed_forms(body: bytes) -> None:
    with pytest.raises(ValueError):
        multipart.parse(body, "b")


def test_boundaries() -> None:
    assert multipart.boundary('multipart/form-data; boundary="a b"') == "a b"
    assert multipart.boundary("multipart/form-data; charset=utf-8; boundary=xyz") == "xyz"
    assert multipart.boundary("application/json") is None
    assert multipart.boundary("multipart/form-data") is None


def test_wav_duration() -> None:
    assert wav_seconds(wav(2.5)) == 2.5
    assert wav_seconds(wav(1.0, rate=8000)) == 1.0
    assert wav_seconds(wav(4.0)[:16_044]) == 0.5  # a cut file: the bytes it holds
    assert wav_seconds(b"ID3\x04 an mp3") is None and wav_seconds(b"") is None


def test_the_engine_request_per_dialect() -> None:
    upload = Upload(Part("file", b"RIFF", "a.wav", "audio/wav"), "gateway-0123")
    body = {"model": "public", "language": "en", "prompt": "", "response_format": "json", "file": upload}
    for dialect in (VLLM, SGLANG):
        sent = multipart.parse(dialect.build_request("transcriptions", body, "served"), upload.boundary)
        fields = {p.name: p.data for p in sent}
        assert fields["model"] == b"served" and fields["language"] == b"en" and fields["file"] == b"RIFF"
    assert VLLM.paths["translations"] == "/v1/audio/translations" and "translations" not in SGLANG.paths
    for field, value in (("seed", "3"), ("prompt", "Hello.")):
        assert build_audio_request({**body, field: value}, "s", "vllm")
        with pytest.raises(ApiError) as err:
            build_audio_request({**body, field: value}, "s", "sglang")
        assert err.value.param == field
    repeated = build_audio_request({**body, "timestamp_granularities[]": ["word", "segment"]}, "s", "vllm")
    names = [p.name for p in multipart.parse(repeated, upload.boundary)]
    assert names.count("timestamp_granularities[]") == 2


def test_answers_of_both_engines() -> None:
    vllm_json = b'{"text":"hi","usage":{"type":"duration","seconds":3}}'
    assert decode_transcript(vllm_json) == Transcript("hi", seconds=3)
    vllm_verbose = b'{"duration":2.5,"language":"en","text":"hi","segments":[{"id":0}],"words":null}'
    t = decode_transcript(vllm_verbose)
    assert t == Transcript("hi", "en", 2.5, [{"id": 0}], None, None) and billed_seconds(t, 9.0) == 3
    assert billed_seconds(Transcript("x"), 1.2) == 2
    with pytest.raises(ApiError):
        decode_transcript(b"hi")


def test_openais_shapes() -> None:
    t = Transcript("hi", None, 2.5, [{"id": 0}])
    assert encode_transcript(t, task="transcribe", response_format="text", seconds=3, language=None) == b"hi"
    assert orjson.loads(
        encode_transcript(t, task="transcribe", response_format="json", seconds=3, language=None)
    ) == {
        "text": "hi",
        "usage": {"type": "duration", "seconds": 3},
    }
    assert orjson.loads(
        encode_transcript(t, task="translate", response_format="json", seconds=3, language=None)
    ) == {"text": "hi"}
    verbose = orjson.loads(
        encode_transcript(t, task="transcribe", response_format="verbose_json", seconds=3, language="de")
    )
    assert verbose == {
        "task": "transcribe",
        "language": "de",
        "duration": 2.5,
        "text": "hi",
        "segments": [{"id": 0}],
        "usage": {"type": "duration", "seconds": 3},
    }
    translated = orjson.loads(
        encode_transcript(t, task="translate", response_format="verbose_json", seconds=3, language=None)
    )
    assert translated["task"] == "translate" and "usage" not in translated and translated["language"] is None
