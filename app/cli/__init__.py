"""The `opscope` command line. One module per command group under app/cli/; each has
`register(subparsers)` and sets `func(args) -> int` on its parsers.

main() is the one place that turns what escapes a command into an exit code and one line:
OpscopeError -> its exit code; Ctrl-C -> 130; a closed pipe (`| head`) -> 0; anything else -> 1 with
the user's own file:line when the model raised. OPSCOPE_DEBUG=1 shows the traceback instead.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

from opscope.runtime.errors import OpscopeError, first_line, terminal_text

DEBUG_ENV = "OPSCOPE_DEBUG"

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
    "sql": ("sql", "a read-only SQL query over one run's tables (events, stacks, memory, ...)"),
    "costmodel": ("costmodel", "train the learned cost model on the run store; check it on unseen models"),
    "tune": ("tune", "search a backend's knobs (threads, dtype, batch chunking) and cache the best"),
    "migrate": ("migrate", "find CUDA-specific code, rewrite it, predict how a model runs elsewhere"),
    "compile": ("compile", "optimize and place a model once, save the execution plan (.opsplan)"),
    "optimize": ("optimize", "profile, apply the best advice, measure, repeat; keeps what helped"),
    "simulate": ("simulate", "predict step time, memory per rank and scaling of dp, ZeRO, tp, pp from measured op costs"),
    "monitor": ("monitor", "watch devices (and a live run) against alert rules"),
    "torchrun": ("torchrun", "torchrun with opscope's exit codes: a rank's bad input exits 2, any failure is one line"),
}

# command -> the examples its --help ends with (a command's own epilog wins). Every command named
# here must parse: tests/test_cli_messages.py checks them with this parser.
EXAMPLES = {
    "run": ["opscope run demo:gpt --backend sim:npu-a1", "opscope run model.py:factory --backend numpy --json",
            "opscope run demo:mlp --hybrid torch:cpu=0.5,sim:npu-a1=0.5"],
    "train": ["opscope train demo:mlp --backend numpy --steps 5", "opscope train demo:gpt --optimizer adamw --json"],
    "backends": ["opscope backends", "opscope backends --json"],
    "backend": ["opscope backend check numpy", "opscope backend check sim:npu-a1 --ops linear,gelu"],
    "ops": ["opscope ops", "opscope ops --backend sim:npu-a1", "opscope ops --json"],
    "profile": ["opscope profile demo:gpt --backend torch:cpu --steps 3 --warmup 1",
                "opscope profile demo:mlp --backend sim:npu-a1 --web", "opscope profile demo:gpt --values --json"],
    "runs": ["opscope runs", "opscope runs --json"],
    "show": ["opscope show RUN --by module", "opscope show RUN --step 0 --top 10"],
    "compare": ["opscope compare RUN_A RUN_B", "opscope compare RUN_A RUN_B --json"],
    "trace": ["opscope trace export RUN -o run.json", "opscope trace import trace.json"],
    "serve": ["opscope serve", "opscope serve --port 8060 --open"],
    "debug": ["opscope debug demo:gpt --backend sim:npu-a1", "opscope debug demo:mlp --reference numpy --break-on-nan"],
    "diff": ["opscope diff demo:gpt --backend sim:npu-a1 --reference numpy"],
    "advise": ["opscope advise RUN", "opscope advise RUN --apply 1"],
    "sql": ["opscope sql RUN \"SELECT op, count(*), sum(end_ns - start_ns) FROM events GROUP BY op ORDER BY 3 DESC\"",
            "opscope sql RUN \"SELECT * FROM events LIMIT 5\" --json"],
    "costmodel": ["opscope costmodel fit", "opscope costmodel check --json"],
    "costmodel fit": ["opscope costmodel fit", "opscope costmodel fit -o model.json --json"],
    "costmodel check": ["opscope costmodel check", "opscope costmodel check --trees 300 --json"],
    "tune": ["opscope tune demo:gpt --backend torch:cpu", "opscope tune demo:mlp --backend numpy --budget 4 --json"],
    "torchrun": ["opscope torchrun --standalone --nproc-per-node 2 -m opscope.app train demo:gpt "
                 "--hybrid torch:cpu=0.5,torch:cpu=0.5"],
    "migrate": ["opscope migrate scan path/to/project", "opscope migrate apply path/to/project --diff",
                "opscope migrate check model.py:factory --backend sim:npu-a1"],
    "compile": ["opscope compile demo:gpt -b sim:npu-a1 -o gpt.opsplan",
                "opscope compile demo:gpt -b sim:npu-a1 --passes all -o gpt.opsplan --sign plan-key",
                "opscope run demo:gpt --plan gpt.opsplan"],
    "optimize": ["opscope optimize demo:gpt -b sim:npu-a1 --cycles 3",
                 "opscope optimize demo:mlp -b numpy --suite models.txt --json"],
    "simulate": ["opscope simulate demo:gpt --hybrid torch:cpu=0.5,sim:npu-a1=0.5 --ranks 1024",
                 "opscope simulate demo:gpt --ranks 8 --strategy search", "opscope simulate --measure-link"],
    "monitor": ["opscope monitor --run RUN --rules alerts.toml", "opscope monitor --metrics-port 9464 --webhook URL",
                "opscope monitor --export-rules prometheus"],
    # a command's verbs: "COMMAND VERB"
    "backend check": ["opscope backend check numpy", "opscope backend check sim:npu-a1 --ops linear,gelu --json",
                      "opscope backend check onnxruntime --opinfo --opinfos add,nn.functional.gelu"],
    "trace export": ["opscope trace export RUN -o run.json",
                     "opscope trace export RUN --format perfetto -o run.pftrace",
                     "opscope trace export RUN --format csv --by op -o ops.csv"],
    "trace import": ["opscope trace import trace.json", "opscope trace import traces/",
                     "opscope trace import onnxruntime_profile.json --json"],
    "migrate scan": ["opscope migrate scan path/to/project", "opscope migrate scan train.py --json",
                     "opscope migrate scan path/to/project --html -o report.html"],
    "migrate apply": ["opscope migrate apply path/to/project --diff", "opscope migrate apply path/to/project --write"],
    "migrate run": ["opscope migrate run --device cpu -- python train.py"],
    "migrate check": ["opscope migrate check model.py:factory --backend sim:npu-a1",
                      "opscope migrate check demo:gpt -b sim:npu-a1 -b numpy --train"],
}
HOME_NOTE = "Runs are stored under $OPSCOPE_HOME (default ~/.opscope); OPSCOPE_DEBUG=1 shows tracebacks."


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("opscope")
    except PackageNotFoundError:
        return "0+unknown"


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Examples keep their lines; every option that has a default says it, unless its help already does."""

    def _get_help_string(self, action):
        text = action.help or ""
        d = action.default
        if (action.option_strings and text and "default" not in text.lower() and "%(default)" not in text
                and not any(d is x for x in (None, False, True, argparse.SUPPRESS)) and d not in ([], "")):
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        self._words = list(sys.argv[1:] if args is None else args)      # error() finds the command in them
        return super().parse_known_args(args, namespace)

    def error(self, message):  # one line, exit 2, as DESIGN.md asks, pointing at the command's own --help
        parser = self._command_parser()
        self.exit(2, f"opscope: error: {message}{parser._did_you_mean(message)} (see `{parser.prog} --help`)\n")

    def _command_parser(self) -> "argparse.ArgumentParser":
        """The (sub)parser of the command the words name: argparse reports a misspelled flag from the top
        parser, whose help does not list the command's flags (`opscope run --backedn` -> `opscope run --help`)."""
        parser = self
        for word in getattr(self, "_words", ()):
            if word == "--":
                break
            subs = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
            if subs is not None and word in subs.choices:
                parser = subs.choices[word]
        return parser

    def _did_you_mean(self, message: str) -> str:
        """' (did you mean --backend?)' for a misspelled flag, command or choice (argparse in Python 3.11
        has no suggestions of its own)."""
        import difflib
        import re
        if message.startswith("unrecognized arguments:"):
            flags = [w.split("=", 1)[0] for w in message.split(":", 1)[1].split() if w.startswith("-")]
            known = list(self._option_string_actions)
        else:
            m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
            flags, known = ([m.group(1)], re.findall(r"'([^']*)'", m.group(2))) if m else ([], [])
        for flag in flags:
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
            if close:
                return f" (did you mean {close[0]}?)"
        return ""


def _epilog(name: str) -> str:
    lines = [f"  {e}" for e in EXAMPLES.get(name, [])]
    return ("examples:\n" + "\n".join(lines) + "\n\n" if lines else "") + HOME_NOTE


def _add_epilogs(parser: argparse.ArgumentParser, name: str) -> None:
    """EXAMPLES for `parser` (the command `name`) and for each of its verbs ("trace export"), where the
    module gave none of its own."""
    if not parser.epilog:
        parser.epilog = _epilog(name)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for verb, child in action.choices.items():
                _add_epilogs(child, f"{name} {verb}")


def build_parser(argv=None) -> argparse.ArgumentParser:
    """The whole parser for the command named in `argv`; the others get a placeholder with their help line."""
    parser = _Parser(prog="opscope", description="Run, profile, debug and port models on any registered backend.",
                     epilog="examples:\n  opscope run demo:gpt --backend sim:npu-a1\n  opscope profile demo:gpt "
                            "--backend torch:cpu\n  opscope serve\n\nModels: demo:mlp, demo:cnn, demo:gpt or "
                            "path/to/file.py:factory. Backends: numpy, torch:cpu, torch:cuda:0, sim:NAME or a .toml "
                            "description. " + HOME_NOTE + " `opscope COMMAND --help` for each command.")
    parser.add_argument("--version", action="version", version=f"opscope {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)
    registered = set()
    for name, (module_name, summary) in COMMANDS.items():
        if name in registered or importlib.util.find_spec(f"opscope.app.cli.{module_name}") is None:
            continue                            # a command whose module has not landed yet is not offered
        if name == chosen or COMMANDS.get(chosen, (None,))[0] == module_name:
            module = importlib.import_module(f"opscope.app.cli.{module_name}")
            module.register(sub)
            names = {n for n, (m, _) in COMMANDS.items() if m == module_name}
            registered |= names
            for n in names & set(sub.choices):
                _add_epilogs(sub.choices[n], n)
        else:
            sub.add_parser(name, help=summary)
    return parser


# commands that never need torch; every other one imports it, so it is imported first, whole (below)
# (torchrun imports it itself, after its --help)
_NO_TORCH = {"migrate", "runs", "show", "compare", "trace", "serve", "ops", "backends", "advise", "monitor", "torchrun",
             "sql"}


def _import_torch_uninterrupted() -> None:
    """Import torch with Ctrl-C held until the import is done, then act on it.

    NOTE: a KeyboardInterrupt raised inside one of torch's pybind11 module initialisers cannot unwind
    through C++: it aborted with "terminate called after throwing an instance of
    'pybind11::error_already_set'" (exit -6) when Ctrl-C came in the first second of `opscope profile`."""
    import signal
    if "torch" in sys.modules or threading_main() is False:
        return
    pressed = []
    try:
        old = signal.signal(signal.SIGINT, lambda *_: pressed.append(True))
    except ValueError:
        return
    try:
        import torch  # noqa: F401
    finally:
        signal.signal(signal.SIGINT, old)
    if pressed:
        raise KeyboardInterrupt


def threading_main() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def main(argv=None) -> int:
    """The console script. Never returns: exits with the command's code."""
    debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        if argv is None:
            sys.unraisablehook = _redeliver_interrupt(sys.unraisablehook)
            _take_over_ctrl_c()
        code = _run(argv, debug)
        if argv is None:                     # the process's own entry point, not a test calling main()
            _no_more_interrupts()
    except KeyboardInterrupt:                # while an error line was printed: still one line and 130
        _interrupted()
    if code == 130:
        _interrupted(announce=False)         # the command said it was interrupted; end the same way
    sys.exit(code)


def _take_over_ctrl_c() -> None:
    """From here Ctrl-C is a KeyboardInterrupt again (app/entry.py answered it while the CLI was imported)."""
    import signal

    from opscope.app import entry
    if threading_main() and signal.getsignal(signal.SIGINT) is entry._interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _redeliver_interrupt(default):
    """An unraisablehook: a Ctrl-C that lands while Python runs a __del__ or a weakref callback is raised
    there and swallowed ("Exception ignored in: ... KeyboardInterrupt" and a traceback), and the command
    runs on as if nobody had pressed it (seen in CI: `opscope run` interrupted after 2.8 s of 35 exited 0).
    This sends the signal again a moment later, from a thread: raised here, in the hook, it would be
    swallowed once more. Should it land in another finalizer, the hook runs again and so does this."""
    import signal
    import threading

    def hook(unraisable):
        if unraisable.exc_type is KeyboardInterrupt:
            threading.Timer(0.05, signal.raise_signal, (signal.SIGINT,)).start()
            return
        default(unraisable)
    return hook


def _no_more_interrupts() -> None:
    """The command is done and its exit code decided: a Ctrl-C now could only interrupt the interpreter's
    shutdown, which prints "Exception ignored in: ... KeyboardInterrupt" with a traceback."""
    import signal
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:                       # not the main thread
        pass


def _run(argv, debug: bool) -> int:
    """Parse and run the command -> its exit code; every error is one line on stderr."""
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            code = 2
        else:
            if getattr(args, "precheck", None):
                args.precheck(args)          # the values' files and names, before torch (app/cli/common.py)
            words = sys.argv[1:] if argv is None else list(argv)
            # NOTE: not args.command: `profile -- python x.py` keeps its own `command` (the script's argv)
            if next((w for w in words if not w.startswith("-")), None) not in _NO_TORCH:
                _import_torch_uninterrupted()
            code = args.func(args) or 0
        sys.stdout.flush()                   # a closed pipe shows here, inside the try, not at exit
    except SystemExit as e:                  # argparse: --help, --version, usage errors
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        _flush_or_quiet()
    except KeyboardInterrupt:
        _interrupted()
    except BrokenPipeError:
        _quiet_stdout()                      # `opscope runs | head`: the reader had enough; that is success
        code = 0
    except OpscopeError as e:
        if debug:
            raise
        # messages quote files, traces and ranks: one line, no raw control character (terminal_text)
        print(f"opscope: error: {terminal_text(e)}{_where(e)}", file=sys.stderr)
        code = e.exit_code
    except Exception as e:                   # a bug, a model's own exception, a library's: one line, no traceback
        if debug:
            raise
        print(f"opscope: error: {type(e).__name__}: {terminal_text(first_line(e))}{_where(e)} "
              f"(OPSCOPE_DEBUG=1 shows the traceback)", file=sys.stderr)
        code = 1
    return code


def _flush_or_quiet() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's own flush at exit does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _where(e: BaseException) -> str:
    """' (at file.py:12: code)': the innermost frame of the user's own code, when the message lacks it.

    torch.export and opscope wrap a model's exception (`raise ModelError(...) from e`); the frame the
    user wants is deep in the chain, under torch's internals. Only looked for when torch is loaded:
    without it no model ran (and the debugger's frame filter imports torch)."""
    if "torch" not in sys.modules or " (at " in str(e) or getattr(e, "exit_code", 1) == 2:
        return ""
    try:
        f = user_frame(e)
    except Exception:                        # finding the frame must never hide the error itself
        return ""
    return f" (at {f.filename}:{f.lineno}: {(f.line or '').strip()})" if f is not None else ""


def user_frame(e: BaseException):
    """The innermost traceback frame, over `e` and what caused it, that is neither torch's, opscope's,
    the standard library's nor an installed package's: the model file's own line."""
    import sysconfig
    import traceback

    from opscope.debugger.pystack import internal
    libs = tuple(os.path.realpath(p) + os.sep for p in {sysconfig.get_paths()[k] for k in ("stdlib", "purelib",
                                                                                      "platlib")})
    best, seen = None, set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for fs in traceback.extract_tb(e.__traceback__):
            if not internal(fs.filename) and not os.path.realpath(fs.filename).startswith(libs):
                best = fs                    # later frames are deeper
        e = e.__cause__ or e.__context__
    return best


def _interrupted(announce: bool = True) -> None:
    """Ctrl-C: keep what was recorded, say so in one line, exit 130 -- without interpreter shutdown.

    NOTE: a plain sys.exit here aborted 3 times in 5 (exit 134, "terminate called after throwing an
    instance of ''" / "FATAL: exception not rethrown"). At shutdown CPython ends every daemon thread
    that wakes up wanting the GIL with pthread_exit(), a forced unwind; a thread then inside C++ (the
    collector in DuckDB, torch's pool via pybind11) that catches it with catch(...) and does not
    rethrow makes the C++ runtime call terminate(). So: let the runs close, flush, and os._exit.
    """
    import signal
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # a second Ctrl-C must not break the cleanup
    except ValueError:                                    # not the main thread (tests calling main())
        pass
    kept = _close_live_runs()
    if announce:
        where = "; kept " + ", ".join(f"run {r} (`opscope show {r}`)" for r in kept) if kept else ""
        try:
            sys.stderr.write(f"opscope: interrupted{where}\n")
        except OSError:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(130)


def _close_live_runs(timeout: float = 60.0) -> list[str]:
    """Stop the runner processes this command started and wait until each run is closed in the store
    (profiler/live.py: every LiveRun has a watcher thread named `opscope-run-<id>` that finishes the
    run, events kept, once its runner is gone). Returns the ids of the runs that were closed.
    NOTE: closing takes well under a second; the bound is for a store that hangs (the 15 s it was could
    run out on a machine loaded 25 deep on 2 cores)."""
    import threading
    import time
    watchers = [t for t in threading.enumerate() if t.name.startswith("opscope-run-") and t.is_alive()]
    if not watchers:
        return []
    live = sys.modules.get("opscope.profiler.live")
    if live is not None:                # stored as interrupted (the user's Ctrl-C), not failed by SIGKILL
        live.interrupt_all()
    try:
        import psutil
        for child in psutil.Process().children():
            try:
                if "opscope.profiler.runner" in " ".join(child.cmdline()):
                    child.kill()      # SIGINT reached it too from a terminal; a lone `kill -INT` did not
            except psutil.Error:
                pass
    except ImportError:
        pass
    deadline = time.monotonic() + timeout
    for t in watchers:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t.name[len("opscope-run-"):] for t in watchers if not t.is_alive()]
