#!/usr/bin/env python3
"""Compiles `policies/` with mypyc into `policies/_native/` (git-ignored): `make native`.

    .venv/bin/python scripts/build_policies.py [--force] [--installed]

Every module of `policies/` but `__init__` is compiled (the routing decision, the features, the
KV-event index, admission and budget rules: they are typed for `mypy --strict`, which is what mypyc
needs). The build is written beside the sources with the digest of what it compiled
(`policies.source_digest`); `policies/__init__.py` uses it only while the digest still matches, so
a warm re-run is a no-op and an edited source is never shadowed by an old build. Needs gcc and the
Python headers (the machine has both; `apt-get install gcc python3-dev` elsewhere). It prints one
line; mypyc's, setuptools' and the C compiler's output is kept out of sight unless the build fails,
which shows it, exits non-zero and leaves no stamp.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUP = "policies_native"  # the compiled modules' shared runtime: `policies_native__mypyc`


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/build_policies.py", description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="build even when the build is up to date")
    ap.add_argument(
        "--installed",
        action="store_true",
        help="compile the installed `policies` (the one `import policies` finds without the checkout on"
        " the path: the Docker image's venv) instead of the checkout's",
    )
    args = ap.parse_args(argv)
    os.environ["GATEWAY_POLICIES"] = "python"  # (importing `policies` must not load an old build)
    if not args.installed:
        sys.path.insert(0, str(ROOT))
    import policies

    base = Path(policies.__file__).resolve().parents[1]  # the directory that holds the package

    digest = policies.source_digest()
    if not args.force and policies.native_built():
        print(f"policies/_native: up to date ({digest[:12]})")
        return 0
    sources = sorted(
        str(p.relative_to(base)) for p in (base / "policies").glob("*.py") if p.name != "__init__.py"
    )
    print(
        f"policies/_native: compiling {len(sources)} modules with mypyc (about a minute) ...",
        end="",
        flush=True,
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="build-policies-") as tmp:
        work = Path(tmp)
        root = base  # where the package is compiled from
        if args.installed:
            # a copy of the package, compiled where mypy sees nothing else: in site-packages it would
            # take every other top-level module beside it for the project's own (and refuse some)
            shutil.copytree(
                base / "policies",
                work / "src" / "policies",
                ignore=shutil.ignore_patterns("_native*", "__pycache__"),
            )
            root = work / "src"
        log = work / "build.log"
        try:
            with _output_to(log):
                _compile(sources, work, root)
        except (SystemExit, Exception) as exc:  # setuptools exits on a compiler error
            _failed(log, f"mypyc failed ({exc})")
            return 1
        built = work / "lib"
        staged = policies.NATIVE_DIR.with_name("_native.new")
        shutil.rmtree(staged, ignore_errors=True)
        (staged / "policies").mkdir(parents=True)
        for so in built.glob(f"{GROUP}__mypyc*.so"):
            shutil.copy2(so, staged / so.name)
        modules = list((built / "policies").glob("*.so"))
        if len(modules) != len(sources):
            _failed(log, f"{len(modules)} modules built of {len(sources)}")
            return 1
        for so in modules:
            shutil.copy2(so, staged / "policies" / so.name)
        (staged / "SOURCES").write_text(digest + "\n")
        shutil.rmtree(policies.NATIVE_DIR, ignore_errors=True)
        staged.rename(policies.NATIVE_DIR)
    print(f" done in {time.monotonic() - started:.0f} s ({digest[:12]})")
    return 0


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Everything written to this process's stdout and stderr meanwhile goes to `path` (the C
    compiler's too: it inherits the descriptors)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _failed(log: Path, why: str) -> None:
    """The build's own output, then why it failed."""
    print(" failed", flush=True)
    if log.exists():
        sys.stderr.write(log.read_text(errors="replace"))
    print(f"build_policies: {why}; the sources stay in use", file=sys.stderr)


def _compile(sources: list[str], work: Path, base: Path) -> None:
    """mypyc's C for `sources` (paths relative to `base`, the directory holding `policies/`),
    compiled into `work / "lib"`."""
    from mypyc.build import mypycify
    from setuptools import setup

    cwd = Path.cwd()
    os.chdir(base)  # module names follow the paths: policies/x.py is `policies.x`
    try:
        extensions = mypycify(sources, group_name=GROUP, opt_level="3", target_dir=str(work / "c"))
        setup(
            name="policies-native",
            ext_modules=extensions,
            script_args=[
                "--quiet",
                "build_ext",
                "--build-lib",
                str(work / "lib"),
                "--build-temp",
                str(work / "tmp"),
                "--parallel",
                str(os.cpu_count() or 1),
            ],
        )
    finally:
        os.chdir(cwd)


if __name__ == "__main__":
    sys.exit(main())
