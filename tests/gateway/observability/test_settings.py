"""The tracing settings: a config that still chooses an exporter loads, with a warning."""

from __future__ import annotations

import logging

import pytest

from gateway.observability.settings import TracingSettings


def test_tracing_exporter_is_gone_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.settings"):
        tracing = TracingSettings.model_validate({"enabled": True, "exporter": "sdk", "sample_ratio": 0.5})
    assert tracing.enabled and tracing.sample_ratio == 0.5
    assert "exporter" not in tracing.model_dump()
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "tracing.exporter is gone" in record.getMessage()
