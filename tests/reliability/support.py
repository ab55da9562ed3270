"""Tools of the reliability and security suites: raw sockets, process figures, metric reading.

Everything talks to real processes on loopback. `RawClient` speaks HTTP/1.1 by hand, so a test can
stop at any byte (half a header block, half a body), read nothing for a while, or close at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from typing import Any

import orjson

from gateway.admission.tokens import mint_token
from tests.conftest import MODEL
from tests.support import HTTP

#: the JWT secret of every gateway these suites start (never a real one)
SECRET = "reliability-suite-secret-" + "x" * 24


def token(sub: str = "alice", *, admin: bool = False, ttl_s: int = 3600, now: float | None = None) -> str:
    return mint_token(SECRET, sub, roles=["admin"] if admin else None, ttl_s=ttl_s, now=now)


def bearer(tok: str) -> dict[str, str]:
    return {"authorization": f"Bearer {tok}"}


def chat(i: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"question number {i}"}],
        "max_tokens": 8,
        **extra,
    }


def events(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


def sim_stats(base_url: str) -> dict[str, Any]:
    return dict(HTTP.get(base_url + "/sim/stats", timeout=5).json())


def sim_faults(base_url: str, **faults: Any) -> None:
    HTTP.post(base_url + "/sim/faults", json=faults, timeout=5).raise_for_status()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 when there is none)."""
    total = 0.0
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)$")
    for line in text.splitlines():
        m = pattern.match(line)
        if not m:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


def kernel_queued_bytes(ports: set[int]) -> int:
    """Bytes sitting in the kernel's send and receive queues of loopback TCP sockets on `ports`."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local = int(fields[1].rsplit(":", 1)[1], 16)
            remote = int(fields[2].rsplit(":", 1)[1], 16)
            if local in ports or remote in ports:
                tx, rx = (int(x, 16) for x in fields[4].split(":"))
                total += tx + rx
    return total


class RawClient:
    """One HTTP/1.1 connection driven by hand. Use as a context manager; `close()` is abrupt."""

    def __init__(self, port: int, *, rcvbuf: int | None = None, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def recv_some(self, n: int = 65536) -> bytes:
        return self.sock.recv(n)

    def read_until(self, marker: bytes, limit: int = 1 << 27) -> bytes:
        """Read until `marker` has been seen, the peer closes, or `limit` bytes (timeout applies)."""
        buf = bytearray()
        while len(buf) < limit:
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                break
            if not chunk:
                break
            buf += chunk
            if marker in buf[-(len(chunk) + len(marker)) :]:
                break
        return bytes(buf)

    def read_response(self) -> tuple[int, dict[str, str], bytes]:
        """One whole response with a Content-Length body (or until close)."""
        head = self.read_until(b"\r\n\r\n", limit=1 << 20)
        if b"\r\n\r\n" not in head:
            return 0, {}, head
        raw_head, _, rest = head.partition(b"\r\n\r\n")
        lines = raw_head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length", "-1"))
        body = bytearray(rest)
        while length < 0 or len(body) < length:
            try:
                chunk = self.sock.recv(65536)
            except (TimeoutError, OSError):
                break
            if not chunk:
                break
            body += chunk
        return status, headers, bytes(body)


def http_request(
    path: str,
    body: dict[str, Any] | bytes | None = None,
    *,
    method: str = "POST",
    headers: dict[str, str] | None = None,
) -> bytes:
    """A complete HTTP/1.1 request as bytes."""
    raw = body if isinstance(body, bytes) else (orjson.dumps(body) if body is not None else b"")
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1", "content-type: application/json"]
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    lines.append(f"content-length: {len(raw)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + raw
