"""The first module the `opscope` command runs (the console script and `python -m opscope.app`).

It answers Ctrl-C before anything else is imported: importing the CLI takes a second or more on a cold,
loaded machine (CI saw a Ctrl-C land at 0.2 s, inside `import argparse`, and Python's default handler printed
a KeyboardInterrupt traceback). Until the CLI's main() takes over, Ctrl-C is one line and exit 130 --
nothing has been stored yet, so there is nothing to keep.
"""
import os
import signal
import sys


def _interrupted_while_starting(signum, frame):
    sys.stderr.write("opscope: interrupted\n")
    sys.stderr.flush()
    os._exit(130)


def main() -> None:
    # only over Python's own handler: a SIGINT our parent set to be ignored (a background job) stays ignored
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_while_starting)
    from opscope.app.cli import main as cli_main
    cli_main()
