"""The peers we compare against, each installed from PyPI into its own venv under `bench/.peers/`.

| peer          | PyPI package       | launched as                                                        |
|---------------|--------------------|--------------------------------------------------------------------|
| LiteLLM proxy | `litellm[proxy]`   | `litellm --config F` with one `openai/<model>` deployment per URL  |
| SGLang router | `sglang-router`    | `sglang-router launch --worker-urls … --policy P`                  |
| vLLM router   | `vllm-router`      | `vllm-router --worker-urls … --policy P` (a Rust fork of SGLang's) |

Installation is `python3 -m venv` + `pip install` (whatever the index resolves; the installed version
is read back and reported). A peer that fails to install or start is reported as unavailable, never
fatal. Both Rust routers get `--prometheus-host 127.0.0.1` (their metrics port stays on loopback) and a
warn log level (otherwise they log every request); LiteLLM gets `LITELLM_LOCAL_MODEL_COST_MAP=True` (it
would fetch its cost map from the internet at start-up), `HF_HUB_OFFLINE=1` (for a llama model name it
fetches a Hugging Face tokenizer to count streamed tokens, and each stream would wait ~23 s on retries)
and telemetry off.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.procs import BENCH, WORK, Service, free_port

PEERS_DIR = BENCH / ".peers"
LITELLM_KEY = "sk-bench-0123456789abcdef0123456789abcdef"


@dataclass(frozen=True)
class Peer:
    key: str  # venv directory name
    label: str
    package: str  # pip requirement
    dist: str  # distribution name to read the version of
    binary: str

    @property
    def venv(self) -> Path:
        return PEERS_DIR / self.key

    @property
    def exe(self) -> Path:
        return self.venv / "bin" / self.binary


LITELLM = Peer("litellm", "LiteLLM proxy", "litellm[proxy]", "litellm", "litellm")
SGLANG_ROUTER = Peer("sglang-router", "SGLang router", "sglang-router", "sglang-router", "sglang-router")
VLLM_ROUTER = Peer("vllm-router", "vLLM router", "vllm-router", "vllm-router", "vllm-router")
PEERS = (LITELLM, SGLANG_ROUTER, VLLM_ROUTER)


def installed_version(peer: Peer) -> str | None:
    py = peer.venv / "bin" / "python"
    if not py.exists() or not peer.exe.exists():
        return None
    out = subprocess.run(
        [str(py), "-c", f"import importlib.metadata as m; print(m.version({peer.dist!r}))"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or None if out.returncode == 0 else None


def ensure(peer: Peer, log: Callable[[str], None]) -> str | None:
    """Install `peer` into its venv unless it is there; its version, or None when it cannot be had."""
    version = installed_version(peer)
    if version:
        return version
    log(f"installing {peer.package} into {peer.venv} (once; may take minutes)")
    peer.venv.parent.mkdir(parents=True, exist_ok=True)
    logfile = WORK / "logs" / f"install-{peer.key}.log"
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "wb") as f:
        if not (peer.venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(peer.venv)], stdout=f, stderr=f, check=False)
        pip = peer.venv / "bin" / "pip"
        rc = subprocess.run([str(pip), "install", "-q", peer.package], stdout=f, stderr=f).returncode
    version = installed_version(peer)
    if rc != 0 or not version:
        log(f"  {peer.package} did not install (see {logfile})")
        return None
    log(f"  {peer.package} {version}")
    return version


def rust_router(peer: Peer, urls: list[str], policy: str, name: str | None = None) -> Service:
    """sglang-router or vllm-router on a free loopback port in front of `urls`."""
    port = free_port()
    if peer is SGLANG_ROUTER:
        argv = [str(peer.exe), "launch", "--log-level", "warn"]
    else:
        argv = [str(peer.exe), "--log-level", "warning"]
    argv += [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *urls,
        "--policy",
        policy,
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(free_port()),
    ]
    return Service(name or f"{peer.key}-{policy}", argv, port, probe="/health", start_timeout=60)


def litellm_proxy(urls: list[str], model: str, served: str, name: str = "litellm") -> Service:
    """LiteLLM's proxy with one OpenAI-compatible deployment per URL, all under `model`."""
    port = free_port()
    config = {
        "model_list": [
            {
                "model_name": model,
                "litellm_params": {"model": f"openai/{served}", "api_base": f"{u}/v1", "api_key": "none"},
            }
            for u in urls
        ],
        "litellm_settings": {"telemetry": False, "drop_params": True, "set_verbose": False},
        # LiteLLM refuses to start without a master key; with it, requests carry it as a bearer token
        "general_settings": {"disable_spend_logs": True, "master_key": LITELLM_KEY},
    }
    cfg = WORK / f"{name}.yaml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(yaml.safe_dump(config))
    argv = [
        str(LITELLM.exe),
        "--config",
        str(cfg),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--telemetry",
        "False",
    ]
    # offline: without HF_HUB_OFFLINE every stream waits ~23 s on retries to fetch a llama tokenizer
    env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    return Service(name, argv, port, probe="/health/liveliness", env=env, start_timeout=120)
