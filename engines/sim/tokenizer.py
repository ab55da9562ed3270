"""A cheap, deterministic stand-in for a real tokenizer.

A token is a run of word characters (`\\w+`) or one other non-space character; whitespace is not a
token. Token ids are stable across processes: `crc32(token) % 2**20 + 1000` (ids below 1000 are left for
special tokens such as the EOS id). Every token seen is remembered (bounded) so `/detokenize` can map ids
back; unknown ids decode to `<id>`. Decoding joins words with single spaces and glues punctuation to the
word before it, so `decode(encode(text))` normalises whitespace but keeps the words.
"""

from __future__ import annotations

import re
import zlib

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
_MAX_REMEMBERED = 500_000
_ids: dict[str, int] = {}
_tokens: dict[int, str] = {}


def split(text: str) -> list[str]:
    """The token strings of `text`."""
    return _TOKEN_RE.findall(text)


def count(text: str) -> int:
    """Number of tokens in `text`."""
    return len(_TOKEN_RE.findall(text))


def token_id(token: str) -> int:
    """The stable id of one token string."""
    tid = _ids.get(token)
    if tid is None:
        tid = zlib.crc32(token.encode()) % (1 << 20) + 1000
        if len(_ids) < _MAX_REMEMBERED:
            _ids[token] = tid
            _tokens.setdefault(tid, token)
    return tid


def encode(text: str) -> list[int]:
    """Token ids of `text`."""
    toks = _TOKEN_RE.findall(text)
    get = _ids.get
    ids: list[int | None] = [get(t) for t in toks]
    if None in ids:
        return [token_id(t) if i is None else i for t, i in zip(toks, ids, strict=True)]
    return ids  # type: ignore[return-value]


def join(tokens: list[str]) -> str:
    """Render token strings as text: spaces between words, punctuation attached."""
    out: list[str] = []
    for tok in tokens:
        if out and (tok[0].isalnum() or tok[0] == "_"):
            out.append(" ")
        out.append(tok)
    return "".join(out)


def decode(ids: list[int]) -> str:
    """Text of token ids (ids never seen decode as `<id>`)."""
    return join([_tokens.get(i, f"<{i}>") for i in ids])
