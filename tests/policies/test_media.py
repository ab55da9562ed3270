"""policies/media.py: where media sits in a part, which URLs and addresses may reach an engine."""

from __future__ import annotations

import pytest

from policies.features import extract_features
from policies.media import (
    MEDIA_TOKENS,
    host_allowed,
    media_digest,
    media_refs,
    parse_data_url,
    parse_remote_url,
    refused_address,
    refused_keys,
)


def test_media_is_found_under_every_key_an_engine_reads_whatever_the_type() -> None:
    assert [r.url for r in media_refs({"type": "image_url", "image_url": {"url": "http://a/x.png"}})] == [
        "http://a/x.png"
    ]
    # vLLM parses untyped parts, and parts with a uuid, by their keys alone
    assert [r.url for r in media_refs({"image_url": "http://a/y.png"})] == ["http://a/y.png"]
    smuggled = {"type": "text", "text": "hi", "uuid": "u", "video_url": {"url": "http://b/v.mp4"}}
    assert [(r.key, r.kind) for r in media_refs(smuggled)] == [("video_url", "video")]
    assert [
        r.kind for r in media_refs({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}})
    ] == ["audio"]
    assert media_refs({"type": "image_url", "image_url": None})[0].url is None
    assert media_refs({"type": "image_url", "image_url": 42})[0].url == "42"
    assert media_refs({"type": "text", "text": "just text"}) == []


def test_tensor_and_object_keys_are_refused() -> None:
    assert refused_keys({"type": "image_embeds", "image_embeds": "..."}) == ["image_embeds"]
    assert refused_keys({"image_pil": "x", "prompt_embeds": "y"}) == ["prompt_embeds", "image_pil"]
    assert refused_keys({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}) == []


def test_data_urls_give_their_type_and_decoded_size() -> None:
    assert parse_data_url("data:image/png;base64,AAAA") == ("image/png", 3)
    assert parse_data_url("data:image/png;base64,AA==") == ("image/png", 1)
    assert parse_data_url("data:audio/wav;codecs=1;base64,AAAAAAAA") == ("audio/wav", 6)
    assert parse_data_url("data:image/png,rawbytes") is None  # not base64
    assert parse_data_url("data:;base64,AAAA") is None  # no media type
    assert parse_data_url("http://x/data:image/png;base64,") is None


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "/etc/passwd", "ftp://host/x.png", "gopher://h/", "http:///nohost", "http://[::1"],
)
def test_only_http_urls_with_a_host_are_remote(url: str) -> None:
    assert parse_remote_url(url) is None


def test_remote_urls_parse_host_and_port() -> None:
    assert parse_remote_url("https://Images.Example.com./a.png") == ("https", "images.example.com", 443)
    assert parse_remote_url("http://[::1]:8080/x") == ("http", "::1", 8080)
    assert parse_remote_url("http://user@169.254.169.254/") == ("http", "169.254.169.254", 80)


def test_allow_list_matches_names_and_wildcards_only() -> None:
    allowed = ["images.example.com", "*.cdn.example.org"]
    assert host_allowed("images.example.com", allowed)
    assert host_allowed("IMAGES.example.com.", allowed)
    assert host_allowed("a.b.cdn.example.org", allowed)
    assert not host_allowed("cdn.example.org", allowed)  # a wildcard names the hosts under it
    assert not host_allowed("evilcdn.example.org", allowed)
    assert not host_allowed("images.example.com.evil.net", allowed)
    assert not host_allowed("anything", [])


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("169.254.169.254", "link-local"),
        ("127.0.0.1", "loopback"),
        ("127.8.9.1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "not a public"),
        ("0.0.0.0", "private"),
        ("224.0.0.1", "not a public"),
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("fd00::1", "private"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "link-local"),
        ("64:ff9b::a9fe:a9fe", "link-local"),
        ("2002:7f00:0001::", "loopback"),
        ("not-an-ip", "not an IP"),
    ],
)
def test_internal_addresses_are_refused(address: str, why: str) -> None:
    reason = refused_address(address)
    assert reason is not None and why in reason


def test_public_addresses_pass_unless_they_are_the_gateways_own() -> None:
    assert refused_address("93.184.216.34") is None
    assert refused_address("2606:4700:4700::1111") is None
    own = frozenset({"93.184.216.34"})
    assert "the gateway" in (refused_address("93.184.216.34", own) or "")


def _chat(url: str) -> dict[str, object]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You describe pictures. " * 20},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this picture? " * 10},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            },
        ],
    }


def test_different_images_differ_from_the_image_on_and_share_what_comes_before() -> None:
    a = extract_features(_chat("data:image/png;base64," + "A" * 40_000))
    b = extract_features(_chat("data:image/png;base64," + "B" * 40_000))
    again = extract_features(_chat("data:image/png;base64," + "A" * 40_000))
    assert a.block_hashes == again.block_hashes
    assert a.block_hashes != b.block_hashes
    shared = sum(1 for x, y in zip(a.block_hashes, b.block_hashes, strict=False) if x == y)
    assert shared >= a.preamble_blocks > 0  # the system prompt's blocks are still one prefix


def test_an_image_counts_as_its_token_estimate_not_its_base64_length() -> None:
    big = extract_features(_chat("data:image/png;base64," + "A" * 400_000))
    small = extract_features(_chat("data:image/png;base64,AAAA"))
    assert big.prompt_tokens == small.prompt_tokens
    text = _chat("")
    text["messages"][1]["content"] = text["messages"][1]["content"][:1]  # type: ignore[index]
    without = extract_features(text).prompt_tokens
    assert MEDIA_TOKENS["image"] <= big.prompt_tokens - without <= MEDIA_TOKENS["image"] + 16


def test_digest_names_content() -> None:
    assert media_digest("data:image/png;base64,AAAA") == media_digest("data:image/png;base64,AAAA")
    assert media_digest("data:image/png;base64,AAAA") != media_digest("data:image/png;base64,AAAB")
