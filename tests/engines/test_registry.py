"""The dialect table, and the promise it exists for: a client cannot tell which engine answered."""

from __future__ import annotations

import pytest

from engines.base import Dialect
from engines.openai import encode_completion
from engines.registry import DIALECTS, NAMES, get_dialect
from engines.sglang import SGLangDialect
from engines.vllm import VLLMDialect
from tests.engines import payloads as p


def test_table() -> None:
    assert NAMES == ("vllm", "sglang")
    assert isinstance(get_dialect("vllm"), VLLMDialect)
    assert isinstance(get_dialect("sglang"), SGLangDialect)
    assert get_dialect("vllm") is get_dialect("vllm")
    for name, d in DIALECTS.items():
        assert d.name == name and d.health_path == "/health" and d.metrics_path == "/metrics"
    with pytest.raises(KeyError, match="known: vllm, sglang"):
        get_dialect("tgi")  # type: ignore[arg-type]


def _dialects() -> tuple[Dialect, Dialect]:
    return get_dialect("vllm"), get_dialect("sglang")


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("sc", p.STREAMS, ids=lambda sc: sc.name)
def test_streams_indistinguishable(sc: p.StreamScenario, include_usage: bool) -> None:
    v, s = _dialects()
    a = p.run_stream(v, sc.vllm, sc.endpoint, include_usage=include_usage, named=sc.tool_choice_named)
    b = p.run_stream(s, sc.sglang, sc.endpoint, include_usage=include_usage, named=sc.tool_choice_named)
    assert p.stable(a) == p.stable(b)
    assert (b'"usage":{' in a) == include_usage or sc.name == "mid_stream_error"


@pytest.mark.parametrize("sc", p.BODIES, ids=lambda sc: sc.name)
def test_bodies_indistinguishable(sc: p.BodyScenario) -> None:
    outs = []
    for d, raw in zip(_dialects(), (sc.vllm, sc.sglang), strict=True):
        c = d.decode_response(sc.endpoint, raw)
        outs.append(
            encode_completion(
                c,
                endpoint=sc.endpoint,
                id="chatcmpl-x",
                created=1,
                model="public",
                tool_choice_named=sc.tool_choice_named,
            )
        )
    assert p.stable(outs[0]) == p.stable(outs[1])
    for engine_only in (
        b"matched_stop",
        b"metadata",
        b"stop_reason",
        b"token_ids",
        b"kv_transfer_params",
        b"served",
    ):
        assert engine_only not in outs[0]


ERROR_PAIRS = [
    ("context", (400, p.V_CONTEXT), (400, p.S_CONTEXT_2)),
    ("server", (500, p.V_500), (500, p.S_500)),
]


@pytest.mark.parametrize(("name", "ve", "se"), ERROR_PAIRS, ids=[e[0] for e in ERROR_PAIRS])
def test_errors_indistinguishable(name: str, ve: tuple[int, bytes], se: tuple[int, bytes]) -> None:
    v, s = _dialects()
    a = v.decode_error(ve[0], ve[1])
    b = s.decode_error(se[0], se[1])
    assert (a.status, a.body()) == (b.status, b.body())


@pytest.mark.parametrize(
    "body",
    [
        {
            "model": "pub",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": None,
            "n": None,
        },
        {
            "model": "pub",
            "messages": [],
            "tool_choice": "none",
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
        {"model": "pub", "prompt": "x", "max_tokens": 5, "top_k": 4, "min_p": 0.1, "priority": 1},
    ],
)
def test_requests_share_common_rules(body: dict[str, object]) -> None:
    import orjson

    v, s = _dialects()
    for d in (v, s):
        endpoint = "completions" if "prompt" in body else "chat"
        out = orjson.loads(d.build_request(endpoint, body, "served"))
        assert out["model"] == "served"
        assert None not in out.values()
        assert "tools" not in out or out.get("tool_choice") != "none"
        if body.get("stream"):
            assert out["stream_options"] == {"include_usage": True}
