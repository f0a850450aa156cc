"""`python -m opscope.runtime.dist MODEL --hybrid A=0.7,B=0.3 [--steps N] [--json]`: hybrid
data-parallel training (what `opscope train --hybrid` runs); works under torchrun as is:

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m opscope.runtime.dist demo:gpt \\
        --hybrid torch:cpu=0.7,sim:npu-a1=0.3
"""
from __future__ import annotations

import argparse
import sys

from ..errors import OpscopeError, terminal_text
from .cli_support import add_hybrid_arguments, train_hybrid


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"opscope: error: {message}\n")


def main(argv=None) -> int:
    p = _Parser(prog="python -m opscope.runtime.dist", description=__doc__.splitlines()[0])
    p.add_argument("model")
    add_hybrid_arguments(p)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not args.hybrid:
        p.error("--hybrid is required")
    try:
        return train_hybrid(args)
    except OpscopeError as e:
        print(f"opscope: error: {terminal_text(e)}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
