"""A tokenizer for the routing tests, made here: a byte-level BPE trained on local text (no download),
saved with a chat template as a model directory (`tokenizer.json`, `tokenizer_config.json`)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def save_tokenizer(root: Path, chat_template: str, vocab_size: int) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [Path(json.__file__).read_text()] * 2
    tok.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|im_start|>", "<|im_end|>"])
    )
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps({"chat_template": chat_template}))
    return root
