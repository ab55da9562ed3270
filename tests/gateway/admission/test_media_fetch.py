"""MediaFetcher on httpx's MockTransport and a fake resolver: what it connects to, and what it refuses."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest

from gateway.admission.media_fetch import MAX_REDIRECTS, MediaFetcher, MediaRefused

PUBLIC = "93.184.216.34"
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64

DNS = {
    "images.example.com": [PUBLIC],
    "rebind.example.com": [PUBLIC, "127.0.0.1"],
    "metadata.example.com": ["169.254.169.254"],
    "inside.example.com": ["10.0.0.7"],
    "engine.internal": ["203.0.113.9"],
}


async def resolve(host: str, port: int) -> list[str]:
    if host not in DNS:
        raise OSError(f"no such host {host}")
    return DNS[host]


def fetcher(
    handler: httpx.MockTransport,
    *,
    max_bytes: int = 4096,
    allowed: tuple[str, ...] = ("*.example.com",),
    **kw: object,
) -> MediaFetcher:
    return MediaFetcher(
        allowed,
        max_bytes,
        5.0,
        resolve=resolve,
        transport=handler,
        local=frozenset(),
        **kw,  # type: ignore[arg-type]
    )


def serve(*responses: httpx.Response) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    seen: list[httpx.Request] = []
    queue = list(responses)

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return queue.pop(0)

    return httpx.MockTransport(handle), seen


async def test_an_allowed_url_is_fetched_from_the_checked_address_and_inlined() -> None:
    transport, seen = serve(httpx.Response(200, content=PNG, headers={"content-type": "image/png"}))
    url = await fetcher(transport).fetch("https://images.example.com/cat.png?size=2", "image")
    assert url == "data:image/png;base64," + base64.b64encode(PNG).decode()
    (request,) = seen
    assert request.url.host == PUBLIC and request.url.path == "/cat.png" and request.url.query == b"size=2"
    assert request.headers["host"] == "images.example.com"
    assert request.extensions["sni_hostname"] == "images.example.com"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://evil.net/x.png", "not on the gateway's media allow-list"),
        ("http://169.254.169.254/latest/meta-data/", "not on the gateway's media allow-list"),
        ("https://metadata.example.com/x.png", "link-local"),
        ("https://inside.example.com/x.png", "private"),
        ("https://rebind.example.com/x.png", "loopback"),  # one bad address refuses the name
        ("https://missing.example.com/x.png", "does not resolve"),
        ("file:///etc/passwd", r"only data: URLs and http\(s\) URLs"),
    ],
)
async def test_refused_urls_are_never_requested(url: str, why: str) -> None:
    transport, seen = serve()
    with pytest.raises(MediaRefused, match=why):
        await fetcher(transport).fetch(url, "image")
    assert seen == []


async def test_an_allowed_ip_literal_is_still_judged_by_its_address() -> None:
    transport, seen = serve()
    with pytest.raises(MediaRefused, match="loopback"):
        await fetcher(transport, allowed=("127.0.0.1",)).fetch("http://127.0.0.1:8080/admin/pools", "image")
    assert seen == []


async def test_every_redirect_is_checked_like_the_first_url() -> None:
    transport, seen = serve(httpx.Response(302, headers={"location": "http://metadata.example.com/latest/"}))
    with pytest.raises(MediaRefused, match="link-local"):
        await fetcher(transport).fetch("https://images.example.com/cat.png", "image")
    assert len(seen) == 1

    hops = [httpx.Response(301, headers={"location": f"/hop{i}"}) for i in range(MAX_REDIRECTS + 1)]
    transport, seen = serve(*hops)
    with pytest.raises(MediaRefused, match="redirects more than"):
        await fetcher(transport).fetch("https://images.example.com/cat.png", "image")
    assert len(seen) == MAX_REDIRECTS + 1


async def test_a_relative_redirect_on_an_allowed_host_is_followed() -> None:
    transport, seen = serve(
        httpx.Response(302, headers={"location": "/real.png"}),
        httpx.Response(200, content=PNG, headers={"content-type": "image/png"}),
    )
    await fetcher(transport).fetch("https://images.example.com/cat.png", "image")
    assert [r.url.path for r in seen] == ["/cat.png", "/real.png"]


async def test_size_cap_by_declared_length_and_by_the_bytes_read() -> None:
    transport, _ = serve(httpx.Response(200, content=b"x" * 5000, headers={"content-type": "image/png"}))
    with pytest.raises(MediaRefused, match="larger than 4096 bytes"):
        await fetcher(transport).fetch("https://images.example.com/big.png", "image")

    async def chunks() -> object:
        for _ in range(10):
            yield b"x" * 1000

    streamed = httpx.Response(200, content=chunks(), headers={"content-type": "image/png"})  # no length
    transport, _ = serve(streamed)
    with pytest.raises(MediaRefused, match="larger than 4096 bytes"):
        await fetcher(transport).fetch("https://images.example.com/big.png", "image")


@pytest.mark.parametrize(
    ("response", "why"),
    [
        (httpx.Response(404), "answered 404"),
        (
            httpx.Response(200, content=b"<html>", headers={"content-type": "text/html"}),
            "sent text/html, not an image",
        ),
        (httpx.Response(200, content=PNG, headers={"content-type": "audio/wav"}), "not an image"),
    ],
)
async def test_what_the_server_answers_must_be_the_media_asked_for(
    response: httpx.Response, why: str
) -> None:
    transport, _ = serve(response)
    with pytest.raises(MediaRefused, match=why):
        await fetcher(transport).fetch("https://images.example.com/cat.png", "image")


async def test_a_server_that_does_not_answer_is_cut_off_at_the_timeout() -> None:
    never = asyncio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        await never.wait()
        raise AssertionError("unreachable")

    f = MediaFetcher(
        ("*.example.com",),
        4096,
        0.01,
        resolve=resolve,
        transport=httpx.MockTransport(hang),
        local=frozenset(),
    )
    with pytest.raises(MediaRefused, match="took longer than"):
        await f.fetch("https://images.example.com/slow.png", "image")


async def test_an_engines_address_is_refused_even_when_public() -> None:
    transport, seen = serve()
    DNS["cdn.example.com"] = ["203.0.113.9"]
    try:
        f = fetcher(transport, engine_hosts=lambda: ["engine.internal"])
        with pytest.raises(MediaRefused, match="gateway or its engines"):
            await f.fetch("https://cdn.example.com/x.png", "image")
    finally:
        del DNS["cdn.example.com"]
    assert seen == []
