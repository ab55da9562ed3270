"""Every YAML file under deploy/ parses (all documents of it), and every gateway config shipped
there is a valid gateway config for the settings as they are now."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.settings import load_settings
from tests.deploy.manifests import DEPLOY, ROOT, load_all, yaml_files

FILES = yaml_files()

# the gateway configs: the example, compose's two, and the ConfigMap source of the k8s base
GATEWAY_CONFIGS = [
    DEPLOY / "gateway.example.yaml",
    DEPLOY / "compose/gateway.gpu.yaml",
    DEPLOY / "compose/gateway.sim.yaml",
    DEPLOY / "k8s/base/gateway.yaml",
]


def test_there_are_yaml_files_to_check() -> None:
    names = {str(p.relative_to(DEPLOY)) for p in FILES}
    assert {"compose/compose.yaml", "k8s/base/kustomization.yaml"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_parses(path: Path) -> None:
    docs = load_all(path)
    assert docs, f"{path} holds no document"
    for doc in docs:
        # JSON-patch files are lists; everything else is a mapping
        assert isinstance(doc, dict | list), f"{path}: a document is a {type(doc).__name__}"


@pytest.mark.parametrize("path", GATEWAY_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_gateway_configs_load(path: Path) -> None:
    settings = load_settings(path, environ={"GATEWAY_JWT_SECRET": "s" * 32})
    assert settings.server.host == "0.0.0.0"  # in a container, listening on loopback is useless
    assert settings.auth.active
    assert settings.pools and all(p.backends for p in settings.pools)
    # shutdown drains streams; every orchestrator here waits longer than this (see the compose and
    # k8s tests)
    assert 10 <= settings.server.graceful_shutdown_s <= 60


@pytest.mark.parametrize("path", GATEWAY_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_gateway_configs_refuse_to_start_without_their_secret(path: Path) -> None:
    """Listening beyond loopback, a shipped config never serves anonymously by accident."""
    with pytest.raises(ValueError, match=r"authentication has no key source.*GATEWAY_JWT_SECRET"):
        load_settings(path, environ={})
