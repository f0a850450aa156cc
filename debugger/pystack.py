"""The Python side of an op: its stack at capture time, its own source line, the user's frame of an error.

    with full_stacks() as stacks:              # capture keeps every frame, not only `forward`s
        session = open_session(model, backend)
    frames = stacks.get(node.name, [])         # [Frame], outermost first
    user_frames(frames)                        # innermost first, torch and opscope internals hidden

`open_debug_session` does both and puts the stacks on `session.extra["stacks"]`; a model that
raises while it is captured gets the file:line of the user's own frame in its message.
"""
from __future__ import annotations

import contextlib
import os
import re
import traceback
from dataclasses import dataclass

import torch

from opscope.runtime.errors import ModelError

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OPSCOPE_DIRS = tuple(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + d + os.sep
                      for d in ("runtime", "debugger", "profiler", "app"))
_DEMOS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + os.path.join("runtime", "demos") + os.sep
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    function: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def parse_stack(trace: str) -> list[Frame]:
    """torch.fx's `stack_trace` text -> frames, outermost first."""
    return [Frame(p, int(n), fn, code.strip()) for p, n, fn, code in _FRAME.findall(trace or "")]


def internal(path: str) -> bool:
    """torch's own files and opscope's (its bundled demo models are user code): frames a user never
    wants to read first."""
    if path.startswith(_DEMOS):
        return False
    return path.startswith(_TORCH_DIR) or path.startswith(_OPSCOPE_DIRS) or path.startswith("<")


def user_frames(frames: list[Frame]) -> list[Frame]:
    """Innermost first, internal frames hidden (a model written inside torch itself has none)."""
    return [f for f in reversed(frames) if not internal(f.path)]


@contextlib.contextmanager
def full_stacks():
    """While capturing: every frame from the first `forward` inward, recorded per node name.

    torch.export's tracer keeps only frames *named* `forward`, so an op inside a helper function
    is placed at the module's call site. Its other filter (from the first forward inward, minus
    torch's uninteresting files) keeps the helper's own line; capture then takes the innermost
    frame as the node's source. The ExportedProgram's node metadata is read on its way to the
    opscope graph (node names are the same)."""
    from torch.fx import proxy
    from opscope.runtime import capture as cap

    stacks: dict[str, list[Frame]] = {}
    orig_filter = proxy.TracerBase._filter_traceback_frames
    orig_translate = getattr(cap, "translate_export", None)

    def every_frame(self, summary):
        saved = self.__dict__.get("_record_forward_stack_traces_only", False)
        self._record_forward_stack_traces_only = False
        try:
            return orig_filter(self, summary)
        finally:
            self._record_forward_stack_traces_only = saved

    def translate_export(ep, *a, **kw):
        for fx in ep.graph.nodes:
            if fx.op == "call_function":
                stacks[fx.name] = parse_stack(fx.meta.get("stack_trace") or "")
        return orig_translate(ep, *a, **kw)

    # NOTE: both patches go once capture stores the stack on each Node (see the debugger's notes)
    proxy.TracerBase._filter_traceback_frames = every_frame
    if orig_translate is not None:
        cap.translate_export = translate_export
    try:
        yield stacks
    finally:
        proxy.TracerBase._filter_traceback_frames = orig_filter
        if orig_translate is not None:
            cap.translate_export = orig_translate


def error_frame(exc: BaseException) -> Frame | None:
    """The innermost frame of the user's code in an exception (and what caused it)."""
    best = None
    seen = set()
    e = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for fs in traceback.extract_tb(e.__traceback__):
            if not internal(fs.filename) and "site-packages" + os.sep + "torch" not in fs.filename:
                best = Frame(fs.filename, fs.lineno or 0, fs.name, (fs.line or "").strip())
        e = e.__cause__ or e.__context__
    return best


def open_debug_session(model: str, backend: str, **kw):
    """open_session with the Python side kept: per-node stacks, and the user's file:line on a raise."""
    from opscope.runtime import open_session

    try:
        with full_stacks() as stacks:
            session = open_session(model, backend, **kw)
    except ModelError as e:
        f = error_frame(e)
        if f is None:
            raise
        raise ModelError(f"{e} (at {f.where}: {f.code})") from e
    session.extra["stacks"] = stacks
    return session
