"""Passes engine command lines through the engine's own argument parsing, as its server does before it
loads anything, and starts nothing. Run with an engine environment's python
(tests/real_engines/test_deploy_flags.py):

    <engine env>/bin/python tests/real_engines/parse_flags.py vllm|sglang < argvs.json

stdin: a JSON object, label -> the flags after the launcher (`vllm serve`, `python3 -m
sglang.launch_server`). stdout, one JSON line: `{"version": ..., "results": {label: {"ok": bool,
"error": str}}}`.

- vLLM: `vllm serve`'s parser (`make_arg_parser`: unknown flags, types, the JSON of `--kv-events-config`
  checked against `KVEventsConfig`), its checks before loading (`validate_parsed_serve_args`), its API
  server's check of the tool-call parser (`validate_api_server_args`) and the reasoning parser's name
  in the registry that check reads later (`ReasoningParserManager`).
- SGLang: `sglang serve`'s parser as `prepare_server_args` builds it (`ServerArgs.add_cli_args`), whose
  choices hold the parser and schedule-policy names.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections.abc import Callable


def vllm_checker() -> tuple[str, Callable[[list[str]], None]]:
    import vllm
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.launchers.launcher import validate_api_server_args
    from vllm.reasoning import ReasoningParserManager
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))

    def check(flags: list[str]) -> None:
        args = parser.parse_args(flags)
        validate_parsed_serve_args(args)
        validate_api_server_args(args)
        known = ReasoningParserManager.list_registered()
        if args.reasoning_parser and args.reasoning_parser not in known:
            raise KeyError(f"invalid reasoning parser: {args.reasoning_parser} (choose from {known})")

    return str(vllm.__version__), check


def sglang_checker() -> tuple[str, Callable[[list[str]], None]]:
    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)

    def check(flags: list[str]) -> None:
        parser.parse_args(flags)

    return str(sglang.__version__), check


CHECKERS = {"vllm": vllm_checker, "sglang": sglang_checker}


def verdict(check: Callable[[list[str]], None], flags: list[str]) -> dict[str, object]:
    said = io.StringIO()  # argparse prints its refusal, then exits
    try:
        with contextlib.redirect_stderr(said):
            check(flags)
    except SystemExit as exc:
        lines = said.getvalue().strip().splitlines()
        return {"ok": False, "error": lines[-1] if lines else f"exit {exc.code}"}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "error": ""}


def main() -> None:
    version, check = CHECKERS[sys.argv[1]]()
    argvs: dict[str, list[str]] = json.load(sys.stdin)
    results = {label: verdict(check, flags) for label, flags in argvs.items()}
    print(json.dumps({"version": version, "results": results}))


if __name__ == "__main__":
    main()
