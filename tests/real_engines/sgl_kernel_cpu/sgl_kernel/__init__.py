"""Stand-in for SGLang's `sgl_kernel` (its compiled kernels), for the tests only.

No CPU build of `sgl_kernel` exists on PyPI (the `sglang-kernel` / `sgl-kernel` wheels are CUDA-only and
fail to load without libcuda), so the SGLang server in `tests/real_engines/` runs with this package on
its PYTHONPATH under the module name SGLang imports. It was meant to hold PyTorch versions of the ops
the tiny test model calls; on SGLang 0.5.23's CPU path that model calls **none**, so it provides no op
and only fails loudly for anything asked of it:

- `torch.ops.sgl_kernel` stays empty. SGLang probes `hasattr(torch.ops.sgl_kernel,
  "convert_weight_packed")` to decide whether its Intel AMX kernels are there: they are not, so every
  layer takes its plain-PyTorch path (`forward_native`: linear, RMSNorm, rotary, SiLU-and-mul; the
  `torch_native` attention backend, the `pytorch` sampling backend), as on a CPU without AMX. A
  direct call of any `torch.ops.sgl_kernel` op fails in torch ("no attribute").
- `sgl_kernel.<name>` is a `MissingOp`: SGLang imports ops by name when its modules load (e.g.
  `copy_all_layer_kv_cache_cpu`) and the tiny model calls none; calling one raises
  `StandInKernelMissing` (a RuntimeError, not an ImportError, so no `except ImportError` turns it into a
  silent fallback). The tests check the server's log never shows it.
- `import sgl_kernel.<submodule>` raises `StandInKernelMissing`, except for the submodules in
  `ABSENT_MODULES`, which SGLang probes at import time with a fallback the tiny model never reaches:
  those get ModuleNotFoundError, as from an sgl_kernel build without them.

A model that needs a real op fails with the op's name; its stand-in would go here, registered with
`torch.library` under the `sgl_kernel` namespace.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

__version__ = "0.0.0+stand-in"

# Submodules SGLang probes for at import time inside `try: … except ImportError:` with a fallback that
# the tiny model never reaches. For these (and only these) the stand-in behaves like an sgl_kernel build
# without the module: ModuleNotFoundError. Each entry says why that is safe.
ABSENT_MODULES: dict[str, str] = {
    "sgl_kernel.scalar_type": "quantized weight types (sglang.srt.layers.quantization.utils); "
    "the tiny model is unquantized bf16",
    "sgl_kernel.allreduce": "GPU custom all-reduce (device_communicators/custom_all_reduce_ops); "
    "one CPU process, tensor parallel size 1",
}


class StandInKernelMissing(RuntimeError):
    """SGLang asked for an sgl_kernel op or module that has no PyTorch stand-in here."""


def _missing(name: str) -> StandInKernelMissing:
    return StandInKernelMissing(
        f"sgl_kernel op {name} has no PyTorch stand-in (tests/real_engines/sgl_kernel_cpu); "
        "the tiny test model was not expected to need it"
    )


class MissingOp:
    """What `from sgl_kernel import X` gives for an op without a stand-in: importing it works (SGLang
    imports many ops at module load on the CPU path and never calls most of them); calling it raises
    StandInKernelMissing."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        raise _missing(self.name)

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in: {self.name} is missing>"


def __getattr__(name: str) -> MissingOp:
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)  # the import system's probes (__path__, __file__, …)
    return MissingOp(name)


class _NoSubmodules(importlib.abc.MetaPathFinder):
    """`import sgl_kernel.flash_attn` (or any submodule) raises StandInKernelMissing."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in ABSENT_MODULES:
            raise ModuleNotFoundError(f"No module named {fullname!r} (stand-in)", name=fullname)
        if fullname.startswith(__name__ + "."):
            raise _missing(fullname)
        return None


sys.meta_path.insert(0, _NoSubmodules())
