"""What the overhead suite measures: one `Target` per way of reaching the same simulator.

A target is a base URL, the model name to send, extra headers (a JWT for the full pipeline) and the
process whose tree is charged with the CPU and memory (for `direct`, the simulator itself).

Our gateway runs from `gateway serve --config` with the test suite's single-pool config
(`tests.conftest.single_pool_config`), its access log off and log level `warning` (the peers run at
warn level too). *Bare* has no auth, limits or sanitising sections; *full pipeline* adds HS256 JWT
auth, Redis limits with a tier high enough never to refuse, and the sanitiser's defaults — only when
`gateway.settings.Settings` has those sections (`full_pipeline_available()`).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.procs import ROOT, WORK, Service, free_port
from gateway.admission.tokens import mint_token
from tests.conftest import MODEL, single_pool_config

JWT_SECRET = "bench-secret-not-for-production-0123456789abcdef"
GENEROUS = {
    "requests_per_minute": 1_000_000_000,
    "tokens_per_minute": 1_000_000_000_000,
    "concurrent_requests": 1_000_000,
}


@dataclass
class Target:
    key: str
    label: str
    base_url: str
    model: str
    service: Service | None  # None: the simulator itself is the target (direct)
    headers: dict[str, str] = field(default_factory=dict)
    charge_pid: int = 0  # whose process tree is charged with CPU and memory
    note: str = ""

    @property
    def chat_url(self) -> str:
        return self.base_url + "/v1/chat/completions"


@dataclass(frozen=True)
class GatewaySource:
    """Where the gateway under test is imported from: the working tree, or a snapshot of a git ref."""

    path: Path
    describe: str  # e.g. "working tree (HEAD 89c3e8e + uncommitted changes)" or "HEAD 89c3e8e"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def gateway_source(ref: str | None) -> GatewaySource:
    """`None`: the working tree. Otherwise `git archive <ref>` unpacked under bench/.work/src-<sha>."""
    sha = _git("rev-parse", "--short", ref or "HEAD")
    if ref is None:
        dirty = bool(_git("status", "--porcelain", "--", "gateway", "engines", "policies"))
        return GatewaySource(ROOT, f"working tree (HEAD {sha}{' + uncommitted changes' if dirty else ''})")
    dest = WORK / f"src-{sha}"
    if not (dest / "gateway").exists():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", sha], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return GatewaySource(dest, f"commit {sha}")


def source_has(source: GatewaySource, imports: str, expression: str) -> bool:
    """Whether `expression` is true of that gateway's code (after `imports`), asked in a process of
    its own: a committed gateway's modules are not this process's."""
    code = f"{imports}; print(bool({expression}))"
    env = {**os.environ, "PYTHONPATH": str(source.path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=source.path
    )
    return out.stdout.strip() == "True"


def full_pipeline_available(source: GatewaySource) -> bool:
    """Whether that gateway's settings have the admission sections (auth, limits, sanitise)."""
    return source_has(
        source,
        "from gateway.settings import Settings",
        "all(n in Settings.model_fields for n in ('auth', 'limits', 'sanitise'))",
    )


def gateway_config(engine: str, urls: list[str], *, workers: int = 1, **sections: Any) -> dict[str, Any]:
    cfg = single_pool_config(engine, urls)
    cfg["server"].update({"workers": workers, "log_level": "warning", "graceful_shutdown_s": 2})
    cfg["access_log"] = {"enabled": False}
    cfg["routing"] = {**cfg.get("routing", {}), "scrape_interval_s": 2.0}
    cfg["upstream"] = {"health": {"interval_s": 2.0, "failure_threshold": 3, "open_s": 1.0}}
    for key, value in sections.items():
        cfg[key] = copy.deepcopy(value)
    return cfg


def full_sections(redis_url: str) -> dict[str, Any]:
    return {
        "auth": {"jwt": {"secret": JWT_SECRET}},
        "limits": {"tiers": {"default": GENEROUS}},
        "sanitise": {},
        "redis": {"url": redis_url},
    }


def gateway_service(name: str, config: dict[str, Any], source: GatewaySource | None = None) -> Service:
    port = free_port()
    config = copy.deepcopy(config)
    config["server"]["port"] = port
    config["server"]["host"] = "127.0.0.1"
    path = WORK / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)]
    src = source.path if source else ROOT
    return Service(name, argv, port, probe="/readyz", start_timeout=60, source=src, cwd=src)


def bench_token() -> str:
    return mint_token(JWT_SECRET, "bench-user", tier="default", ttl_s=24 * 3600)


__all__ = [
    "MODEL",
    "GatewaySource",
    "Target",
    "bench_token",
    "full_pipeline_available",
    "full_sections",
    "gateway_config",
    "gateway_service",
    "gateway_source",
]
