"""The media stage: every image, audio and video item of a chat-shaped body, before anything is
forwarded (the rules: policies/media.py).

For each content part of each message:
1. keys an engine would deserialise (`image_embeds`, `image_pil`, ...) are refused;
2. each media item (`image_url`, `audio_url`, `video_url`, `input_audio`) counts against
   `max_parts`; a `data:` URL must be base64 with a media type and at most `max_bytes` decoded;
3. an `http(s)` URL of an allowed host is fetched by the gateway (`MediaFetcher`) and replaced by the
   `data:` URL of what it fetched; any other URL is refused;
4. a part's `uuid` (vLLM reuses a cached item by it) is put in the caller's tenant's namespace, so one
   tenant can never name another's cached media.

A refusal is a 400 `invalid_request_error` naming the part (`messages[0].content[1].image_url`) and
why; the request never reaches an engine. The Responses and Messages APIs are translated to this
shape first, so the same rules apply to them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, NoReturn

from engines.errors import ApiError, invalid_request
from gateway.admission.media_fetch import MediaFetcher, MediaRefused
from gateway.admission.settings import MediaSettings
from gateway.core.context import RequestContext
from gateway.core.responses import Response
from policies.media import INLINE_AUDIO_KEY, media_refs, parse_data_url, refused_keys

#: (stage, reason, ctx) → count a rejection (gateway_rejections)
RejectHook = Callable[[str, str, RequestContext], None]


class MediaStage:
    name = "media"

    def __init__(self, settings: MediaSettings, fetcher: MediaFetcher, on_reject: RejectHook) -> None:
        self._max_parts = settings.max_parts
        self._max_bytes = settings.max_bytes
        self._fetcher = fetcher
        self._on_reject = on_reject

    async def __call__(self, ctx: RequestContext) -> Response | None:
        messages = ctx.body.get("messages")
        if type(messages) is not list:
            return None
        count = 0
        for i, message in enumerate(messages):
            content = message.get("content") if type(message) is dict else None
            if type(content) is not list:
                continue
            for j, part in enumerate(content):
                if type(part) is dict and part.keys() - _TEXT_KEYS:
                    count = await self._part(ctx, part, f"messages[{i}].content[{j}]", count)
        return None

    async def _part(self, ctx: RequestContext, part: dict[str, Any], where: str, count: int) -> int:
        for key in refused_keys(part):
            self._refuse(
                ctx, "media_embeds", f"{where}.{key}", "it carries tensors or objects, which are not accepted"
            )
        for ref in media_refs(part):
            count += 1
            param = f"{where}.{ref.key}"
            if count > self._max_parts:
                self._refuse(
                    ctx, "media_count", param, f"a request may carry at most {self._max_parts} media items"
                )
            if ref.url is None:
                if not isinstance(part.get("uuid"), str):
                    self._refuse(ctx, "media_url", param, "it has no URL")
                continue  # the engine's item cached under the part's (namespaced) uuid
            data = parse_data_url(ref.url)
            if data is not None:
                if data.size > self._max_bytes:
                    self._refuse(ctx, "media_size", param, f"it is larger than {self._max_bytes} bytes")
                continue
            if ref.key == INLINE_AUDIO_KEY:
                self._refuse(ctx, "media_url", param, "its data is not base64")
            if ref.url.startswith("data:"):
                self._refuse(ctx, "media_url", param, "a data: URL must be base64 with a media type")
            try:
                inline = await self._fetcher.fetch(ref.url, ref.kind)
            except MediaRefused as why:
                self._refuse(ctx, "media_url", param, str(why), url=ref.url)
            _replace_url(part, ref.key, inline)
        uuid = part.get("uuid")
        if isinstance(uuid, str):
            part["uuid"] = _namespaced(uuid, ctx.principal.tenant or ctx.principal.user)
        return count

    def _refuse(
        self, ctx: RequestContext, reason: str, param: str, why: str, *, url: str | None = None
    ) -> NoReturn:
        self._on_reject(self.name, reason, ctx)
        raise _refusal(ctx, param, why, url)


#: the keys of a plain text part (or a refusal): nothing to look at
_TEXT_KEYS = frozenset(("type", "text", "refusal", "cache_control"))


def _refusal(ctx: RequestContext, param: str, why: str, url: str | None) -> ApiError:
    """A 400 naming the part: by its path in a chat-shaped body (chat, tokenize); in the APIs
    translated to chat (Responses, Messages), whose paths differ, by its kind and URL."""
    key = param.rsplit(".", 1)[-1]
    code = "invalid_image_url" if key == "image_url" else "invalid_media_url"
    shown = f" ({url[:200]})" if url else ""
    if ctx.api in ("chat", "completions", "tokenize"):
        return invalid_request(f"Invalid '{param}'{shown}: {why}.", param=param, code=code)
    kind = key.partition("_")[0] if key != INLINE_AUDIO_KEY else "audio"
    return invalid_request(f"Invalid {kind}{shown or ' in the request'}: {why}.", param=None, code=code)


def _replace_url(part: dict[str, Any], key: str, url: str) -> None:
    value = part[key]
    if isinstance(value, dict):
        value["url"] = url
    else:
        part[key] = url


def _namespaced(uuid: str, owner: str) -> str:
    """`uuid` in `owner`'s namespace: the same for the same owner, unguessable for any other."""
    return hashlib.blake2b(f"{owner}\0{uuid}".encode(), digest_size=16).hexdigest()
