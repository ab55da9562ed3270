"""Why a target is missed: sample a running process with py-spy under load and summarise the stacks.

`profile(pid, seconds, load)` runs `py-spy record --format raw` (collapsed stacks, one line per unique
stack with its sample count) on the process tree while `load()` drives traffic, then `summarise`
turns the stacks into two tables: *self* share by function (where the CPU actually goes, the leaf
frame) and *inclusive* share by function of our own packages (which stage it goes through).
py-spy comes from PyPI into the project venv when missing; a failure to profile is reported, not fatal.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.procs import WORK

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")
OURS = ("gateway/", "engines/", "policies/")
_WRAPPERS = ("(gateway/cli.py)", "(gateway/server.py)")  # process entry frames: 100 % by construction


@dataclass
class Profile:
    name: str
    samples: int = 0
    self_share: list[tuple[str, float]] = field(default_factory=list)
    ours_inclusive: list[tuple[str, float]] = field(default_factory=list)
    error: str = ""
    raw_path: str = ""


def py_spy() -> str | None:
    exe = Path(sys.executable).parent / "py-spy"
    if exe.exists():
        return str(exe)
    found = shutil.which("py-spy")
    if found:
        return found
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "py-spy"], check=False)
    return str(exe) if exe.exists() else None


def _label(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m.group("file")
    for pkg in OURS:
        i = path.find(pkg)
        if i >= 0:
            path = path[i:]
            break
    else:
        path = "/".join(path.rsplit("/", 2)[-2:])
    return f"{m.group('func')} ({path})"


def summarise(name: str, raw: str, top: int = 12) -> Profile:
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_label(f) for f in stack.split(";") if f]
        if not frames:
            continue
        total += n
        self_c[frames[-1]] += n
        for f in set(frames):
            if any(f"({pkg}" in f for pkg in OURS) and not any(w in f for w in _WRAPPERS):
                incl[f] += n
    if not total:
        return Profile(name, error="no samples")
    return Profile(
        name,
        samples=total,
        self_share=[(f, c / total) for f, c in self_c.most_common(top)],
        ours_inclusive=[(f, c / total) for f, c in incl.most_common(top)],
    )


def profile(name: str, pid: int, seconds: float, load: Callable[[], object]) -> Profile:
    """Sample `pid` (and its subprocesses) for `seconds` while `load()` runs in this thread."""
    exe = py_spy()
    if exe is None:
        return Profile(name, error="py-spy is not available")
    out = WORK / "profiles" / f"{name}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [exe, "record", "-p", str(pid), "-d", str(max(1, round(seconds))), "-r", "250", "-f", "raw",
            "-o", str(out), "--subprocesses", "--nonblocking"]  # fmt: skip
    result: dict[str, subprocess.CompletedProcess[str]] = {}

    def spy() -> None:
        result["p"] = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)

    th = threading.Thread(target=spy)
    th.start()
    try:
        load()
    finally:
        th.join()
    if not out.exists():
        p = result.get("p")
        return Profile(name, error=(p.stderr if p else "py-spy did not run")[-300:])
    prof = summarise(name, out.read_text(errors="replace"))
    prof.raw_path = str(out.relative_to(WORK.parent.parent))
    return prof
