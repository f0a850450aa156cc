"""`opscope profile [OPTIONS] -- python train.py ARGS`: a user's script, unchanged, every ATen op recorded.

    python -m opscope.profiler.runner --endpoint E --script train.py -- ARGS     # what live.py starts
    import opscope.profiler; opscope.profiler.step()                           # optional step marks

The runner installs an engine before the script's first line: the native one (native/, a C++
RecordFunction observer, the default where it builds) or the eager one (eager.py, a Python dispatch
mode: `--engine eager`, and always with `--values` or on CUDA). It and runs the script as `__main__`, the way `python train.py` would. Global module
hooks give every op its module path (the first root module called is "", later roots are named by
their class: `CrossEntropyLoss`); autograd's current node marks backward ops and links each to the
forward call that made its node; torch.optim's global step hooks mark the optimizer phase.

Steps: the end of every `optimizer.step()` ends a step, unless the script marks steps itself with
`opscope.profiler.step()` (then only those do). Ops before the first mark belong to step 0; what runs
after the last mark is one more step, the tail (config["train"]["tail"] says so). A DataLoader worker
(a forked child) records nothing: the engine leaves it at fork.
"""
from __future__ import annotations

import os
import runpy
import sys
import weakref
from pathlib import Path

from opscope.runtime.errors import ModelError, UsageError

_active: "ScriptProfile | None" = None
SCRIPT_ENGINES = ("native", "eager")


def step() -> None:
    """End the current step (like torch.profiler's `prof.step()`); a no-op unless opscope profiles the script."""
    if _active is not None:
        _active.mark(explicit=True)


class ScriptFailed(ModelError):
    """The script raised or exited with a non-zero code; what it ran so far stays recorded."""


def parse_command(command: list[str]) -> tuple[str, str, list[str]]:
    """`python train.py ARGS` or `python -m pkg.mod ARGS` -> (kind 'path'|'module', target, args).
    Bad input (not a python command, a script that does not exist) is a UsageError."""
    if not command:
        raise UsageError("nothing to profile after --: use opscope profile -- python train.py ARGS")
    exe, rest = command[0], command[1:]
    if exe.endswith(".py") and not Path(exe).name.startswith("python"):
        exe, rest = "python", command           # `opscope profile -- train.py` is the same thing
    if not Path(exe).name.startswith("python"):
        raise UsageError(f"opscope profiles Python scripts: expected `-- python script.py ARGS`, got {exe!r}")
    if rest[:1] == ["-m"]:
        if len(rest) < 2:
            raise UsageError("`python -m` needs a module name: opscope profile -- python -m pkg.train ARGS")
        return "module", rest[1], rest[2:]
    if not rest or rest[0].startswith("-"):
        raise UsageError("expected a script after python: opscope profile -- python train.py ARGS")
    path = Path(rest[0])
    if not path.is_file():
        raise UsageError(f"script {rest[0]} does not exist: check the path")
    return "path", str(path), rest[1:]


def make_engine(sink, engine: str = "native", *, backend: str = "torch:cpu", device: str = "cpu",
                values: bool = False, quiet: bool = True):
    """(engine object, its name, a note when the native engine was asked for and the eager one runs)."""
    if engine not in SCRIPT_ENGINES:
        raise UsageError(f"unknown engine {engine!r} for a script: use {' or '.join(SCRIPT_ENGINES)}")
    note = None
    if engine == "native":
        if values:
            note = "--values reads tensors from Python"
        else:
            from .native import native_engine
            eng, note = native_engine(sink, backend=backend, device=device, quiet=quiet)
            if eng is not None:
                return eng, "native", None
    from .eager import EagerProfiler
    return EagerProfiler(sink, backend=backend, device=device, values=values), "eager", note


class ScriptProfile:
    """An engine installed for a whole script; steps come from optimizer steps or marks."""

    def __init__(self, sink, *, backend: str = "torch:cpu", device: str = "cpu", values: bool = False,
                 engine: str = "native", quiet: bool = True):
        self.engine, self.engine_name, self.engine_note = make_engine(sink, engine, backend=backend, device=device,
                                                                      values=values, quiet=quiet)
        self.explicit = False           # the script calls opscope.profiler.step(): only those mark steps
        self.optimizer_steps = 0
        self.marks = 0
        self._names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._roots = 0
        self._handles: list = []

    # --- hooks ---------------------------------------------------------------------------
    def _module_pre(self, mod, args):
        name = self._names.get(mod)
        if name is None:
            if self.engine._modules:    # a module built on the fly inside another: under its caller
                name = f"{self.engine.module}.{type(mod).__name__}".lstrip(".")
                self._names[mod] = name
            else:                       # a root model: name everything below it once
                prefix = "" if self._roots == 0 else type(mod).__name__
                self._roots += 1
                for n, m in mod.named_modules():
                    self._names.setdefault(m, f"{prefix}.{n}".strip(".") if n else prefix)
                name = self._names[mod]
        self.engine.enter_module(name)

    def _module_post(self, mod, args, out):
        self.engine.leave_module()

    def _optimizer_pre(self, opt, args, kwargs):
        self.engine.set_phase("optimizer")

    def _optimizer_post(self, opt, args, kwargs):
        self.engine.set_phase("forward")
        self.optimizer_steps += 1
        if not self.explicit:
            self._end_step()

    def mark(self, explicit: bool = False) -> None:
        if explicit and not self.explicit:
            self.explicit = True
        self._end_step()

    def _end_step(self) -> None:
        self.marks += 1
        self.engine.end_step()
        self.engine.begin_step()

    # --- install / remove ----------------------------------------------------------------
    def start(self) -> "ScriptProfile":
        global _active
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim
        self._handles = [nn_module.register_module_forward_pre_hook(self._module_pre),
                         nn_module.register_module_forward_hook(self._module_post, always_call=True),
                         optim.register_optimizer_step_pre_hook(self._optimizer_pre),
                         optim.register_optimizer_step_post_hook(self._optimizer_post)]
        os.register_at_fork(after_in_child=_leave_in_child)
        _active = self
        self.engine.begin_step()
        self.engine.__enter__()
        del torch
        return self

    def stop(self) -> dict:
        """Remove the engine; the tail (ops after the last mark) becomes one more step. Returns the run's info."""
        global _active
        if _active is self:
            _active = None
            self.engine.__exit__(None, None, None)
            tail = self.engine.step_ops()
            self.engine.end_step()
            for h in self._handles:
                h.remove()
            self._handles = []
            self.tail = tail
        info = {"script": True, "steps": self.marks, "optimizer_steps": self.optimizer_steps,
                "marked_by": "opscope.profiler.step()" if self.explicit else "optimizer.step()",
                "tail": {"step": self.marks, "ops": getattr(self, "tail", 0)}, "engine": self.engine_name}
        if self.engine_note:
            info["engine_note"] = self.engine_note
        return info


def _leave_in_child() -> None:
    """A forked child (DataLoader worker) must not write into its parent's stream: drop the engine there."""
    global _active
    prof, _active = _active, None
    if prof is None:
        return
    prof.engine.leave_in_child()
    for h in prof._handles:
        h.remove()
    prof.engine.sink = _Nowhere()


class _Nowhere:
    def send(self, batch) -> bool:
        return True


def run_script(sink, command: list[str], *, backend: str = "torch:cpu", device: str = "cpu", values: bool = False,
               on_info=None, engine: str = "native") -> dict:
    """Run the script as __main__ with the engine installed; the info the run keeps (steps, tail, engine).
    Raises ScriptFailed when the script raises or exits non-zero (after its events are flushed)."""
    kind, target, args = parse_command(command)
    prof = ScriptProfile(sink, backend=backend, device=device, values=values, engine=engine, quiet=False)
    if prof.engine_note and engine == "native":
        print(f"opscope: note: {prof.engine_note}; the eager engine records this run", file=sys.stderr, flush=True)
    old_argv, old_path = sys.argv[:], sys.path[:]
    sys.argv = [target, *args]
    # what `python script.py` / `python -m module` would put first: the user's command keeps Python's rules (the
    # runner itself started without the working folder on its path: runtime/child.py)
    sys.path.insert(0, str(Path(target).resolve().parent) if kind == "path" else os.getcwd())
    error = None
    prof.start()
    try:
        if kind == "path":
            runpy.run_path(target, run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code not in (None, 0):
            error = f"the script exited with code {e.code}" if isinstance(e.code, int) else \
                f"the script exited: {e.code}"
    except BaseException as e:
        import traceback
        traceback.print_exc()              # the script's own traceback, where its output goes
        error = f"the script raised {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    finally:
        info = prof.stop()
        sys.argv, sys.path[:] = old_argv, old_path
        if on_info:
            on_info(info)
    if error:
        raise ScriptFailed(f"{error} (after {info['steps']} step(s); what it ran is recorded)")
    return info
