"""The gateways the benchmarks start take their configs: a setting removed from the gateway and still
in a bench config would stop a suite at its start (`parse_settings` refuses it here instead)."""

from __future__ import annotations

import warnings

from bench.targets import full_sections, gateway_config
from gateway.settings import parse_settings


def test_the_overhead_gateways_configs_are_valid_settings() -> None:
    bare = gateway_config("vllm", ["http://127.0.0.1:1"])
    full = gateway_config("vllm", ["http://127.0.0.1:1"], workers=2, **full_sections("redis://127.0.0.1:1/0"))
    for config in (bare, full):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a renamed setting warns: the bench must use the new name
            parse_settings(config, environ={})
