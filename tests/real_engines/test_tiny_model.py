"""The tiny model is built locally and deterministically: a second build is byte-identical to the cached
one, and it is the model the brief asks for (Qwen3, 2 layers, hidden 256, 4/2 heads, bf16, vocabulary
2048 with Qwen's special tokens, a chat template that renders tools)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.real_engines.servers import HERE, OFFLINE_ENV, build_tiny_model, engine_bin

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return build_tiny_model()


def test_rebuild_is_byte_identical(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "again"
    subprocess.run(
        [str(engine_bin("vllm", "python")), str(HERE / "build_model.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        env={**os.environ, **OFFLINE_ENV},
        timeout=300,
    )
    names = sorted(p.name for p in model_dir.iterdir())
    assert names == sorted(p.name for p in out.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(names)
    for name in names:
        assert (out / name).read_bytes() == (model_dir / name).read_bytes(), name
    # The cache directory is named by the key the manifest records.
    assert json.loads((model_dir / "MANIFEST.json").read_text())["key"] == model_dir.name


def test_model_shape(model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"]) == (2, 256)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    assert config["dtype"] == "bfloat16" and config["vocab_size"] == 2048
    assert (model_dir / "model.safetensors").stat().st_size < 5_000_000


def test_tokenizer_has_qwen_tokens_and_a_tool_template(model_dir: Path) -> None:
    probe = """
import json, sys
from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained(sys.argv[1])
names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]
tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
text = t.apply_chat_template([{"role": "user", "content": "Hi"}], tools=tools, tokenize=False,
                             add_generation_prompt=True)
print(json.dumps({"ids": {n: t.convert_tokens_to_ids(n) for n in names}, "len": len(t),
                  "encoded": [t.encode(n, add_special_tokens=False) for n in names], "text": text}))
"""
    out = subprocess.run(
        [str(engine_bin("vllm", "python")), "-c", probe, str(model_dir)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **OFFLINE_ENV},
        timeout=120,
    )
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts["len"] == 2048
    # Each special token is one token of its own.
    assert facts["encoded"] == [[i] for i in facts["ids"].values()]
    text = facts["text"]
    assert text.startswith("<|im_start|>system\n") and "<tools>\n" in text and '"get_weather"' in text
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
