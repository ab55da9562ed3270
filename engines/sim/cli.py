"""Command-line entry of one simulator: `python -m engines.sim` and the project's `gateway sim`."""

from __future__ import annotations

import argparse

from engines.sim.config import SimConfig
from engines.sim.config import add_arguments as _add_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare every simulator flag (see docs/simulators.md)."""
    _add_arguments(parser)


def main(args: argparse.Namespace) -> None:
    """Run one simulator with the parsed flags until interrupted."""
    from engines.sim.server import run

    try:
        cfg = SimConfig.from_args(args)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    run(cfg)
