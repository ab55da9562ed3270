"""Speech to text of a simulated Whisper-like model, in each engine's dialect.

A simulator started with `--speech-to-text` transcribes: `POST /v1/audio/transcriptions` (and vLLM's
`/v1/audio/translations`) take a `multipart/form-data` upload whose `file` is the audio. The audio is
never decoded: its duration is a PCM WAV header's, else its size at 16 kB a second, and its
transcript is about 2.5 words a second drawn from a fixed vocabulary by a seed made from the file's
bytes (and the task), so one recording always reads the same. The cost is a prefill of 50 tokens a
second of audio (Whisper's encoder rate) and a decode of the transcript's tokens.

Wire shapes (read from each engine's server):
- vLLM: `json` and `text` both answer JSON `{"text", "usage": {"type": "duration", "seconds"}}`
  (a translation: `{"text"}`); `verbose_json` `{"duration", "language", "text", "segments", "words":
  null}` with Whisper's segment fields; `srt`, `vtt` are a 400. Without `--speech-to-text` neither
  route exists (404). Unknown model: 404.
- SGLang: transcriptions only; `json` as vLLM's, `text` plain text, `verbose_json` `{"task",
  "language", "duration", "text", "segments": [{"id", "start", "end", "text"}], "usage"}`; another
  format: 400 `{"error": {"message"}}`; without `--speech-to-text`, the 500 SGLang answers for a
  model without audio input. Streaming is not simulated (a 400).
"""

from __future__ import annotations

import math
import random
import zlib
from typing import Any

import orjson

from engines import multipart
from engines.audio import wav_seconds
from engines.sim import asgi, tokenizer
from engines.sim.asgi import Receive, Scope, Send
from engines.sim.pooling import PoolingEndpoint
from engines.sim.request import RequestError

_WORDS = [
    "the",
    "sea",
    "is",
    "calm",
    "today",
    "and",
    "the",
    "wind",
    "comes",
    "from",
    "the",
    "west",
    "so",
    "the",
    "boats",
    "stay",
    "in",
    "the",
    "harbour",
    "while",
    "children",
    "play",
    "on",
    "the",
    "beach",
    "and",
    "their",
    "parents",
    "read",
    "under",
    "the",
    "old",
    "trees",
    "near",
    "the",
    "lighthouse",
]
_WORDS_PER_SECOND = 2.5
_TOKENS_PER_SECOND = 50
_BYTES_PER_SECOND = 16_000
_SEGMENT_S = 30.0


def duration(data: bytes) -> float:
    """A PCM WAV file's duration from its header, else its size at 16 kB a second."""
    seconds = wav_seconds(data)
    return seconds if seconds is not None else len(data) / _BYTES_PER_SECOND


def transcript(data: bytes, task: str) -> str:
    """The simulated words of a recording: the same bytes, the same words."""
    rng = random.Random(zlib.crc32(data) ^ zlib.crc32(task.encode()))
    n = max(1, round(duration(data) * _WORDS_PER_SECOND))
    words = [rng.choice(_WORDS) for _ in range(n)]
    return (" ".join(words).capitalize() + ".") if words else ""


class SpeechEndpoints(PoolingEndpoint):
    """`/v1/audio/transcriptions` and (vLLM) `/v1/audio/translations` of one simulator app."""

    async def transcriptions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._answer(scope, receive, send, "transcribe")

    async def translations(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._answer(scope, receive, send, "translate")

    async def _answer(self, scope: Scope, receive: Receive, send: Send, task: str) -> None:
        raw = await self.begin(scope, receive, send)
        if raw is None:
            return
        vllm = self.cfg.engine == "vllm"
        if not self.cfg.speech_to_text:
            if vllm:
                await self.not_found(send)
            else:  # what SGLang 0.5.23 answers for a model without audio input
                err = "Internal server error: Unexpected keyword argument '_detect_language'"
                await self.refuse(send, RequestError(err, status=500, err_type="InternalServerError"))
            return
        try:
            form = self._form(scope, raw)
            fmt = form.get("response_format") or "json"
            if not vllm and fmt not in ("json", "text", "verbose_json"):
                # SGLang's route answers this one itself, in a shape of its own
                self._engine.stats.errors_total += 1
                message = "Only 'json', 'text', and 'verbose_json' formats supported"
                await asgi.send_json(send, 400, {"error": {"message": message}})
                return
            data = self._check(form, fmt)
        except RequestError as err:
            await self.refuse(send, err)
            return
        seconds = duration(data)
        text = transcript(data, task)
        ids = [
            tokenizer.token_id(f"<audio:{i % 1500}>") for i in range(math.ceil(seconds * _TOKENS_PER_SECOND))
        ]
        if not await self.prefill(receive, ids, decode=len(tokenizer.encode(text))):
            return
        language = form.get("language") or "en"
        if not vllm and fmt == "text":
            await asgi.send_bytes(send, 200, text.encode(), [(b"content-type", b"text/plain; charset=utf-8")])
            return
        await asgi.send_bytes(send, 200, orjson.dumps(self._body(task, fmt, text, seconds, language)))

    def _form(self, scope: Scope, raw: bytes) -> dict[str, Any]:
        headers = dict(scope["headers"])
        boundary = multipart.boundary(headers.get(b"content-type", b"").decode("latin-1"))
        if boundary is None:
            raise RequestError("There was an error parsing the body", err_type="Bad Request")
        try:
            parts = multipart.parse(raw, boundary)
        except ValueError:
            raise RequestError("There was an error parsing the body", err_type="Bad Request") from None
        return {
            p.name: (p.data if p.filename is not None else p.data.decode("utf-8", "replace")) for p in parts
        }

    def _check(self, form: dict[str, Any], fmt: str) -> bytes:
        vllm = self.cfg.engine == "vllm"
        data = form.get("file")
        if not isinstance(data, bytes):
            raise RequestError(
                "1 validation error:\n  file: Field required",
                status=400 if vllm else 422,
                err_type="Bad Request",
            )
        model = form.get("model")
        if vllm and model is not None and model != self.cfg.served_model_name:
            raise RequestError(
                f"The model `{model}` does not exist.", status=404, param="model", err_type="NotFoundError"
            )
        if str(form.get("stream", "")).lower() in ("true", "1"):
            raise RequestError("Streamed transcriptions are not simulated.")
        if vllm and fmt not in ("json", "text", "verbose_json", "diarized_json"):
            raise RequestError(
                "Currently only support response_format: `text`, `json`, `verbose_json` or `diarized_json`"
            )
        if vllm and fmt == "diarized_json":
            raise RequestError(f"Currently do not support diarized_json for {self.cfg.served_model_name}")
        if not data:
            raise RequestError("Invalid or empty audio file.")
        return data

    def _body(self, task: str, fmt: str, text: str, seconds: float, language: str) -> dict[str, Any]:
        usage = {"type": "duration", "seconds": math.ceil(seconds)}
        if fmt != "verbose_json":
            return {"text": text, "usage": usage} if task == "transcribe" else {"text": text}
        segments = self._segments(text, seconds)
        if self.cfg.engine == "vllm":
            return {
                "duration": seconds,
                "language": language,
                "text": text,
                "segments": segments,
                "words": None,
            }
        short = [{k: s[k] for k in ("id", "start", "end", "text")} for s in segments]
        return {
            "task": "transcribe",
            "language": language,
            "duration": round(seconds, 2),
            "text": text,
            "segments": short,
            "usage": usage,
        }

    def _segments(self, text: str, seconds: float) -> list[dict[str, Any]]:
        """Whisper's segments: one per 30 s window, its share of the words."""
        words = text.split()
        count = max(1, math.ceil(seconds / _SEGMENT_S))
        per = math.ceil(len(words) / count)
        out = []
        for i in range(count):
            chunk = " ".join(words[i * per : (i + 1) * per])
            out.append(
                {
                    "id": i,
                    "avg_logprob": -0.25,
                    "compression_ratio": 1.5,
                    "end": round(min(seconds, (i + 1) * _SEGMENT_S), 2),
                    "no_speech_prob": 0.01,
                    "seek": int(i * _SEGMENT_S * 100),
                    "start": round(i * _SEGMENT_S, 2),
                    "temperature": 0.0,
                    "text": " " + chunk,
                    "tokens": tokenizer.encode(chunk),
                }
            )
        return out
