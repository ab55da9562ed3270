"""Builds a LoRA adapter for the tiny model (no download, deterministic): PEFT's on-disk format.

    <vllm env>/bin/python tests/real_engines/build_lora.py --model <model dir> --out <adapter dir>

Rank 8 on every layer's `q_proj` and `v_proj`, random bf16 weights from a fixed seed, small enough
that the answers stay the model's own noise. vLLM serves it with `--enable-lora --lora-modules
tiny-lora=<adapter dir>` (tests/real_engines/conftest.py: the spare server); what matters to the
tests is that vLLM caches an adapter's blocks apart from the base model's and says so in its KV-cache
events (`lora_name`). It runs with the vLLM environment's python (torch, safetensors).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

RANK = 8


def build(model: Path, out: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    hidden, head = config["hidden_size"], config["head_dim"]
    outputs = {"q_proj": config["num_attention_heads"] * head, "v_proj": config["num_key_value_heads"] * head}
    gen = torch.Generator().manual_seed(7)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for name, size in outputs.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            tensors[f"{prefix}.lora_A.weight"] = (torch.randn(RANK, hidden, generator=gen) * 0.02).to(
                torch.bfloat16
            )
            tensors[f"{prefix}.lora_B.weight"] = (torch.randn(size, RANK, generator=gen) * 0.02).to(
                torch.bfloat16
            )
    tmp = Path(tempfile.mkdtemp(prefix=".lora-", dir=out.parent))
    save_file(tensors, str(tmp / "adapter_model.safetensors"))
    adapter = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": RANK,
        "lora_alpha": 2 * RANK,
        "lora_dropout": 0.0,
        "target_modules": sorted(outputs),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "base_model_name_or_path": str(model),
    }
    (tmp / "adapter_config.json").write_text(json.dumps(adapter, indent=2, sort_keys=True))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)  # whole or not at all: a concurrent build finds a complete adapter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    build(args.model.resolve(), args.out.resolve())
    print(args.out.resolve())


if __name__ == "__main__":
    main()
