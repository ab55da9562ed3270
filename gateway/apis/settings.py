"""Settings of the apis wing: the Responses API's store (docs/configuration.md, `apis`)."""

from __future__ import annotations

from pydantic import Field

from gateway.core.settings import SettingsModel


class ResponsesSettings(SettingsModel):
    #: seconds a stored response (`store: true`, the default) can be read back or continued with
    #: `previous_response_id`; Redis keys expire, the memory store drops them
    store_ttl_s: float = Field(86400.0, gt=0)
    #: without Redis: at most this many stored responses in this process (the oldest go first)
    memory_max_entries: int = Field(10000, ge=1)
    #: a response whose stored record (its conversation so far) would exceed this is not stored:
    #: reading it back or continuing it answers 404 (a conversation resent in full always works)
    max_record_bytes: int = Field(8 * 1024 * 1024, ge=1024)


class ApisSettings(SettingsModel):
    responses: ResponsesSettings = ResponsesSettings()
