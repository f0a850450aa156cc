"""The `opscope` command line. One module per command group under app/cli/; each has
`register(subparsers)` and sets `func(args) -> int` on its parsers."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

from opscope.runtime.errors import OpscopeError

# command -> (module under app/cli, one line for `opscope --help`), in the order --help lists them.
# NOTE: only the module of the command being run is imported, so `opscope migrate scan` and every
# --help stay free of torch; the lines here must match the modules' own help.
COMMANDS = {
    "run": ("run", "run a model on a backend and compare with eager PyTorch"),
    "train": ("train", "train a model for N steps on a backend and compare with eager PyTorch"),
    "backends": ("backends", "list registered backends and whether they are available"),
    "backend": ("backend", "work with one backend (conformance check)"),
    "ops": ("ops", "list opscope's ops and which backend runs which"),
    "profile": ("profile", "profile a model op by op into a run (see `opscope runs`)"),
    "runs": ("runs", "list profiled runs, newest first"),
    "show": ("runs", "per-op table of one run"),
    "compare": ("runs", "two runs op by op (matched by node), e.g. one model on two backends"),
    "trace": ("trace", "export a run as a Chrome/Perfetto trace or CSV; import torch.profiler / ONNX Runtime traces"),
    "serve": ("serve", "open the web analyzer over every run in the store"),
    "debug": ("debug", "step through a model op by op in a terminal UI"),
    "diff": ("diff", "every op's output against a reference backend (accuracy report)"),
    "advise": ("advise", "recommendations for a run, ranked by estimated gain; --apply measures one"),
    "tune": ("tune", "search a backend's knobs (threads, dtype, batch chunking) and cache the best"),
    "migrate": ("migrate", "find CUDA-specific code, rewrite it, predict how a model runs elsewhere"),
    "compile": ("compile", "optimize and place a model once, save the execution plan (.opsplan)"),
    "optimize": ("optimize", "profile, apply the best advice, measure, repeat; keeps what helped"),
    "simulate": ("simulate", "predict data-parallel step time and scaling at N ranks from measured op costs"),
    "monitor": ("monitor", "watch devices (and a live run) against alert rules"),
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("opscope")
    except PackageNotFoundError:
        return "0+unknown"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, as DESIGN.md asks
        self.exit(2, f"opscope: error: {message} (see `{self.prog} --help`)\n")


def build_parser(argv=None) -> argparse.ArgumentParser:
    """The whole parser for the command named in `argv`; the others get a placeholder with their help line."""
    parser = _Parser(prog="opscope", description="Run, profile, debug and port models on any registered backend.",
                     epilog="Models: demo:mlp, demo:cnn, demo:gpt or path/to/file.py:factory. Backends: numpy, "
                            "torch:cpu, torch:cuda:0, sim:NAME or a .toml description. Runs are stored under "
                            "$OPSCOPE_HOME (default ~/.opscope). `opscope COMMAND --help` for each command.")
    parser.add_argument("--version", action="version", version=f"opscope {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)
    registered = set()
    for name, (module_name, summary) in COMMANDS.items():
        if name in registered:
            continue
        if name == chosen or COMMANDS.get(chosen, (None,))[0] == module_name:
            module = importlib.import_module(f"opscope.app.cli.{module_name}")
            module.register(sub)
            registered |= {n for n, (m, _) in COMMANDS.items() if m == module_name}
        elif importlib.util.find_spec(f"opscope.app.cli.{module_name}") is not None:
            sub.add_parser(name, help=summary)
    return parser


def main(argv=None) -> int:
    parser = build_parser(argv)
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
