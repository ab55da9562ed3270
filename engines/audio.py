"""`/v1/audio/transcriptions` and `/v1/audio/translations` on the engine side, and OpenAI's answers.

A request is a form (`engines.multipart`) the gateway has validated (`gateway/apis/audio.py`): its
body holds the text fields (a list for a repeated `name[]` field) and, under `file`, an `Upload`.
- upstream it is a new form, the boundary the gateway chose, `model` the served name;
- the engine is asked for `json`, or `verbose_json` when the client asked for it: the gateway writes
  `text` itself (vLLM answers JSON for it, SGLang plain text), and reads the usage from JSON;
- vLLM's own fields (`VLLM_ONLY`: sampling, beam search, `hotwords`, …) pass to vLLM and are a 400
  on SGLang, which would ignore them; so is a non-empty `prompt` (SGLang ignores it too);
- SGLang serves no translations (the route stage sends them to pools that have the path).

Answers, OpenAI's: `json` `{"text", "usage": {"type": "duration", "seconds"}}` (a translation:
`{"text"}`); `text` the text alone, as `text/plain`; `verbose_json` `{"task", "language", "duration",
"text", "segments"}` (+ `words` when the engine gave them, + `usage` for a transcription). vLLM's
verbose answer has neither `task` nor `usage`, SGLang's segments only `id`, `start`, `end`, `text`.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from engines.errors import server_error
from engines.multipart import Part, encode
from engines.request import unsupported
from engines.upstream_errors import GENERIC_UPSTREAM

Task = Literal["transcribe", "translate"]
FORMATS = ("json", "text", "verbose_json")
VLLM_ONLY = (
    "hotwords",
    "to_language",
    "use_beam_search",
    "n",
    "length_penalty",
    "include_stop_str_in_output",
    "watermarking",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "frequency_penalty",
    "repetition_penalty",
    "presence_penalty",
    "max_completion_tokens",
    "vllm_xargs",
)


@dataclass(slots=True)
class Upload:
    """The audio file of a request, and the boundary its engine request is written with."""

    part: Part
    boundary: str

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"


@dataclass(slots=True)
class Transcript:
    """An engine's answer: the text and, when it said them, the audio's language, duration in
    seconds, segments, words and billed whole seconds."""

    text: str
    language: str | None = None
    duration: float | None = None
    segments: list[Any] | None = None
    words: list[Any] | None = None
    seconds: int | None = None


def wav_seconds(data: bytes) -> float | None:
    """The duration of a RIFF/WAVE file from its `fmt ` and `data` chunks; None for anything else."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    pos, byte_rate = 12, 0
    while pos + 8 <= len(data):
        kind, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        if kind == b"fmt " and size >= 12 and pos + 20 <= len(data):
            byte_rate = struct.unpack_from("<I", data, pos + 16)[0]
        elif kind == b"data":
            held = min(size, len(data) - pos - 8)
            return held / byte_rate if byte_rate else None
        pos += 8 + size + (size & 1)
    return None


def build_audio_request(body: dict[str, Any], served_model: str, engine: str) -> bytes:
    upload = body["file"]
    assert isinstance(upload, Upload), "the audio intake puts the file there"
    parts: list[Part] = []
    for name, value in body.items():
        if name in ("file", "model", "stream") or value is None:
            continue
        if engine == "sglang":
            if name in VLLM_ONLY:
                raise unsupported(name, "SGLang")
            if name == "prompt":
                if value:
                    raise unsupported(name, "SGLang", "It has no prompt for speech to text.")
                continue
        for one in value if isinstance(value, list) else [value]:
            parts.append(Part(name, str(one).encode()))
    parts.append(Part("model", served_model.encode()))
    parts.append(upload.part)
    return encode(parts, upload.boundary)


def decode_transcript(data: bytes) -> Transcript:
    """Either engine's `json` or `verbose_json` answer."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise server_error(GENERIC_UPSTREAM) from None
    if type(obj) is not dict or type(obj.get("text")) is not str:
        raise server_error(GENERIC_UPSTREAM)
    usage = obj.get("usage")
    seconds = usage.get("seconds") if type(usage) is dict else None
    duration = obj.get("duration")
    language = obj.get("language")
    segments, words = obj.get("segments"), obj.get("words")
    return Transcript(
        obj["text"],
        language if type(language) is str else None,
        float(duration) if isinstance(duration, int | float) and type(duration) is not bool else None,
        segments if type(segments) is list else None,
        words if type(words) is list else None,
        seconds if type(seconds) is int else None,
    )


def billed_seconds(t: Transcript, estimate: float) -> int:
    """Whole seconds of audio, rounded up as OpenAI bills them: the engine's, else its duration,
    else the gateway's estimate."""
    if t.seconds is not None:
        return t.seconds
    return math.ceil(t.duration if t.duration is not None else estimate)


def encode_transcript(
    t: Transcript, *, task: Task, response_format: str, seconds: int, language: str | None
) -> bytes:
    """OpenAI's answer in `response_format` (`language`: the request's, when the engine said none)."""
    if response_format == "text":
        return t.text.encode()
    usage = {"type": "duration", "seconds": seconds}
    if response_format != "verbose_json":
        return orjson.dumps({"text": t.text, "usage": usage} if task == "transcribe" else {"text": t.text})
    out: dict[str, Any] = {
        "task": task,
        "language": t.language or language,
        "duration": t.duration if t.duration is not None else float(seconds),
        "text": t.text,
        "segments": t.segments or [],
    }
    if t.words is not None:
        out["words"] = t.words
    if task == "transcribe":
        out["usage"] = usage
    return orjson.dumps(out)
