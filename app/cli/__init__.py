"""The `opscope` command line. One module per command group under app/cli/; each has
`register(subparsers)` and sets `func(args) -> int` on its parsers."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from opscope.runtime.errors import OpscopeError

# command modules, in the order `opscope --help` lists them
COMMANDS = ["run", "train", "backends", "backend", "ops", "profile", "runs", "trace", "serve", "debug", "diff", "advise", "tune", "migrate"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("opscope")
    except PackageNotFoundError:
        return "0+unknown"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, as DESIGN.md asks
        self.exit(2, f"opscope: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="opscope", description="Run, profile, debug and port models on any registered backend.")
    parser.add_argument("--version", action="version", version=f"opscope {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"opscope.app.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"opscope.app.cli.{name}":
                continue   # that command group is not built yet
            raise
        module.register(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = args.func(args)
    except OpscopeError as e:
        print(f"opscope: error: {e}", file=sys.stderr)
        code = e.exit_code
    except KeyboardInterrupt:
        print("opscope: interrupted", file=sys.stderr)
        code = 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code or 0)
