"""Dialects by name: the one table the gateway's config resolves `engine: vllm|sglang` through."""

from __future__ import annotations

from typing import Final, Literal, get_args

from engines import sglang, vllm
from engines.base import Dialect

DialectName = Literal["vllm", "sglang"]

DIALECTS: Final[dict[DialectName, Dialect]] = {
    "vllm": vllm.DIALECT,
    "sglang": sglang.DIALECT,
}

NAMES: Final[tuple[DialectName, ...]] = get_args(DialectName)


def get_dialect(name: DialectName) -> Dialect:
    """The shared dialect for `name`; `KeyError` naming the known dialects otherwise."""
    try:
        return DIALECTS[name]
    except KeyError:
        raise KeyError(f"unknown engine dialect {name!r}; known: {', '.join(NAMES)}") from None
