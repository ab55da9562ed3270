"""The admin console: a static shell and its assets, served from memory under `/admin/ui`.

The shell holds no data and needs no credential: the page asks the operator for an admin token,
keeps it in the tab's `sessionStorage` and calls the admin REST API (`/admin/*`) with it, like any
other client of that API (docs/operations.md, "Admin console"). So the console adds no endpoint that
reads or changes anything, and no cost to the request path: the files are read once, when the admin
app is built, and only paths under `/admin/ui` reach them.

Every answer carries a strict Content-Security-Policy (scripts, styles and connections from this
origin only, nothing inline, no framing), `X-Frame-Options: DENY`, `nosniff` and an ETag, with
`Cache-Control: no-cache` so a browser revalidates (a 304) and sees a new release at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import Response

#: where the assets live, inside this package (package data: pyproject.toml)
ASSETS = "ui"
#: the page the console's paths without a file name answer
INDEX = "index.html"
#: file suffix -> content type; files of other kinds are not served
TYPES: dict[str, str] = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "font-src 'none'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS: dict[str, str] = {
    "content-security-policy": CSP,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "cache-control": "no-cache",
}


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


class Console:
    """The console's files by name, in memory."""

    def __init__(self, files: Mapping[str, bytes]) -> None:
        self.assets: dict[str, Asset] = {}
        for name, body in files.items():
            suffix = name[name.rfind(".") :] if "." in name else ""
            kind = TYPES.get(suffix)
            if kind is not None:
                etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
                self.assets[name] = Asset(body, kind, etag)
        if INDEX not in self.assets:
            raise RuntimeError(f"the admin console has no {INDEX} (package data missing?)")

    @classmethod
    def from_package(cls) -> Console:
        """The assets shipped in `gateway/control/ui/`."""
        folder = resources.files(__package__ or "gateway.control").joinpath(ASSETS)
        return cls({f.name: f.read_bytes() for f in folder.iterdir() if f.is_file()})

    def answer(self, name: str, if_none_match: str | None) -> Response:
        """The asset `name` (200, or 304 when the client's copy is current), or a 404."""
        asset = self.assets.get(name)
        if asset is None:
            return Response(b"Not found\n", 404, media_type="text/plain", headers=SECURITY_HEADERS)
        headers = {**SECURITY_HEADERS, "etag": asset.etag}
        if if_none_match is not None and asset.etag in if_none_match:
            return Response(status_code=304, headers=headers)
        return Response(asset.body, 200, media_type=asset.content_type, headers=headers)

    def install(self, app: FastAPI, prefix: str = "/admin/ui") -> None:
        """Serve the console on `app`: the shell at `prefix` and `prefix/`, each asset below it."""

        async def index(request: Request) -> Response:
            return self.answer(INDEX, request.headers.get("if-none-match"))

        async def asset(name: str, request: Request) -> Response:
            return self.answer(name, request.headers.get("if-none-match"))

        for path in (prefix, prefix + "/"):
            app.add_api_route(path, index, methods=["GET"], include_in_schema=False)
        app.add_api_route(prefix + "/{name}", asset, methods=["GET"], include_in_schema=False)
