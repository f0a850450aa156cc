"""The Python side of an op: its stack at capture time, its own source line, the user's frame of an error.

    with full_stacks() as seen:                # capture keeps every frame, not only `forward`s
        session = open_session(model, backend)
    frames = seen.stacks.get(node.name, [])    # [Frame], outermost first
    user_frames(frames)                        # innermost first, torch and opscope internals hidden
    seen.locals.get(node.name, [])             # [(name, "4x8 float32" | "3")]: the user's frame, as traced

`open_debug_session` does both and puts them on `session.extra["stacks"]` and `["locals"]`; a
model that raises while it is captured gets the file:line of the user's own frame in its message.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import traceback
from dataclasses import dataclass, field

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


@dataclass
class Captured:
    """What capture saw of the Python side, per node name."""

    stacks: dict = field(default_factory=dict)     # node name -> [Frame], outermost first
    locals: dict = field(default_factory=dict)     # node name -> [(local name, summary)]


MAX_LOCALS = 16


def summarize_local(value) -> str | None:
    """A local as the op panel shows it: a tensor's shape and dtype, a small scalar's value;
    None for what says nothing about the values (modules, functions, classes)."""
    if isinstance(value, torch.Tensor):
        shape = "x".join(map(str, value.shape)) or "scalar"
        return f"{shape} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, (bool, int, float)) or value is None:
        text = repr(value)
        return text if len(text) <= 24 else text[:21] + "..."
    if isinstance(value, str):
        return repr(value) if len(value) <= 22 else repr(value[:19] + "...")
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return f"{type(value).__name__} of {len(value)} tensors"
    if isinstance(value, (tuple, list)) and len(value) <= 4 and all(isinstance(v, (int, float, bool)) for v in value):
        return repr(tuple(value) if isinstance(value, tuple) else value)
    return None


def frame_locals(frame) -> list[tuple[str, str]]:
    out = []
    for name, value in list(frame.f_locals.items()):
        if name.startswith("__") or name == "self":
            continue
        text = summarize_local(value)
        if text is not None:
            out.append((name, text))
        if len(out) == MAX_LOCALS:
            break
    return out


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
    """While capturing: every frame from the first `forward` inward, and the locals of the
    innermost user frame as each op was traced, recorded per node name.

    torch.export's tracer keeps only frames *named* `forward`, so an op inside a helper function
    is placed at the module's call site. Its other filter (from the first forward inward, minus
    torch's uninteresting files) keeps the helper's own line; capture then takes the innermost
    frame as the node's source. The ExportedProgram's node metadata is read on its way to the
    opscope graph (node names are the same).

    The tracer runs the user's own frames (with fake tensors), so when it makes a node the frame
    that asked for the op is live: its locals go into the node's meta, which export keeps."""
    from torch.fx import proxy
    from opscope.runtime import capture as cap

    seen = Captured()
    stacks = seen.stacks
    orig_filter = proxy.TracerBase._filter_traceback_frames
    orig_proxy = proxy.TracerBase.create_proxy
    orig_translate = getattr(cap, "translate_export", None)

    def create_proxy(self, *args, **kwargs):
        p = orig_proxy(self, *args, **kwargs)
        node = getattr(p, "node", None)
        if node is not None and "opscope_locals" not in node.meta:
            f = sys._getframe(1)
            while f is not None and internal(f.f_code.co_filename):
                f = f.f_back
            if f is not None:
                node.meta["opscope_locals"] = frame_locals(f)
        return p

    def every_frame(self, summary):
        saved = self.__dict__.get("_record_forward_stack_traces_only", False)
        self._record_forward_stack_traces_only = False
        try:
            # without our create_proxy wrapper (below): it is not the user's line
            return orig_filter(self, traceback.StackSummary.from_list(
                [f for f in summary if f.filename != __file__]))
        finally:
            self._record_forward_stack_traces_only = saved

    def translate_export(ep, *a, **kw):
        for fx in ep.graph.nodes:
            if fx.op == "call_function":
                stacks[fx.name] = parse_stack(fx.meta.get("stack_trace") or "")
                if fx.meta.get("opscope_locals"):
                    seen.locals[fx.name] = fx.meta["opscope_locals"]
        return orig_translate(ep, *a, **kw)

    # NOTE: both patches go once capture stores the stack on each Node (see the debugger's notes)
    proxy.TracerBase._filter_traceback_frames = every_frame
    proxy.TracerBase.create_proxy = create_proxy
    if orig_translate is not None:
        cap.translate_export = translate_export
    try:
        yield seen
    finally:
        proxy.TracerBase._filter_traceback_frames = orig_filter
        proxy.TracerBase.create_proxy = orig_proxy
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
        with full_stacks() as seen:
            session = open_session(model, backend, **kw)
    except ModelError as e:
        f = error_frame(e)
        if f is None:
            raise
        raise ModelError(f"{e} (at {f.where}: {f.code})") from e
    session.extra["stacks"] = seen.stacks
    session.extra["locals"] = seen.locals
    return session
