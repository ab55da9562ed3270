"""The sgl_kernel stand-in fails loudly: an op without a PyTorch version raises StandInKernelMissing when
called, an unknown submodule raises it when imported; only the listed import-time probes get SGLang's
ModuleNotFoundError. Run in a fresh interpreter (the package installs an import hook)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.real_engines.servers import STAND_IN_KERNELS

pytestmark = pytest.mark.processes

PROBE = """
import importlib, json, sgl_kernel
from sgl_kernel import StandInKernelMissing, silu_and_mul
out = {"repr": repr(silu_and_mul)}
try:
    silu_and_mul(1, 2)
except StandInKernelMissing as exc:
    out["call"] = str(exc)
try:
    importlib.import_module("sgl_kernel.flash_attn")
except StandInKernelMissing as exc:
    out["submodule"] = str(exc)
absent = {}
for name in sgl_kernel.ABSENT_MODULES:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        absent[name] = exc.name
out["absent"] = absent
out["is_import_error"] = issubclass(StandInKernelMissing, (ImportError, AttributeError))
print(json.dumps(out))
"""


def test_missing_ops_and_modules_fail_loudly() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(STAND_IN_KERNELS)},
        timeout=60,
    )
    out = json.loads(result.stdout)
    assert "silu_and_mul is missing" in out["repr"]
    assert "sgl_kernel op silu_and_mul has no PyTorch stand-in" in out["call"]
    assert "sgl_kernel.flash_attn has no PyTorch stand-in" in out["submodule"]
    assert out["absent"] == {
        "sgl_kernel.scalar_type": "sgl_kernel.scalar_type",
        "sgl_kernel.allreduce": "sgl_kernel.allreduce",
    }
    assert out["is_import_error"] is False  # no `except ImportError` can swallow it
