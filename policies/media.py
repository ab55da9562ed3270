"""Media in chat content parts: where a part carries it, whether its URL may reach an engine, its
identity for prefix keys, and its share of the token estimate. Pure: no DNS, no sockets.

vLLM and SGLang fetch media URLs themselves, so a URL in a request is a request the engine makes
inside the fleet's network. The rules, applied by the gateway's media stage (gateway/admission/media.py):

1. A part's media is read from every key an engine reads it from (`MEDIA_KEYS`), whatever the part's
   `type`: vLLM also parses untyped parts, and parts with a `uuid`, by their keys alone.
2. Tensors and pickled objects (`REFUSED_KEYS`: vLLM's `*_embeds`, `image_pil`) are refused.
3. A `data:` URL is taken as it is (within the size cap); an `http(s)` URL only when its host is on the
   operator's allow-list; any other scheme (`file:`, a bare path, which SGLang opens as a local file)
   is refused.
4. An allowed host is resolved, and every address must be public (`refused_address`): loopback,
   private, link-local, shared, reserved and multicast ranges, their IPv4-in-IPv6 forms, and the
   gateway's own addresses are refused, at every redirect. The gateway then fetches the media itself
   and forwards it inline, so the engine never resolves or follows the URL.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable
from typing import Any, NamedTuple
from urllib.parse import urlsplit

#: part keys whose value (a URL string, or an object with `url`) an engine fetches
MEDIA_KEYS = ("image_url", "audio_url", "video_url")
#: part keys that carry tensors or Python objects an engine deserialises: never forwarded
REFUSED_KEYS = ("image_embeds", "audio_embeds", "video_embeds", "prompt_embeds", "image_pil")
#: a part key whose value is inline base64 audio (`{"data", "format"}`), fetched by nobody
INLINE_AUDIO_KEY = "input_audio"

#: the token estimate of one media item, for limits before the engine reports usage (reconciled after):
#: a 1024x1024 image is ~1.3k tokens for Qwen2.5-VL (28x28 pixels a token), 30 s of audio 1.5k for a
#: Whisper encoder, a short video a few frames' worth
MEDIA_TOKENS = {"image": 1024, "audio": 1500, "video": 4096}


class MediaRef(NamedTuple):
    """One media item of a part: the key it sits under, its kind and its URL (or inline data);
    `url` is None for a null value (vLLM then reuses the item cached under the part's `uuid`)."""

    key: str
    kind: str
    url: str | None


class DataUrl(NamedTuple):
    """A parsed `data:` URL: its media type (`image/png`) and the size of its decoded payload."""

    media_type: str
    size: int


def kind_of(key: str) -> str:
    """`image_url` -> `image`, `input_audio` -> `audio`."""
    return "audio" if key == INLINE_AUDIO_KEY else key.partition("_")[0]


def media_refs(part: dict[str, Any]) -> list[MediaRef]:
    """Every media item `part` carries, by key (a part normally has one). A value that is neither a
    string, null nor an object is returned as its string form, so the caller refuses it by name."""
    out: list[MediaRef] = []
    for key in MEDIA_KEYS:
        if key not in part:
            continue
        value = part[key]
        url = value.get("url") if isinstance(value, dict) else value
        out.append(MediaRef(key, kind_of(key), url if isinstance(url, str) or url is None else repr(url)))
    audio = part.get(INLINE_AUDIO_KEY)
    if isinstance(audio, dict):
        data = audio.get("data")
        fmt = audio.get("format")
        if isinstance(data, str):
            out.append(MediaRef(INLINE_AUDIO_KEY, "audio", f"data:audio/{fmt};base64,{data}"))
    return out


def refused_keys(part: dict[str, Any]) -> list[str]:
    """The keys of `part` that the gateway never forwards."""
    return [k for k in REFUSED_KEYS if k in part]


def parse_data_url(url: str) -> DataUrl | None:
    """A `data:<type>/<subtype>[;params];base64,<payload>` URL's type and decoded size; None when
    `url` is not such a URL (not base64, or no media type)."""
    if not url.startswith("data:"):
        return None
    head, sep, payload = url.partition(",")
    if not sep:
        return None
    params = head[5:].split(";")
    media_type = params[0].strip().lower()
    if "base64" not in (p.strip().lower() for p in params[1:]) or "/" not in media_type:
        return None
    padding = len(payload) - len(payload.rstrip("="))
    return DataUrl(media_type, len(payload) * 3 // 4 - padding)


class RemoteUrl(NamedTuple):
    """The parts of an `http(s)` URL the policy looks at."""

    scheme: str
    host: str
    port: int


def parse_remote_url(url: str) -> RemoteUrl | None:
    """An `http://` or `https://` URL with a host, or None."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".").lower()
    if scheme not in ("http", "https") or not host:
        return None
    return RemoteUrl(scheme, host, port if port is not None else (443 if scheme == "https" else 80))


def host_allowed(host: str, allowed: Iterable[str]) -> bool:
    """`host` is on the allow-list: an exact name or address, or `*.example.com` for any name under
    `example.com` (not `example.com` itself)."""
    host = host.rstrip(".").lower()
    for entry in allowed:
        entry = entry.rstrip(".").lower()
        if entry.startswith("*."):
            if host.endswith(entry[1:]) and len(host) > len(entry) - 1:
                return True
        elif host == entry:
            return True
    return False


def refused_address(address: str, own: frozenset[str] = frozenset()) -> str | None:
    """Why an engine must not fetch from `address` (an IP literal), or None when it may. IPv6 forms
    that embed an IPv4 address (mapped, 6to4, Teredo, NAT64) are judged by that address too."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return "not an IP address"
    # an embedded IPv4 address first: it names the host an IPv6 form reaches
    candidates: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    if isinstance(ip, ipaddress.IPv6Address):
        for embedded in (ip.ipv4_mapped, ip.sixtofour, ip.teredo[1] if ip.teredo else None):
            if embedded is not None:
                candidates.append(embedded)
        if ip in _NAT64:
            candidates.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    candidates.append(ip)
    for c in candidates:
        if str(c) in own:
            return "an address of the gateway or its engines"
        if c.is_loopback:
            return "a loopback address"
        if c.is_link_local:
            return "a link-local address"
        if c.is_private:
            return "a private address"
        if not c.is_global or c.is_multicast:
            return "not a public address"
    return None


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def media_digest(url: str) -> str:
    """The identity of a media item in prefix keys: a digest of its URL, which for the `data:` URLs
    the gateway forwards is its content, so different media never share a prefix."""
    return hashlib.blake2b(url.encode(), digest_size=12).hexdigest()
