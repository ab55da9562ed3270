"""Pure policies: routing, admission, budgets (no I/O, no clocks; the gateway calls them).

Compiled or not. `scripts/build_policies.py` (run by `make native`, `make test`, `make demo`, `make bench`)
compiles every module here with mypyc into `policies/_native/` and records the digest of the sources
it compiled. When that digest matches the sources beside this file, imports of `policies.*` take the
compiled modules (the same code, about twice as fast: bench/BENCHMARKS.md, *the decision's CPU*);
when it does not (a source edited since the build, no build at all), they take the sources, so an
edit is never shadowed by a stale build. `GATEWAY_POLICIES` decides otherwise: `python` always takes
the sources, `native` requires the compiled modules and fails the import when they are missing or
stale (`make test` sets it, so the suite runs what the gateway runs). docs/architecture.md.

Write for the compiler: call a dict's or list's methods on the typed value (`d.get(k)`, never a
bound method kept in a local), loop over indexes rather than `zip`/`map`, and build the routing
path's named tuples with their builders (`policies.types.backend_choice`, `decision`,
`policies.pools.pool_choice`): a named tuple's `__new__` stays interpreted.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

#: where `scripts/build_policies.py` puts the compiled modules (git-ignored)
NATIVE_DIR = Path(__file__).resolve().with_name("_native")
#: the digest of the sources the compiled modules were built from
NATIVE_STAMP = NATIVE_DIR / "SOURCES"


def source_digest() -> str:
    """SHA-256 over this package's module sources (names and bytes, `__init__` excepted) and the
    Python version: what a compiled build must have been built from to be used."""
    digest = hashlib.sha256(sys.implementation.cache_tag.encode())
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        if path.name != "__init__.py":
            digest.update(b"\0" + path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def native_built() -> bool:
    try:
        return NATIVE_STAMP.read_text().strip() == source_digest()
    except OSError:
        return False


def _use_native() -> bool:
    mode = os.environ.get("GATEWAY_POLICIES", "")
    if mode == "python":
        return False
    built = native_built()
    if mode == "native" and not built:
        raise ImportError(
            "GATEWAY_POLICIES=native but policies/_native/ is missing or older than the sources: "
            "run `make native` (scripts/build_policies.py)"
        )
    if mode not in ("", "native"):
        raise ImportError(f"GATEWAY_POLICIES must be 'native', 'python' or unset, not {mode!r}")
    return built


#: whether `policies.*` are the compiled modules in this process
NATIVE = _use_native()
if NATIVE:
    # the compiled modules' shared runtime (`policies_native__mypyc`) is a top-level module
    sys.path.append(str(NATIVE_DIR))
    __path__.insert(0, str(NATIVE_DIR / "policies"))
