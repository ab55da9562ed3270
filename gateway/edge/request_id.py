"""Request ids: the client's `x-request-id` when it is safe to echo, else OpenAI's `req_` + 32 hex."""

from __future__ import annotations

from random import getrandbits

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:")


def new_request_id() -> str:
    return f"req_{getrandbits(128):032x}"


def request_id_from(headers: dict[bytes, bytes]) -> str:
    """The caller's id if it is 1–128 safe characters (no header injection), else a new one."""
    given = headers.get(b"x-request-id")
    if given and len(given) <= 128 and all(c in _SAFE for c in given):
        return given.decode("ascii")
    return new_request_id()
