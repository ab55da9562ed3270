"""Builds a cross-encoder of the tiny model (no download, deterministic): the same Qwen3 layers under a
one-label classification head, as rerankers such as Qwen3-Reranker are.

    <vllm env>/bin/python tests/real_engines/build_reranker.py --model <model dir> --out <dir>

A `Qwen3ForSequenceClassification` (`num_labels` 1) with random bf16 weights from a fixed seed, and the
tiny model's tokenizer. vLLM 0.32 serves it as a pooling model (its `/rerank` and `/score`), SGLang
0.5.23 with `--is-embedding` (its `/v1/rerank` and `/v1/score`); random weights make the scores noise,
so the tests compare shapes, order and accounting, never which document wins. It runs with the vLLM
environment's python (torch, transformers).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoConfig, Qwen3ForSequenceClassification

SEED = 20261206


def build(model: Path, out: Path) -> None:
    config = AutoConfig.from_pretrained(model)
    config.architectures = ["Qwen3ForSequenceClassification"]
    config.num_labels = 1
    config.pad_token_id = 0
    torch.manual_seed(SEED)
    classifier = Qwen3ForSequenceClassification(config).to(torch.bfloat16)
    tmp = Path(tempfile.mkdtemp(prefix=".reranker-", dir=out.parent))
    classifier.save_pretrained(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model / name, tmp / name)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)  # whole or not at all: a concurrent build finds a complete model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    build(args.model.resolve(), args.out.resolve())
    print(args.out.resolve())


if __name__ == "__main__":
    main()
