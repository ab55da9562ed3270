"""`python -m engines.sim --engine vllm|sglang --port N ...`: run one engine simulator."""

from __future__ import annotations

import argparse

from engines.sim.cli import add_arguments, main

if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m engines.sim", description="vLLM / SGLang engine simulator"
    )
    add_arguments(parser)
    main(parser.parse_args())
