"""Authentication never turns itself off: a missing key source is a start-up error, and anonymous
serving is explicit, loud and visible in a metric."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.settings import ConfigError, load_settings, parse_settings
from tests.conftest import MODEL, fast_sim, single_pool_config
from tests.support import HTTP, GatewayProcess

BASE: dict[str, Any] = {
    "models": [{"name": "m"}],
    "pools": [
        {
            "name": "p",
            "dialect": "vllm",
            "models": {"m": "m"},
            "backends": [{"name": "b", "url": "http://e:1"}],
        }
    ],
}


def settings(env: dict[str, str] | None = None, **sections: Any) -> Any:
    return parse_settings({**BASE, **sections}, environ=env or {})


@pytest.mark.parametrize(
    ("sections", "why"),
    [
        ({"auth": {"jwt": {}}}, "the config has an auth section"),
        ({"auth": {"enabled": True, "api_keys": {"enabled": False}}}, "the config has an auth section"),
        ({"server": {"host": "0.0.0.0"}}, "server.host 0.0.0.0 is reachable from other machines"),
        ({"server": {"host": "10.0.0.5"}}, "server.host 10.0.0.5 is reachable"),
    ],
)
def test_no_key_source_is_an_error_naming_what_is_missing(sections: dict[str, Any], why: str) -> None:
    with pytest.raises(ValueError, match=f"authentication has no key source \\({why}.*GATEWAY_JWT_SECRET"):
        settings(**sections)


def test_a_key_source_turns_authentication_on() -> None:
    assert settings(
        {"GATEWAY_JWT_SECRET": "s" * 32}, auth={"jwt": {}}, server={"host": "0.0.0.0"}
    ).auth.active
    assert settings(auth={"jwt": {"jwks_url": "https://idp.example/jwks"}}).auth.active
    api_keys_only = settings(auth={"enabled": True}, server={"host": "0.0.0.0"})
    assert api_keys_only.auth.active and not api_keys_only.auth.jwt.has_keys


def test_anonymous_only_when_asked_or_on_loopback_without_an_auth_section() -> None:
    assert not settings(auth={"enabled": False}, server={"host": "0.0.0.0"}).auth.active
    for host in ("127.0.0.1", "::1", "localhost"):
        assert not settings(server={"host": host}).auth.active


@pytest.mark.processes
def test_serve_refuses_to_start_and_says_why(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({**BASE, "auth": {"jwt": {}}}))
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith(f"gateway serve: {config}: auth: authentication has no key source")
    assert "Traceback" not in done.stderr
    with pytest.raises(ConfigError, match="auth section"):
        load_settings(config, environ={})


@pytest.mark.processes
def test_anonymous_serving_is_loud_and_in_a_metric() -> None:
    with fast_sim("vllm") as sim:
        config = single_pool_config("vllm", [sim.base_url], auth={"enabled": False})
        with GatewayProcess(config) as gateway:
            metrics = HTTP.get(gateway.base_url + "/metrics", timeout=10).text
            assert "gateway_auth_enabled 0.0" in metrics
            assert "AUTHENTICATION IS OFF" in gateway.server_log()
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
            assert (
                HTTP.post(gateway.base_url + "/v1/chat/completions", json=chat, timeout=10).status_code == 200
            )
