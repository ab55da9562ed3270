"""The upstream settings: a config that still chooses an HTTP client loads, with a warning."""

from __future__ import annotations

import pytest

from gateway.removed_settings import RemovedSettingWarning
from gateway.settings import parse_settings
from tests.conftest import single_pool_config


def test_upstream_client_is_gone_with_a_warning() -> None:
    config = single_pool_config("vllm", ["http://127.0.0.1:9"])
    config["upstream"] = {**config["upstream"], "client": "aiohttp", "retries": {"max_attempts": 7}}
    with pytest.warns(RemovedSettingWarning, match="upstream.client is gone and ignored") as caught:
        settings = parse_settings(config, environ={})
    assert len(caught) == 1
    assert settings.upstream.retries.max_attempts == 7  # the rest of the section still applies
    assert "client" not in settings.upstream.model_dump()


def test_the_environment_override_is_warned_about_too() -> None:
    config = single_pool_config("vllm", ["http://127.0.0.1:9"])
    with pytest.warns(RemovedSettingWarning, match="upstream.client is gone"):
        parse_settings(config, environ={"GATEWAY_UPSTREAM__CLIENT": "h1"})


def test_an_unknown_key_is_still_an_error() -> None:
    config = single_pool_config("vllm", ["http://127.0.0.1:9"])
    config["upstream"] = {"clients": "h1"}
    with pytest.raises(ValueError, match="clients"):
        parse_settings(config, environ={})
