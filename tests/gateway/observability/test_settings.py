"""The tracing settings: a config that still chooses an exporter loads, with a warning."""

from __future__ import annotations

import pytest

from gateway.removed_settings import RemovedSettingWarning
from gateway.settings import parse_settings
from tests.conftest import single_pool_config


def test_tracing_exporter_is_gone_with_a_warning() -> None:
    config = single_pool_config("vllm", ["http://127.0.0.1:9"])
    config["tracing"] = {"enabled": True, "exporter": "sdk", "sample_ratio": 0.5}
    with pytest.warns(RemovedSettingWarning, match="tracing.exporter is gone and ignored") as caught:
        tracing = parse_settings(config, environ={}).tracing
    assert len(caught) == 1
    assert tracing.enabled and tracing.sample_ratio == 0.5
    assert "exporter" not in tracing.model_dump()
