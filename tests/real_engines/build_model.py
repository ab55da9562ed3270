"""Builds the tiny model the real engines serve: no download, deterministic, cached by a hash of its inputs.

    <engine env>/bin/python tests/real_engines/build_model.py --root .engines/models   # prints the model dir
    <engine env>/bin/python tests/real_engines/build_model.py --out /tmp/x             # always builds into /tmp/x

It runs with an engine environment's python (it needs torch, transformers and tokenizers, which the
gateway's own environment does not have); the tests call it as a subprocess.

The model is a `Qwen3ForCausalLM` (2 layers, hidden 256, 4 heads / 2 KV heads, tied embeddings) with
random bf16 weights from a fixed seed, saved with `save_pretrained`; the tokenizer is a byte-level BPE
trained with `tokenizers` on text every Debian machine with this Python has (licence files, stdlib
sources), with Qwen's special tokens and a hermes/Qwen-style chat template that renders `tools`.

The cache key hashes everything the files depend on: this script, the corpus bytes and the versions of
torch, transformers and tokenizers. The same inputs give byte-identical files (tests check it), and
`MANIFEST.json` records every file's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

# Single-threaded, seeded: the same inputs must give the same bytes.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SEED = 20261201
BPE_VOCAB = 2044  # + 4 added (non-special) tokens = 2048 = the model's vocab_size
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
# Like Qwen's: added tokens that are not "special", so they survive skip_special_tokens and the
# engines' tool/reasoning parsers see them in the text.
ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
MANIFEST = "MANIFEST.json"

# hermes / Qwen2.5-style: tools listed in the system turn inside <tools></tools>, the model answers
# <tool_call>{"name": ..., "arguments": {...}}</tool_call>; tool results go back as <tool_response>.
CHAT_TEMPLATE = (
    "{%- set sys = messages[0].content if messages and messages[0].role == 'system' else none %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if sys %}{{- sys + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}"
    "{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '"
    " + 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'"
    ' + \'{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif sys is not none %}"
    "{{- '<|im_start|>system\\n' + sys + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' and loop.first %}"
    "{%- elif m.role == 'assistant' %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if m.content %}{{- '\\n' + m.content }}{%- endif %}"
    "{%- for call in (m.tool_calls or []) %}"
    "{%- set f = call.function if call.function is defined else call %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + f.name + \'", "arguments": \' }}'
    "{%- if f.arguments is string %}{{- f.arguments }}{%- else %}{{- f.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def corpus_files() -> list[Path]:
    """Text that exists on every machine of this kind: Debian's licence texts and stdlib sources."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [stdlib / "LICENSE.txt"]
    for package in ("json", "http", "email", "asyncio"):
        files += sorted((stdlib / package).glob("*.py"))
    licences = Path("/usr/share/common-licenses")
    files += [licences / name for name in ("Apache-2.0", "GPL-3", "LGPL-2.1", "MPL-2.0")]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise SystemExit(f"build_model: corpus files missing: {missing}")
    return files


def cache_key(files: list[Path]) -> str:
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    for dist in ("torch", "transformers", "tokenizers", "safetensors"):
        h.update(f"{dist}=={importlib.metadata.version(dist)}\n".encode())
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def build_tokenizer(files: list[Path], out: Path) -> dict[str, int]:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(f) for f in files], trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    ids = {t: tok.token_to_id(t) for t in [*SPECIAL, *ADDED]}
    if tok.get_vocab_size() != BPE_VOCAB + len(ADDED) or None in ids.values():
        raise SystemExit(f"build_model: unexpected vocabulary ({tok.get_vocab_size()} tokens, {ids})")
    tok.save(str(out / "tokenizer.json"))
    added_decoder = {
        str(ids[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t in SPECIAL,
        }
        for t in [*SPECIAL, *ADDED]
    }
    config = {
        "added_tokens_decoder": added_decoder,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return ids


def build_model(ids: dict[str, int], out: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    config = Qwen3Config(
        vocab_size=BPE_VOCAB + len(ADDED),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        torch_dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
    )
    model.save_pretrained(str(out), safe_serialization=True)


def write_manifest(out: Path, key: str) -> None:
    digests = {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(out.iterdir())
        if f.is_file() and f.name != MANIFEST
    }
    (out / MANIFEST).write_text(json.dumps({"key": key, "files": digests}, indent=2, sort_keys=True) + "\n")


def manifest_ok(out: Path) -> bool:
    """The directory holds a finished build whose files still match their recorded digests."""
    try:
        files = json.loads((out / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError):
        return False
    return all(
        (out / name).is_file() and hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
        for name, digest in files.items()
    )


def build(out: Path, files: list[Path], key: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ids = build_tokenizer(files, out)
    build_model(ids, out)
    write_manifest(out, key)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--root", type=Path, help="cache root: the model goes to ROOT/<key>/ unless there")
    where.add_argument("--out", type=Path, help="build into this (empty or missing) directory")
    args = parser.parse_args(argv)
    files = corpus_files()
    key = cache_key(files)
    if args.out is not None:
        build(args.out, files, key)
        print(args.out)
        return 0
    target = args.root / key
    if not manifest_ok(target):
        args.root.mkdir(parents=True, exist_ok=True)
        # Build beside the target and rename: a reader never sees a half-written model.
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=args.root))
        try:
            build(tmp, files, key)
            if target.exists() and not manifest_ok(target):
                shutil.rmtree(target)  # an earlier build that was cut short or altered
            try:
                tmp.rename(target)
            except OSError:  # another builder renamed its (identical) build there first
                if not manifest_ok(target):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        # Builds from older inputs (another script version, other library versions) are dead weight.
        for old in args.root.iterdir():
            if old.is_dir() and old.name != key and len(old.name) == 16 and (old / MANIFEST).exists():
                shutil.rmtree(old, ignore_errors=True)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
