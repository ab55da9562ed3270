"""The upstream settings: a config that still chooses an HTTP client loads, with a warning."""

from __future__ import annotations

import logging

import pytest

from gateway.settings import parse_settings
from tests.conftest import single_pool_config


def test_upstream_client_is_gone_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    config = single_pool_config("vllm", ["http://127.0.0.1:9"])
    config["upstream"] = {**config["upstream"], "client": "aiohttp", "keepalive_s": 7}
    with caplog.at_level(logging.WARNING, logger="gateway.settings"):
        settings = parse_settings(config, environ={})
    assert settings.upstream.keepalive_s == 7  # the rest of the section still applies
    assert "client" not in settings.upstream.model_dump()
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "upstream.client is gone" in record.getMessage()


def test_the_environment_override_is_warned_about_too(caplog: pytest.LogCaptureFixture) -> None:
    config = single_pool_config("vllm", ["http://127.0.0.1:9"])
    with caplog.at_level(logging.WARNING, logger="gateway.settings"):
        parse_settings(config, environ={"GATEWAY_UPSTREAM__CLIENT": "h1"})
    assert "upstream.client is gone" in caplog.text


def test_an_unknown_key_is_still_an_error() -> None:
    config = single_pool_config("vllm", ["http://127.0.0.1:9"])
    config["upstream"] = {"clients": "h1"}
    with pytest.raises(ValueError, match="clients"):
        parse_settings(config, environ={})
