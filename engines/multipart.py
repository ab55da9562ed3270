"""`multipart/form-data` (RFC 7578): a body read whole, within its cap, cut into parts; and parts
written back for an engine.

Only what form uploads use: each part's `Content-Disposition: form-data; name="…"` (and `filename`
for a file) and its `Content-Type`; no nested multiparts, no transfer encodings. A body that does
not follow the format raises `ValueError` saying where.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

#: parts one request may carry (a transcription form has about ten)
MAX_PARTS = 64
_BOUNDARY = re.compile(r'boundary=(?:"([^"]{1,70})"|([^\s;,"]{1,70}))', re.I)
_PARAM = re.compile(r';\s*([\w*-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;]+))')


@dataclass(slots=True)
class Part:
    name: str
    data: bytes
    filename: str | None = None
    content_type: str | None = None

    @property
    def text(self) -> str:
        """The part's value as text (a form field); `ValueError` when it is not UTF-8."""
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"the value of '{self.name}' is not UTF-8 text") from None


def boundary(content_type: str) -> str | None:
    """The boundary of a `multipart/form-data` content type; None for another type."""
    if not content_type.lower().lstrip().startswith("multipart/form-data"):
        return None
    m = _BOUNDARY.search(content_type)
    return (m.group(1) or m.group(2)) if m else None


def parse(body: bytes, boundary: str) -> list[Part]:
    """The parts of `body`, in order (`ValueError` for a body that is not such a form)."""
    delimiter = b"--" + boundary.encode("latin-1")
    pos = body.find(delimiter)
    if pos < 0:
        raise ValueError("the body does not contain its boundary")
    pos += len(delimiter)
    parts: list[Part] = []
    while not body.startswith(b"--", pos):
        if not body.startswith(b"\r\n", pos):
            raise ValueError("a boundary line is not followed by CRLF")
        if len(parts) == MAX_PARTS:
            raise ValueError(f"more than {MAX_PARTS} parts")
        head_end = body.find(b"\r\n\r\n", pos + 2)
        if head_end < 0:
            raise ValueError("a part's headers do not end")
        end = body.find(b"\r\n" + delimiter, head_end + 4)
        if end < 0:
            raise ValueError("the last part is not closed by the boundary")
        parts.append(_part(body[pos + 2 : head_end], body[head_end + 4 : end]))
        pos = end + 2 + len(delimiter)
    return parts


def _part(head: bytes, data: bytes) -> Part:
    name: str | None = None
    filename: str | None = None
    content_type: str | None = None
    for line in head.split(b"\r\n"):
        key, sep, value = line.decode("utf-8", "replace").partition(":")
        if not sep:
            raise ValueError("a part's header line has no colon")
        key = key.strip().lower()
        if key == "content-disposition":
            params = {k.lower(): (q.replace('\\"', '"') if q else t) for k, q, t in _PARAM.findall(value)}
            if not value.strip().lower().startswith("form-data"):
                raise ValueError("a part is not form-data")
            name, filename = params.get("name"), params.get("filename")
        elif key == "content-type":
            content_type = value.strip()
    if name is None:
        raise ValueError("a part has no name")
    return Part(name, data, filename, content_type)


def new_boundary(parts: list[Part]) -> str:
    """A random boundary that none of `parts` contains."""
    while True:
        candidate = "gateway-" + secrets.token_hex(16)
        marker = candidate.encode()
        if not any(marker in p.data for p in parts):
            return candidate


def encode(parts: list[Part], boundary: str) -> bytes:
    """`parts` as a `multipart/form-data` body with `boundary` (one that none of them contains)."""
    delimiter = b"--" + boundary.encode("latin-1")
    out: list[bytes] = []
    for p in parts:
        disposition = f'form-data; name="{_quoted(p.name)}"'
        if p.filename is not None:
            disposition += f'; filename="{_quoted(p.filename)}"'
        head = f"Content-Disposition: {disposition}\r\n"
        if p.content_type is not None:
            head += f"Content-Type: {p.content_type}\r\n"
        out += [delimiter, b"\r\n", head.encode(), b"\r\n", p.data, b"\r\n"]
    out += [delimiter, b"--\r\n"]
    return b"".join(out)


def _quoted(value: str) -> str:
    """A name or filename inside quotes, escaped as browsers and httpx escape it (HTML's rule)."""
    return value.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")
