"""Hypothesis on the byte-level pieces of the request path that a chunk boundary could break.

- `SSESplitter`: any event stream cut at any byte boundaries yields the same payloads (and the same
  `[DONE]`) as the whole stream at once, with LF or CRLF line ends, comments and other fields.
- `StreamRelay`: a real engine stream (recorded from a simulator, vLLM and SGLang dialects) relayed
  at arbitrary chunk boundaries produces byte-identical client output.
- `read_body`: any split of a body into ASGI messages is reassembled exactly; above the cap the
  answer is 413 as soon as the cap is passed; a disconnect mid-body is a 400, never a crash.
- the sanitiser is idempotent: a body it already cleaned passes through it unchanged (neutralising
  never creates a new control sequence). The whole intake is property-tested in
  tests/gateway/admission/test_sanitise.py; this adds what that file does not.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engines.errors import ApiError
from engines.openai import StreamEncoder
from engines.registry import get_dialect
from gateway.admission.intake import read_body
from gateway.admission.sanitise import SanitiseStage
from gateway.admission.settings import DEFAULT_SPECIAL_TOKENS, SanitiseSettings
from gateway.core.circuit import CircuitBreaker
from gateway.core.context import RequestContext
from gateway.core.fleet import Backend
from gateway.settings import ModelSettings
from gateway.upstream.lease import Lease
from gateway.upstream.relay import SSESplitter, StreamRelay
from tests.conftest import fast_sim
from tests.support import HTTP, examples, one_turn

pytestmark = pytest.mark.processes

# -- SSESplitter --------------------------------------------------------------------------------

_payload = st.text(
    st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), min_size=1, max_size=40
).filter(lambda s: s.encode().strip() not in (b"", b"[DONE]"))
_extra_line = st.sampled_from([": keep-alive", "event: message", "id: 7", "retry: 100", ":"])


@st.composite
def _sse_stream(draw: st.DrawFn) -> tuple[bytes, list[bytes], bool]:
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    payloads = draw(st.lists(_payload, max_size=12))
    done = draw(st.booleans())
    text = ""
    expected: list[bytes] = []
    for p in payloads:
        lines = [*draw(st.lists(_extra_line, max_size=2)), f"data: {p}"]
        text += eol.join(lines) + eol + eol
        expected.append(p.encode().strip())
    if draw(st.booleans()):
        text += ": ping" + eol + eol
    if done:
        text += "data: [DONE]" + eol + eol
    return text.encode(), expected, done


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in [*points, len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


@settings(max_examples=examples(400), deadline=None)
@given(_sse_stream(), st.lists(st.integers(0, 10_000), max_size=30))
def test_splitter_is_blind_to_chunk_boundaries(
    stream: tuple[bytes, list[bytes], bool], cuts: list[int]
) -> None:
    data, expected, done = stream
    whole = SSESplitter()
    assert whole.feed(data) == expected and whole.done == done
    split = SSESplitter()
    got: list[bytes] = []
    for piece in _cut(data, cuts):
        got += split.feed(piece)
    assert got == expected and split.done == done


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=20))
def test_splitter_survives_garbage(chunks: list[bytes]) -> None:
    splitter = SSESplitter()
    for c in chunks:
        for payload in splitter.feed(c):
            assert payload and b"\n" not in payload


# -- StreamRelay over a recorded engine stream -----------------------------------------------------

SERVED_MODEL = {"vllm": "Qwen/Qwen2.5-7B-Instruct", "sglang": "Qwen/Qwen2.5-7B-Instruct"}


@pytest.fixture(scope="module")
def recorded() -> Iterator[dict[str, bytes]]:
    """One raw SSE answer per dialect, straight from a simulator (usage on, tool-free chat)."""
    from gateway.demo import SERVED

    out: dict[str, bytes] = {}
    for engine in ("vllm", "sglang"):
        with fast_sim(engine, "--itl-ms", "0") as sim:
            body = {
                "model": SERVED[engine],
                "messages": [{"role": "user", "content": "tell me a story"}],
                "max_tokens": 40,
                "min_tokens": 40,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            out[engine] = HTTP.post(sim.base_url + "/v1/chat/completions", json=body, timeout=10).content
    yield out


class _Upstream:
    status = 200

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks
        self.closed = False

    async def read(self) -> bytes:
        return b"".join(self._chunks)

    async def chunks(self) -> AsyncIterator[bytes]:
        for c in self._chunks:
            await one_turn()
            yield c

    def close(self) -> None:
        self.closed = True


async def _relay(engine: str, chunks: list[bytes]) -> bytes:
    dialect = get_dialect(engine)  # type: ignore[arg-type]

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client never disconnects
        return {"type": "http.disconnect"}

    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message.get("body", b""))

    ended: list[bool] = []

    async def on_end(ctx: RequestContext, lease: Lease, ok: bool) -> None:
        lease.release()
        ended.append(ok)

    ctx = RequestContext(request_id="r", endpoint="chat", started=0.0, headers={}, receive=receive)  # type: ignore[arg-type]
    upstream = _Upstream(chunks)
    backend = Backend(name="b", url="http://b", pool="p", circuit=CircuitBreaker(3, 10.0))
    relay = StreamRelay(
        ctx,
        lease=Lease(backend, 0, lambda *failure: None),
        upstream=upstream,
        chunks=upstream.chunks(),
        splitter=SSESplitter(),
        decoder=dialect.stream_decoder("chat"),
        encoder=StreamEncoder(
            endpoint="chat",
            id="chatcmpl-x",
            created=1,
            model="m",
            include_usage=True,
            tool_choice_named=False,
        ),
        first=b"",
        idle_s=30,
        headers=[],
        on_end=on_end,
    )
    await relay(send, receive)  # type: ignore[arg-type]
    assert ended == [True] and upstream.closed and backend.in_flight == 0
    return b"".join(sent)


@settings(
    max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.sampled_from(["vllm", "sglang"]), st.lists(st.integers(0, 100_000), max_size=40))
async def test_relay_output_is_blind_to_chunk_boundaries(
    recorded: dict[str, bytes], engine: str, cuts: list[int]
) -> None:
    raw = recorded[engine]
    reference = await _relay(engine, [raw])
    assert reference.endswith(b"data: [DONE]\n\n")
    assert b'"usage"' in reference
    assert await _relay(engine, _cut(raw, cuts)) == reference


# -- read_body ------------------------------------------------------------------------------------


def _receiver(parts: list[bytes], disconnect_after: int | None = None) -> Any:
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)
    ]
    if disconnect_after is not None:
        messages = messages[:disconnect_after]
        if messages:
            messages[-1]["more_body"] = True
        messages.append({"type": "http.disconnect"})
    it = iter(messages)

    async def receive() -> dict[str, Any]:
        return next(it)

    return receive


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=3000), st.lists(st.integers(0, 3000), max_size=10), st.integers(1, 4000))
async def test_read_body_reassembles_or_refuses_at_the_cap(body: bytes, cuts: list[int], cap: int) -> None:
    parts = _cut(body, cuts)
    try:
        got = await read_body(_receiver(parts), cap)
    except ApiError as err:
        assert err.status == 413 and len(body) > cap
    else:
        assert got == body and len(body) <= cap


@settings(max_examples=examples(100), deadline=None)
@given(st.binary(min_size=2, max_size=500), st.lists(st.integers(0, 500), min_size=1, max_size=5), st.data())
async def test_read_body_disconnect_mid_body_is_a_clean_400(body: bytes, cuts: list[int], data: Any) -> None:
    parts = _cut(body, cuts)
    after = data.draw(st.integers(1, len(parts)))
    with pytest.raises(ApiError) as info:
        await read_body(_receiver(parts, disconnect_after=after), 10_000)
    assert info.value.status == 400


# -- sanitiser idempotence ------------------------------------------------------------------------

_MODEL = ModelSettings(name="m", context_length=100_000, default_max_tokens=64)
_pieces = st.sampled_from(
    ["a", " ", "\n", "\x00", "\x1b", "<", "|", "{", "%", "}", "é", *DEFAULT_SPECIAL_TOKENS]
)
_text = st.lists(_pieces, max_size=16).map("".join)


def _ctx(body: dict[str, Any]) -> RequestContext:
    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    ctx = RequestContext(request_id="r", endpoint="chat", started=0.0, headers={}, receive=receive)  # type: ignore[arg-type]
    ctx.body = body
    ctx.model = _MODEL
    return ctx


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), _text), min_size=1, max_size=5),
    st.sampled_from(["allow", "neutralise"]),
)
@example([("system", "{{{")], "neutralise")  # overlapping markers (found by this test)
async def test_sanitiser_is_idempotent(messages: list[tuple[str, str]], markers: str) -> None:
    stage = SanitiseStage(SanitiseSettings(template_markers=markers))  # type: ignore[arg-type]
    body = {"model": "m", "messages": [{"role": r, "content": t} for r, t in messages]}
    first = _ctx(copy.deepcopy(body))
    await stage(first)
    once = orjson.dumps(first.body)
    second = _ctx(orjson.loads(once))
    await stage(second)
    assert orjson.dumps(second.body) == once
