"""The engines' own benchmark tools through the gateway, as docs/operations.md (*Benchmarking*) gives
them: `vllm bench serve` (backend `openai-chat`) from the vLLM environment and SGLang's
`python -m sglang.benchmark.serving` (backend `sglang-oai-chat`) from SGLang's, each sending a few
random prompts, made with the tiny model's tokenizer (no dataset from the network), to a gateway whose
pools are the real vLLM and SGLang servers. Every request completes; each tool measured its latencies.

SGLang's benchmark imports Hugging Face's `datasets` at start-up, which the suite's SGLang environment
leaves out: a stand-in (bench_stand_ins/) is put on its path."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.admission.tokens import mint_token
from tests.conftest import MODEL
from tests.real_engines.rig import metric, real_pool_config
from tests.real_engines.servers import HERE, OFFLINE_ENV, SglangServer, VllmServer, engine_bin
from tests.support import HTTP, GatewayProcess

pytestmark = pytest.mark.timeout(400)  # the servers' start, then each tool's import (~20-40 s)

SECRET = "test-secret-for-the-engines-benchmark-tools"
PROMPTS = 6
#: short prompts and answers: the point is that the tools run through the gateway, not their figures
SHAPE = ["--random-input-len", "32", "--random-output-len", "8", "--num-prompts", str(PROMPTS), "--seed", "1"]


@pytest.fixture(scope="module")
def gateway(real_vllm: VllmServer, real_sglang: SglangServer) -> Iterator[GatewayProcess]:
    """One gateway, a pool of each engine, with JWT auth as a deployment has it."""
    config = real_pool_config("vllm", [real_vllm.base_url], real_vllm.served_model_name)
    other = real_pool_config("sglang", [real_sglang.base_url], real_sglang.served_model_name)
    config["pools"] += other["pools"]
    with GatewayProcess(config, env={"GATEWAY_JWT_SECRET": SECRET}) as gw:
        yield gw


def run_tool(engine: str, argv: list[str], tmp: Path, **env: str) -> None:
    token = mint_token(SECRET, "bench")
    done = subprocess.run(
        [str(engine_bin(engine, argv[0])), *argv[1:]],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp,
        env={**os.environ, **OFFLINE_ENV, "OPENAI_API_KEY": token, **env},
        check=False,
    )
    assert done.returncode == 0, f"{' '.join(argv[:3])} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def answered(gateway: GatewayProcess) -> float:
    text = HTTP.get(gateway.base_url + "/metrics", timeout=10).text
    return metric(text, "gateway_requests_total", 'status="200"')


def test_vllm_bench_serve_through_the_gateway(
    gateway: GatewayProcess, real_vllm: VllmServer, tmp_path: Path
) -> None:
    before = answered(gateway)
    run_tool("vllm", [
        "vllm", "bench", "serve", "--backend", "openai-chat", "--base-url", gateway.base_url,
        "--endpoint", "/v1/chat/completions", "--model", MODEL, "--tokenizer", str(real_vllm.model_dir),
        "--dataset-name", "random", *SHAPE, "--max-concurrency", "3", "--ignore-eos",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--save-result", "--result-dir", str(tmp_path), "--result-filename", "vllm.json", "--disable-tqdm",
    ], tmp_path)  # fmt: skip
    result: dict[str, Any] = json.loads((tmp_path / "vllm.json").read_text())
    assert result["completed"] == PROMPTS and result["failed"] == 0, result.get("errors")
    assert result["total_output_tokens"] == PROMPTS * 8
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert result[f"p99_{name}_ms"] > 0, name
    assert answered(gateway) - before == PROMPTS


def test_sglang_bench_serving_through_the_gateway(
    gateway: GatewayProcess, real_sglang: SglangServer, tmp_path: Path
) -> None:
    before = answered(gateway)
    out = tmp_path / "sglang.jsonl"
    run_tool("sglang", [
        "python", "-m", "sglang.benchmark.serving", "--backend", "sglang-oai-chat",
        "--base-url", gateway.base_url, "--model", MODEL, "--tokenizer", str(real_sglang.model_dir),
        "--dataset-name", "random-ids", *SHAPE, "--random-range-ratio", "1", "--max-concurrency", "3",
        "--warmup-requests", "1", "--output-file", str(out), "--disable-tqdm",
    ], tmp_path, PYTHONPATH=str(HERE / "bench_stand_ins"))  # fmt: skip
    result: dict[str, Any] = json.loads(out.read_text().splitlines()[-1])
    assert result["completed"] == PROMPTS, result
    assert result["total_output_tokens"] == PROMPTS * 8
    for name in ("ttft", "tpot", "itl", "e2e_latency"):
        assert result[f"p99_{name}_ms"] > 0, name
    assert answered(gateway) - before == PROMPTS + 1  # its warm-up request first
