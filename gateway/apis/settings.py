"""Settings of the apis wing: the Responses API's store (docs/configuration.md, `apis`)."""

from __future__ import annotations

from pydantic import Field

from gateway.core.settings import SettingsModel


class ResponsesSettings(SettingsModel):
    #: seconds a stored response (`store: true`, the default) can be read back or continued with
    #: `previous_response_id`; Redis keys expire, the memory store drops them
    store_ttl_s: float = Field(86400.0, gt=0)


class ApisSettings(SettingsModel):
    responses: ResponsesSettings = ResponsesSettings()
