"""`POST /v1/audio/transcriptions` and `POST /v1/audio/translations` on a model whose `task` is
`transcribe`, in OpenAI's shapes from either engine (`engines.audio`).

    AudioIntake    after the form parse stage (`multipart/form-data`, the body capped at
                   the largest media item, `sanitise.media.max_bytes`, plus `FORM_BYTES`): a
                   `file` part of at most that largest item, not empty; `response_format` json | text | verbose_json;
                   `temperature` 0..1; `language` and `prompt` text; `stream` is refused (answers
                   come whole). The file goes upstream in a new form whose boundary it does not hold.
    AudioAnswer    the engine's answer → OpenAI's (`text` as text/plain).

Tokens: audio counts `AUDIO_TOKENS_PER_SECOND` a second. Admission reserves the file's estimated
duration (a PCM WAV header's, else `ASSUMED_BYTES_PER_SECOND`) plus the prompt, and the model's
`default_max_tokens` of output; the usage billed is the engine's duration (whole seconds, rounded up,
as OpenAI bills) and the transcript's estimated tokens. Routing keys on the file's digest, so the
same recording meets the engine that has seen it.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Any

from engines.audio import (
    FORMATS,
    Task,
    Upload,
    billed_seconds,
    decode_transcript,
    encode_transcript,
    wav_seconds,
)
from engines.base import Dialect, StreamWriter, Usage
from engines.errors import ApiError, invalid_request
from engines.multipart import Part, new_boundary
from gateway.apis.checks import invalid_value, missing, type_error, unsupported
from gateway.apis.plain import hand_over
from gateway.core.context import RequestContext, session_header
from gateway.core.responses import JSON, Response
from policies.features import FeatureConfig, extract_features

#: tokens a second of audio counts for limits, budgets and metrics: Whisper's encoder, whose 30 s
#: window is 1,500 positions
AUDIO_TOKENS_PER_SECOND = 50
#: the duration estimate of a file without a readable WAV header: 128 kbit/s, a common rate of
#: compressed speech (the engine's duration settles the bill)
ASSUMED_BYTES_PER_SECOND = 16_000
#: room for the form's text fields beside the file in the body's cap
FORM_BYTES = 64 * 1024
TEXT = b"text/plain; charset=utf-8"
_TRUE = ("true", "1", "yes", "on")


def estimated_seconds(data: bytes) -> float:
    seconds = wav_seconds(data)
    return seconds if seconds is not None else len(data) / ASSUMED_BYTES_PER_SECOND


class AudioAnswer:
    """`gateway.core.answer.Answer` for one transcription or translation (never streamed)."""

    __slots__ = ("_bytes_per_token", "_estimate", "_format", "_language", "_task", "content_type")
    finish_reasons: tuple[str, ...] = ()

    def __init__(
        self, task: Task, response_format: str, estimate_s: float, language: str | None, bytes_per_token: int
    ) -> None:
        self._task = task
        self._format = response_format
        self._estimate = estimate_s
        self._language = language
        self._bytes_per_token = bytes_per_token
        self.content_type = TEXT if response_format == "text" else JSON

    def body(self, dialect: Dialect, data: bytes) -> tuple[bytes, Usage]:
        t = decode_transcript(data)
        seconds = billed_seconds(t, self._estimate)
        out = encode_transcript(
            t, task=self._task, response_format=self._format, seconds=seconds, language=self._language
        )
        text_tokens = -(-len(t.text.encode()) // self._bytes_per_token)
        return out, Usage(prompt_tokens=seconds * AUDIO_TOKENS_PER_SECOND, completion_tokens=text_tokens)

    def stream(self) -> StreamWriter:  # pragma: no cover - the intake never sets ctx.stream
        raise invalid_request("Streamed transcriptions are not supported by this gateway.", param="stream")

    async def complete(self) -> None:
        return None


class AudioIntake:
    name = "audio"

    def __init__(self, task: Task, max_file_bytes: int, features: FeatureConfig) -> None:
        self._task = task
        self._max = max_file_bytes
        self._features = features

    async def __call__(self, ctx: RequestContext) -> Response | None:
        body = ctx.body
        model = ctx.model
        assert model is not None, "the parse stage resolves the model"
        file = body.get("file")
        if file is None:
            raise missing("file")
        if not isinstance(file, Part):
            raise type_error("file", "a file", file)
        if len(file.data) > self._max:
            raise ApiError(
                413,
                f"The audio file is larger than the maximum of {self._max} bytes.",
                param="file",
                code="request_too_large",
            )
        if not file.data:
            raise invalid_request("Invalid 'file': the file is empty.", param="file", code="invalid_value")
        for name, value in body.items():
            if name != "file" and _has_file(value):
                raise invalid_request(
                    f"Invalid type for '{name}': expected a text value, but got a file instead.",
                    param=name,
                    code="invalid_type",
                )
        fmt = body.get("response_format", "json")
        if fmt not in FORMATS:
            raise invalid_value("response_format", fmt, FORMATS)
        _temperature(body.get("temperature"))
        if str(body.get("stream", "")).lower() in _TRUE:
            raise unsupported("stream", "A streamed transcription")
        body["response_format"] = "verbose_json" if fmt == "verbose_json" else "json"
        seconds = estimated_seconds(file.data)
        prompt = body.get("prompt")
        tokens = math.ceil(seconds * AUDIO_TOKENS_PER_SECOND)
        if isinstance(prompt, str):
            tokens += -(-len(prompt.encode()) // self._features.bytes_per_token)
        # the file's digest keys routing: the same recording goes where it went before
        key = f"audio:{zlib.crc32(file.data):08x}:{len(file.data)}"
        features = extract_features(
            {"model": model.name, "prompt": key}, self._features, session_key=session_header(ctx)
        )
        texts = [Part(k, str(v).encode()) for k, v in body.items() if k != "file"]
        upload = Upload(file, new_boundary([file, *texts]))
        body["file"] = upload
        ctx.upstream_type = upload.content_type
        hand_over(ctx, dataclasses.replace(features, prompt_tokens=tokens))
        language = body.get("language")
        ctx.answer = AudioAnswer(
            self._task,
            fmt,
            seconds,
            language if isinstance(language, str) else None,
            self._features.bytes_per_token,
        )
        return None


def _has_file(value: Any) -> bool:
    return isinstance(value, Part) or (isinstance(value, list) and any(isinstance(v, Part) for v in value))


def _temperature(value: Any) -> None:
    if value is None:
        return
    try:
        t = float(value)
    except ValueError:
        raise type_error("temperature", "a decimal", value) from None
    if not 0 <= t <= 1:
        raise invalid_request(
            f"Invalid 'temperature': expected a value between 0 and 1, but got {value} instead.",
            param="temperature",
            code="invalid_value",
        )
