"""Schemathesis against a running gateway: every documented operation, public and admin.

The OpenAPI document is the gateway's own `/openapi.json` (gateway/control/openapi.py documents the public
endpoints next to the admin API). Cases are generated in both modes — schema-valid (positive) and
schema-violating (negative) — and sent over loopback to a gateway with auth on, in front of two
healthy zero-latency simulators (one per dialect) and an embedding model. Since no engine is
failing, any 5xx is the gateway's own. Every answer must also be its API's error envelope when it
is a JSON error (OpenAI's; Anthropic's on /v1/messages*), carry an `x-request-id`, and never show
a stack trace; client-facing answers never name a backend address.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from gateway.demo import SERVED
from tests.conftest import MODEL, fast_sim
from tests.reliability.support import SECRET, bearer, token
from tests.support import HTTP, GatewayProcess

pytestmark = pytest.mark.processes

EXAMPLES = {GenerationMode.POSITIVE: 20, GenerationMode.NEGATIVE: 12}
EMBED_MODEL = "fuzz-embed"
RERANK_MODEL = "fuzz-rerank"
AUDIO_MODEL = "fuzz-whisper"
#: the model a valid case names, by path (chat's otherwise)
MODEL_OF = {
    "/v1/embeddings": EMBED_MODEL,
    "/v1/rerank": RERANK_MODEL,
    "/rerank": RERANK_MODEL,
    "/v1/score": RERANK_MODEL,
    "/v1/audio/transcriptions": AUDIO_MODEL,
    "/v1/audio/translations": AUDIO_MODEL,
}


class Target:
    def __init__(self, gw: GatewayProcess, sim_ports: list[int]) -> None:
        self.gw = gw
        self.sim_ports = sim_ports
        self.user = bearer(token("fuzzer"))
        self.admin = bearer(token("fuzz-admin", admin=True))
        self.statuses: dict[str, dict[int, int]] = {}


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    vllm, sglang = fast_sim("vllm", "--fast"), fast_sim("sglang", "--fast")
    embed = fast_sim("sglang", "--fast", "--model", "emb", "--embedding-dim", "8")
    rerank = fast_sim("vllm", "--fast", "--model", "rr", "--reranker", "--max-model-len", "512")
    audio = fast_sim("vllm", "--fast", "--model", "wh", "--speech-to-text")
    with vllm, sglang, embed, rerank, audio:
        config: dict[str, Any] = {
            "server": {"graceful_shutdown_s": 1, "api_docs": True},  # the document the fuzzer reads
            "models": [
                {"name": MODEL, "context_length": 8192},
                {"name": EMBED_MODEL, "task": "embed"},
                {"name": RERANK_MODEL, "task": "score", "context_length": 512},
                {"name": AUDIO_MODEL, "task": "transcribe"},
            ],
            "pools": [
                *(
                    {
                        "name": e,
                        "dialect": e,
                        "models": {MODEL: SERVED[e]},
                        "backends": [{"name": f"{e}-0", "url": s.base_url}],
                    }
                    for e, s in (("vllm", vllm), ("sglang", sglang))
                ),
                *(
                    {
                        "name": name,
                        "dialect": dialect,
                        "models": {model: served},
                        "backends": [{"name": f"{name}-0", "url": sim.base_url}],
                    }
                    for name, dialect, model, served, sim in (
                        ("embed", "sglang", EMBED_MODEL, "emb", embed),
                        ("rerank", "vllm", RERANK_MODEL, "rr", rerank),
                        ("audio", "vllm", AUDIO_MODEL, "wh", audio),
                    )
                ),
            ],
            "upstream": {"health": {"interval_s": 3600}},
            "routing": {"scrape_interval_s": 0},
            "auth": {"jwt": {"secret": SECRET}},
        }
        with GatewayProcess(config) as gw:
            yield Target(gw, [s.port for s in (vllm, sglang, embed, rerank, audio)])
            # The fuzzing left the gateway healthy.
            assert HTTP.get(gw.base_url + "/readyz", timeout=5).status_code == 200
            log = gw.log()
            assert "Traceback" not in log, log[-3000:]


def _operations() -> list[tuple[str, str, GenerationMode]]:
    # Collected without a server: the same document the gateway serves, built in-process.
    from gateway.app import Gateway
    from gateway.settings import parse_settings

    settings_ = parse_settings(
        {
            "models": [{"name": MODEL}],
            "pools": [{"name": "p", "dialect": "vllm", "models": {MODEL: "x"}, "backends": []}],
            "server": {"api_docs": True},
        },
        {},
    )
    doc = Gateway(settings_)._admin_app.openapi()
    out = []
    for path, item in doc["paths"].items():
        for method, op in item.items():
            out.append((method.upper(), path, GenerationMode.POSITIVE))
            # Negative cases need something to break: a body, a parameter or the credentials.
            params = [p for p in op.get("parameters", []) if p.get("in") != "path"]
            if op.get("requestBody") or params or op.get("security"):
                out.append((method.upper(), path, GenerationMode.NEGATIVE))
    return out


def _tame(case: Any, mode: GenerationMode, path: str) -> Any:
    """Keep generation lengths small (fuzzing the parser, not the simulator's patience); valid
    cases name the served model, or nearly all of them would stop at the unknown-model 404."""
    body = case.body
    if isinstance(body, dict):
        if mode is GenerationMode.POSITIVE and "model" in body:
            body["model"] = MODEL_OF.get(path, MODEL)
        for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            if isinstance(body.get(key), int) and not isinstance(body.get(key), bool) and body[key] > 16:
                body[key] = 16
        if isinstance(body.get("n"), int) and not isinstance(body.get("n"), bool) and body["n"] > 2:
            body["n"] = 2
    if mode is GenerationMode.POSITIVE and isinstance(case.path_parameters, dict):
        # Real names reach the handlers' logic; removing or draining the fleet's only backends
        # would end the fuzzing early, so backend names stay random.
        if "pool" in case.path_parameters:
            case.path_parameters["pool"] = "vllm"
        if "model_id" in case.path_parameters:
            case.path_parameters["model_id"] = MODEL
    return case


def _header(response: Any, name: str) -> str:
    value = response.headers.get(name)
    if isinstance(value, list):
        return str(value[0]) if value else ""
    return str(value or "")


@pytest.mark.parametrize("method,path,mode", _operations(), ids=lambda v: getattr(v, "value", str(v)))
def test_no_gateway_5xx(target: Target, method: str, path: str, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(target.gw.base_url + "/openapi.json")
    operation = schema[path][method]
    public = not path.startswith("/admin/")
    headers = target.user if public else target.admin
    seen = target.statuses.setdefault(f"{method} {path} {mode.value}", {})

    @settings(
        max_examples=EXAMPLES[mode],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def run(data: st.DataObject) -> None:
        case = _tame(data.draw(operation.as_strategy(generation_mode=mode)), mode, path)
        response = case.call(base_url=target.gw.base_url, headers=dict(headers), timeout=30)
        status = response.status_code
        seen[status] = seen.get(status, 0) + 1

        text = response.text
        assert status < 500, f"{method} {path} -> {status}: {text[:500]}\nrequest: {case.body!r}"
        assert "Traceback" not in text and 'File "' not in text
        if public:  # the admin API (FastAPI) sends none: reported, see docs/reliability.md
            assert _header(response, "x-request-id"), (status, text[:200])
        if status >= 400 and _header(response, "content-type").startswith("application/json"):
            body = response.json()
            if path.startswith("/v1/messages"):  # Anthropic's envelope
                assert set(body) == {"type", "error"} and body["type"] == "error", text[:300]
                assert set(body["error"]) == {"type", "message"}, text[:300]
            else:
                assert set(body) == {"error"}, text[:300]
                assert set(body["error"]) == {"message", "type", "param", "code"}, text[:300]
        if public:
            for port in target.sim_ports:
                assert f":{port}" not in text, text[:300]

    run()
    print(f"\n{method} {path} [{mode.value}]: {dict(sorted(seen.items()))}")
