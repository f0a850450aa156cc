"""`opscope profile -- torchrun ARGS script.py ARGS`: a distributed job, unchanged, every rank profiled.

    if is_launcher(command):                     # torchrun ... / python -m torch.distributed.run ...
        run_id, rc = profile_launcher(command, store, engine="native")

The launcher runs as the user typed it. Before it starts, a sitecustomize goes first on PYTHONPATH:
every Python process of the job reads it, and the ones torchrun started as ranks (RANK and WORLD_SIZE
set) install opscope's engine (rank_profile.py) before the script's first line. Each rank writes its
steps into one private job folder in shared.py's layout; when the launcher exits, that folder becomes
one run with world_size ranks (engine "dist"), and the folder is removed.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from opscope.runtime.errors import ModelError, UsageError

from .rank_profile import ENV_COMMAND, ENV_DIR, ENV_ENGINE

_LAUNCH_MODULES = ("torch.distributed.run", "torch.distributed.launch")

# NOTE: it shadows any sitecustomize further down the path, so it runs that one too
_SITECUSTOMIZE = '''\
"""Written by `opscope profile -- torchrun ...`: profiles this process when it is one of the job's ranks."""
import os as _os
import sys as _sys

if _os.environ.get("OPSCOPE_RANKS_DIR") and "RANK" in _os.environ and "WORLD_SIZE" in _os.environ:
    try:
        from opscope.profiler.rank_profile import start_rank as _start
        _start()
    except Exception as _e:
        print(f"opscope: rank {_os.environ.get('RANK')} is not profiled: {type(_e).__name__}: {_e}",
              file=_sys.stderr, flush=True)


def _chain():
    import importlib.machinery
    import importlib.util
    here = _os.path.dirname(_os.path.abspath(__file__))
    path = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_chain()
'''


def is_launcher(command: list[str]) -> bool:
    """torchrun ARGS, or python -m torch.distributed.run / torch.distributed.launch ARGS."""
    if not command:
        return False
    if Path(command[0]).name == "torchrun":
        return True
    return Path(command[0]).name.startswith("python") and command[1:2] == ["-m"] and \
        command[2:3] != [] and command[2] in _LAUNCH_MODULES


def _check(command: list[str]) -> None:
    """What can be said before anything starts: the launcher is there (its own arguments are its to check)."""
    if Path(command[0]).name == "torchrun" and shutil.which(command[0]) is None:
        raise UsageError(f"{command[0]} is not on PATH: install torch there, or use "
                         "`opscope profile -- python -m torch.distributed.run ARGS script.py`")


def profile_launcher(command: list[str], store, *, engine: str = "native", stdout=None) -> tuple[str | None, int]:
    """Run the launcher with every rank profiled; (the run's id or None when no rank recorded anything,
    the launcher's exit code). stdout: where the job's own output goes (None: ours)."""
    from .script import SCRIPT_ENGINES
    from .shared import import_shared
    if engine not in SCRIPT_ENGINES:
        raise UsageError(f"unknown engine {engine!r} for a script: use {' or '.join(SCRIPT_ENGINES)}")
    _check(command)
    if engine == "native":                 # built here once, not by every rank at the same time
        from .native.build import load
        mod, note = load(quiet=False)
        if mod is None:
            print(f"opscope: note: {note}; the eager engine records this job", file=sys.stderr, flush=True)
            engine = "eager"
    home = Path(os.environ.get("OPSCOPE_HOME") or Path.home() / ".opscope")
    home.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="ranks-", dir=home))      # 0700: only this user reads the events
    try:
        boot, job = tmp / "boot", tmp / "jobs" / "job"
        boot.mkdir()
        job.mkdir(parents=True)
        (boot / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(boot), *filter(None, [env.get("PYTHONPATH")])])
        env.update({ENV_DIR: str(job), ENV_ENGINE: engine, ENV_COMMAND: " ".join(command)[:400]})
        try:
            rc = subprocess.call(command, env=env, stdout=stdout)
        except OSError as e:
            raise UsageError(f"cannot start {command[0]}: {e.strerror or e}") from None
        except KeyboardInterrupt:
            raise
        if not any((job / name).is_dir() for name in os.listdir(job)):
            return None, rc
        try:
            (run_id,) = import_shared(job, store)
        except UsageError as e:
            raise ModelError(f"the ranks' events could not be read: {e}") from None
        return run_id, rc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def nothing_recorded(rc: int) -> str:
    return (f"no rank recorded anything (the launcher exited with code {rc}): opscope profiles the Python "
            "processes the launcher starts with RANK and WORLD_SIZE set; check that the script ran (its output "
            "above) and that the ranks are Python processes of this interpreter")
