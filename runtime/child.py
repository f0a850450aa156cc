"""Every process opscope starts, started one way: nothing from the working folder is imported.

    proc = start(python_command("opscope.profiler.runner", "--hwm", "100"), env=env, stdout=subprocess.PIPE)

`python -m MODULE` puts the working folder first on sys.path, so a numpy.py (or torch/, json.py, opscope/) in the
folder a user typed `opscope ...` in -- a cloned repository -- would run in the child instead of the installed
package. python_command() runs MODULE as __main__ without that entry: `-P` on Python >= 3.11, a bootstrap that
drops it before importing anything on 3.10. start() also drops the PYTHONPATH entries that name the working folder
without saying so (empty or relative: `PYTHONPATH=:$PYTHONPATH` with nothing set is one); absolute entries are the
user's choice and stay, as do site-packages, the user's site and .pth files (an editable install keeps working).
A user's own command (the script `profile --` wraps, a torchrun launcher) keeps Python's own rules: it is theirs.
"""
from __future__ import annotations

import os
import subprocess
import sys

SAFE_PATH_FLAG = sys.version_info >= (3, 11)      # -P: "don't prepend a potentially unsafe path to sys.path"

# NOTE: with -c, sys.path[0] is "" (the working folder); it goes before the first import that could find a module
# there. sys and os are imported during start-up already, so these two imports cannot be shadowed.
_BOOTSTRAP = ("import sys, os; sys.path[:] = [p for p in sys.path if p]; del sys.argv[0]; import runpy; "
              "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")


def python_command(module: str, *args: str, safe_path_flag: bool = SAFE_PATH_FLAG) -> list[str]:
    """argv running `python -m module args` with this interpreter, the working folder not on sys.path."""
    if safe_path_flag:
        return [sys.executable, "-P", "-m", module, *map(str, args)]
    return [sys.executable, "-c", _BOOTSTRAP, module, *map(str, args)]


def child_env(env: dict | None = None) -> dict:
    """env (default: ours) with PYTHONPATH's empty and relative entries left out: each names the working folder."""
    env = dict(os.environ if env is None else env)
    if "PYTHONPATH" in env:
        kept = [p for p in env["PYTHONPATH"].split(os.pathsep) if p and os.path.isabs(p)]
        if kept:
            env["PYTHONPATH"] = os.pathsep.join(kept)
        else:
            del env["PYTHONPATH"]
    return env


def start(argv: list[str], *, env: dict | None = None, **popen) -> subprocess.Popen:
    """subprocess.Popen(argv, env=child_env(env), **popen): the one place opscope starts a process."""
    return subprocess.Popen(argv, env=child_env(env), **popen)
