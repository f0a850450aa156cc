"""CPU time of `opscope --help`, of every `opscope COMMAND --help` and of argument-value errors
(`train --optimizer adam`, `profile --steps 0`, `run -b missing.toml`, ...), and whether each imported torch
or DuckDB.

    python benchmarks/bench_cli.py [--repeat 3]

Each measurement is a fresh interpreter (what a user's shell starts); CPU time (user + system of
the child) rather than wall time, so a busy machine does not inflate it. The goals: under 0.3 s of
CPU for --help (issue 17), under 0.5 s for a bad value, which must be refused before torch is
imported (issue 34); `python -c pass` is printed as the floor no command can go below.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys

PROBE = ("import sys; sys.argv = ['opscope', *sys.argv[1:]]\n"
         "from opscope.app.cli import main\n"
         "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
         "sys.stderr.write('TORCH=%s DUCKDB=%s\\n' % ('torch' in sys.modules, 'duckdb' in sys.modules))")


def cpu_of(argv: list[str]) -> tuple[float, bool]:
    """(CPU seconds, whether torch or DuckDB was imported) of one fresh interpreter."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, "TORCH=True" in r.stderr or "DUCKDB=True" in r.stderr


# argument-value errors: each must exit 2 before torch (or DuckDB) is imported (issue 34); one or more per
# subcommand whose values are checked (tests/test_cli_validation.py checks the same in one interpreter)
BAD_VALUES = [["train", "demo:mlp", "--optimizer", "adam"], ["profile", "demo:gpt", "--steps", "0"],
              ["run", "demo:mlp", "-b", "missing.toml"], ["run", "demo:gtp"], ["run", "demo:mlp", "-b", "nmupy"],
              ["profile", "demo:mlp", "--warmup", "-1"], ["run", "demo:mlp", "--backedn", "numpy"],
              ["backend", "check", "sim:npu"], ["optimize", "demo:mlp", "--cycles", "0"],
              ["trace", "export", "RUN", "--format", "perfetto", "-o", "x.json"],
              ["trace", "export", "RUN", "--format", "badfmt"], ["trace", "import", "missing.json"],
              ["profile", "--", "python", "missing.py"], ["profile", "demo:mlp", "--train", "--lr", "-1"],
              ["profile", "demo:mlp", "--web", "--port", "99999"], ["train", "demo:mlp", "--lr", "0"],
              ["train", "demo:mlp", "--hybrid", "nmupy=0.5,numpy=0.5"], ["run", "demo:mlp", "--fallback", "nmupy"],
              ["run", "demo:mlp", "--plan", "missing.opsplan"], ["runs", "--limit", "-1"],
              ["runs", "rm", "--older-than", "soon"], ["show", "RUN", "--top", "-1"], ["compare", "A", "B", "--top", "-1"],
              ["sql", "RUN", "SELECT 1", "--max-rows", "0"], ["sql", "RUN", "SELECT 1", "--timeout", "0"],
              ["monitor", "--interval", "0"], ["monitor", "--metrics-port", "99999"],
              ["simulate", "demo:gpt", "--ranks", "0"], ["simulate", "demo:gpt", "--bandwidth", "0"],
              ["simulate", "demo:gtp"], ["tune", "demo:mlp", "--budget", "0"],
              ["debug", "demo:mlp", "--tolerance", "-1"], ["debug", "demo:mlp", "--train", "--lr", "-1"],
              ["diff", "demo:mlp", "--tolerance", "-1"], ["optimize", "demo:mlp", "--suite", "missing.txt"],
              ["backend", "check", "numpy", "--timeout", "0"], ["ops", "--backend", "nmupy"],
              ["serve", "--port", "99999"], ["migrate", "scan", "missing_dir"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per command; the best is kept")
    a = ap.parse_args()
    from opscope.app.cli import COMMANDS
    floor = min(cpu_of([sys.executable, "-c", "pass"])[0] for _ in range(a.repeat))
    print(f"{'command':<28}{'CPU s':>8}{'over floor':>12}  torch")
    print(f"{'python -c pass (floor)':<28}{floor:>8.3f}{'':>12}")
    worst, helps = 0.0, {}
    for name in [None, *COMMANDS]:
        argv = [name, "--help"] if name else ["--help"]
        runs = [cpu_of([sys.executable, "-c", PROBE, *argv]) for _ in range(a.repeat)]
        cpu = min(c for c, _ in runs)
        torch_loaded = any(t for _, t in runs)
        worst = max(worst, cpu)
        helps[name] = cpu
        label = "opscope " + " ".join(argv)
        print(f"{label:<28}{cpu:>8.3f}{cpu - floor:>12.3f}  {'YES' if torch_loaded else 'no'}")
    print(f"worst: {worst:.3f} s CPU (goal: under 0.3 s); {os.cpu_count()} CPUs")
    worst = 0.0
    print(f"\n{'a bad value (exit 2)':<56}{'CPU s':>8}{'over --help':>12}  torch/DuckDB")
    for argv in BAD_VALUES:
        runs = [cpu_of([sys.executable, "-c", PROBE, *argv]) for _ in range(a.repeat)]
        cpu = min(c for c, _ in runs)
        worst = max(worst, cpu)
        label = "opscope " + " ".join(argv)
        print(f"{label:<56}{cpu:>8.3f}{cpu - helps[argv[0]]:>12.3f}  {'YES' if any(t for _, t in runs) else 'no'}")
    print(f"worst: {worst:.3f} s CPU (goal: under 0.5 s, torch and DuckDB never imported)")


if __name__ == "__main__":
    main()
