"""A stand-in for Hugging Face's `datasets`, which SGLang's benchmark imports at start-up (for its
MMMU dataset) and the suite's SGLang environment leaves out (scripts/ensure_engines.py): the random
datasets the tests use never call it."""

from __future__ import annotations

from typing import NoReturn


def load_dataset(*args: object, **kwargs: object) -> NoReturn:
    raise RuntimeError("the `datasets` package is not installed; the tests' benchmarks use random data")
