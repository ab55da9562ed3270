"""Helpers for the simulator tests: SSE parsing and small request builders."""

from __future__ import annotations

import struct
from typing import Any

import httpx
import orjson

from engines.sim.launcher import SimProcess
from tests.support import HTTP

USER = [{"role": "user", "content": "Hello there, how are you?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "where": {
                    "type": "object",
                    "properties": {
                        "lat": {"type": "number"},
                        "tags": {"type": "array", "items": {"type": "string"}},
                    },
                    "required": ["lat"],
                },
            },
            "required": ["city", "unit"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
}


def sim(engine: str, *flags: str) -> SimProcess:
    """A simulator with small latencies for tests."""
    base = ["--ttft-ms", "2", "--prefill-us-per-token", "0", "--itl-ms", "1", "--max-model-len", "4096"]
    return SimProcess(engine, extra=[*base, *flags])


def post(base: str, path: str, body: dict[str, Any], timeout: float = 10) -> httpx.Response:
    """POST JSON, waiting `timeout` for the answer (connecting may take longer on a busy machine)."""
    return HTTP.post(base + path, json=body, timeout=httpx.Timeout(max(timeout, 30), read=timeout))


def events(text: str) -> list[Any]:
    """The `data:` payloads of an SSE body, JSON-decoded (`[DONE]` kept as the string)."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        out.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return out


def stream(base: str, path: str, body: dict[str, Any]) -> list[Any]:
    """POST a streaming request and return its decoded events."""
    r = post(base, path, {**body, "stream": True})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.text.endswith("data: [DONE]\n\n")
    return events(r.text)


def stats(base: str) -> dict[str, Any]:
    """GET /sim/stats."""
    result: dict[str, Any] = HTTP.get(base + "/sim/stats", timeout=5).json()
    return result


def metric(text: str, name: str) -> float:
    """Sum of every sample of `name` (exact family sample name) in a Prometheus exposition."""
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        sample = line.split("{", 1)[0].split(" ", 1)[0]
        if sample == name:
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, f"{name} not in metrics"
    return total


def wav(seconds: float, rate: int = 16_000) -> bytes:
    """A silent 16-bit mono PCM WAV file of `seconds`."""
    data = b"\0\0" * int(seconds * rate)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks
