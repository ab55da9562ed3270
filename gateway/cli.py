"""The `gateway` command: serve, config check, check, demo, sim, token, --version."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.settings import ConfigError, Settings


def _serve(args: argparse.Namespace) -> None:
    from gateway.server import serve

    os.environ["GATEWAY_CONFIG"] = os.path.abspath(args.config)
    settings = _checked("gateway serve", args.config)
    serve(settings, config_path=os.environ["GATEWAY_CONFIG"])


def _check(args: argparse.Namespace) -> None:
    import asyncio

    from gateway.check import Unreachable, check_config, check_url, failed, table

    if (args.url is None) == (args.config is None):
        sys.exit("gateway check: give --url URL --admin-token TOKEN, or --config FILE")
    if args.url is not None and not args.admin_token:
        sys.exit("gateway check: --url needs --admin-token (a JWT with the admin role)")
    if args.config is not None:
        _checked("gateway check", args.config)
    try:
        if args.url is not None:
            rows = asyncio.run(check_url(args.url, args.admin_token, args.metrics_token))
        else:
            rows = asyncio.run(check_config(args.config))
    except Unreachable as exc:
        print(f"gateway check: {exc}", file=sys.stderr)
        sys.exit(2)
    print(table(rows))
    if failed(rows):
        sys.exit(1)


def _config_check(args: argparse.Namespace) -> None:
    settings = _checked("gateway config check", args.file)
    backends = sum(len(p.backends) for p in settings.pools)
    auth = "on" if settings.auth.active else "OFF (every request anonymous)"
    redis = "Redis" if settings.redis.configured else "this process only (no Redis)"
    print(
        f"{args.file}: ok: {len(settings.models)} model(s), {len(settings.pools)} pool(s), "
        f"{backends} backend(s); authentication {auth}; shared state: {redis}"
    )


def _checked(command: str, path: str) -> Settings:
    """The settings `path` describes, checked as `gateway serve` checks them before starting (the
    process exits with one line per problem otherwise)."""
    from gateway.routing.tokens import tokenizer_problem
    from gateway.settings import ConfigError, load_settings
    from gateway.upstream.credentials import read_keys

    try:
        settings = load_settings(path)
    except ConfigError as exc:
        sys.exit(_config_errors(command, exc))
    # a tokenizer that is not there is a deployment error, said before any worker starts
    problems = [p for m in settings.models if m.tokenizer and (p := tokenizer_problem(m.name, m.tokenizer))]
    problems += read_keys(settings.pools)[1]
    if problems:
        sys.exit(f"{command}: " + "; ".join(problems))
    return settings


def _config_errors(command: str, exc: ConfigError) -> str:
    lines = [str(p) for p in exc.problems]
    if len(lines) == 1:
        return f"{command}: {lines[0]}"
    return f"{command}: the config has {len(lines)} errors:\n  " + "\n  ".join(lines)


def _demo(args: argparse.Namespace) -> None:
    from gateway.demo import run_demo

    run_demo(port=args.port, host=args.host)


def _sim(args: argparse.Namespace) -> None:
    from engines.sim.cli import main

    main(args)


def _token(args: argparse.Namespace) -> None:
    from gateway.admission.tokens import mint_token

    secret = os.environ.get("GATEWAY_JWT_SECRET")
    if not secret:
        sys.exit("gateway token: set GATEWAY_JWT_SECRET to the gateway's HS256 secret")
    roles = list(args.role or [])
    print(mint_token(secret, args.sub, roles=roles, ttl_s=args.ttl, tier=args.tier, tenant=args.tenant))


def build_parser() -> argparse.ArgumentParser:
    from engines.sim.cli import add_arguments as add_sim_arguments

    parser = argparse.ArgumentParser(
        prog="gateway", description="OpenAI-compatible gateway for vLLM and SGLang fleets"
    )
    from gateway.version import version

    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the gateway from a YAML config (env vars override)")
    p.add_argument("--config", required=True, help="YAML config file (docs/configuration.md)")
    p.set_defaults(func=_serve)

    p = sub.add_parser("config", help="check a config file as `serve` would, without starting")
    config = p.add_subparsers(dest="config_command", required=True)
    c = config.add_parser("check", help="one line per problem (file, line, key); exit 1 on any")
    c.add_argument("file", help="YAML config file (docs/configuration.md)")
    c.set_defaults(func=_config_check)

    p = sub.add_parser(
        "check", help="check every pool and backend after a deploy (a table; exit 1 on a failure)"
    )
    p.add_argument("--url", help="a running gateway's base URL")
    p.add_argument("--admin-token", help="a JWT with the admin role (with --url)")
    p.add_argument("--metrics-token", help="the gateway's metrics.bearer_token, when it has one (with --url)")
    p.add_argument("--config", help="start a gateway from this config in this process and check through it")
    p.set_defaults(func=_check)

    p = sub.add_parser("demo", help="two vLLM-dialect and two SGLang-dialect simulators behind a gateway")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--host", default="127.0.0.1")
    p.set_defaults(func=_demo)

    p = sub.add_parser("sim", help="one engine simulator (vLLM or SGLang dialect)")
    add_sim_arguments(p)
    p.set_defaults(func=_sim)

    p = sub.add_parser("token", help="mint a development JWT signed with GATEWAY_JWT_SECRET (HS256)")
    p.add_argument("--sub", required=True, help="the user id")
    p.add_argument("--role", action="append", help="a role, e.g. admin (repeatable)")
    p.add_argument("--ttl", type=int, default=3600, help="lifetime in seconds")
    p.add_argument("--tier", default=None, help="limits tier")
    p.add_argument("--tenant", default=None)
    p.set_defaults(func=_token)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except KeyboardInterrupt:
        # Ctrl-C: uvicorn has already shut down gracefully (and the demo stopped its simulators);
        # it re-raises the interrupt afterwards, which is no reason to print a traceback.
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
