"""`opscope torchrun ARGS`: torchrun itself (torch.distributed.run, the same arguments, in this process), with
opscope's exit codes and one line per failure instead of torchrun's error dump.

Plain torchrun exits 1 whatever its ranks exit with and prints a ChildFailedError summary (about 50 lines) after
the ranks' own messages. Under this command a job whose first failing rank exited 2 (bad input, e.g. a process
count the `--hybrid` shares disagree on: that rank has already said why, once) exits 2 with nothing added; any
other failure is one line naming the rank, its exit code or signal and its recorded error, and exits 1. A
launcher argument torchrun rejects is one line and exit 2. Everything else -- rendezvous, elastic restarts,
`--nnodes MIN:MAX`, OMP_NUM_THREADS per rank -- is torchrun's own.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from opscope.runtime.errors import UsageError, first_line, terminal_text

HELP = "torchrun with opscope's exit codes: a rank's bad input exits 2, any failure is one line"


def register(sub) -> None:
    # NOTE: "+" as the only prefix: every word after `torchrun` (--nproc-per-node, the script, its flags) is
    # torchrun's, so opscope's parser must not read any of them as its own options
    p = sub.add_parser("torchrun", help=HELP, prefix_chars="+", add_help=False,
                       description=__doc__.split("\n\n")[0] + "\n\nEvery torchrun option works here as there "
                       "(`torchrun --help` lists them).")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="torchrun's arguments, unchanged")
    p.set_defaults(func=main, parser=p)


def main(args) -> int:
    if args.argv[:1] in (["-h"], ["--help"]):     # opscope's help, without importing torch
        args.parser.print_help()
        return 0
    from . import _import_torch_uninterrupted
    _import_torch_uninterrupted()
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    parser = get_args_parser()
    parser.prog = "opscope torchrun"

    def refuse(message):                   # argparse's usage block plus error -> one line
        raise UsageError(f"torchrun: {message} (see `opscope torchrun --help`)")
    parser.error = refuse
    launch = parser.parse_args(args.argv)
    script = Path(launch.training_script)
    if not (launch.module or launch.no_python) and not script.is_file():   # else every rank says so, then exits 2
        raise UsageError(f"torchrun: no script {script} (give a Python file, or -m MODULE)")
    # the agent logs each failed worker, then the error dump: the ranks said why, the one line below says who
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        run(launch)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        if failure.exitcode == 2:           # the rank's own one line (bad input) was already printed
            return 2
        print(terminal_text(f"opscope: error: {_failure_line(e.name, rank, failure)}"), file=sys.stderr,
              flush=True)
        return 1
    except (ValueError, AssertionError) as e:
        # torchrun checks most launcher values only when it builds its config or rendezvous, after argparse
        # (--nproc-per-node abc, --nnodes 3:1, an unknown --rdzv-backend); a rank's own errors never reach here
        raise UsageError(f"torchrun: {first_line(e)} (see `opscope torchrun --help`)") from None
    return 0


def _failure_line(entry: str, rank: int, failure) -> str:
    """"rank 1 (local rank 1, pid 123) of train.py died (SIGKILL): <its error>" and how many others failed."""
    how = (f"died ({failure.signal_name()})" if failure.exitcode < 0 else f"exited with code {failure.exitcode}")
    text = f"rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) of {entry} {how}"
    message = failure.message if isinstance(failure.message, str) else ""
    # torchrun's placeholders: nothing recorded, or the signal said again
    if message and "To enable traceback see" not in message and not message.startswith("Signal "):
        text += f": {first_line(message)[:300]}"
    return text
