"""bench/tracerunner.py's pure parts: a refusal's error code."""

from __future__ import annotations

from bench.tracerunner import error_code


def test_error_code_of_a_refusal() -> None:
    assert error_code(b'{"error": {"type": "server_error", "code": "fleet_saturated"}}') == "fleet_saturated"
    assert error_code(b'{"error": {"type": "requests"}}') == "requests"
    assert error_code(b'{"error": "overloaded"}') is None
    assert error_code(b"not json") is None
    assert error_code(b"[1]") is None
