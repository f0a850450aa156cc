"""`--debugpy [PORT]`: the model process listens for a DAP client (VS Code "attach"), on 127.0.0.1 only.

With a client attached, a location breakpoint on an op drops into debugpy *before* the op runs,
in a frame placed at the op's own line of the user's file (what the IDE opens), with the op's
input tensors as its variables (`in0`, `in1`, ...). The model's real frames are gone by then (the
graph was captured once); the kernel that runs next is one step away for a custom `@operator`.
"""
from __future__ import annotations

from opscope.runtime.errors import UsageError

DEFAULT_PORT = 5678
HOST = "127.0.0.1"      # never another interface: a DAP server runs arbitrary code


def listen(port: int = DEFAULT_PORT) -> tuple[str, int]:
    try:
        import debugpy
    except ImportError:
        raise UsageError("--debugpy needs the debugpy package: pip install debugpy")
    try:
        host, bound = debugpy.listen((HOST, int(port)))
    except (RuntimeError, OSError, ValueError, OverflowError) as e:
        raise UsageError(f"--debugpy: cannot listen on {HOST}:{port} ({e}); pick another port")
    return host, bound


def attached() -> bool:
    try:
        import debugpy
        return debugpy.is_client_connected()
    except Exception:
        return False


def breakpoint_if_attached() -> bool:
    if not attached():
        return False
    import debugpy
    debugpy.breakpoint()
    return True


def break_at(frame, values: dict) -> bool:
    """Stop the attached IDE in a frame at `frame.path:frame.line` (a pystack.Frame; None: here)."""
    if not attached():
        return False
    import debugpy
    if frame is None or frame.line < 1:
        debugpy.breakpoint()
        return True
    # blank lines put the call on the op's line number; the file name is the user's, so the IDE
    # shows their source there (the code object is ours: it only calls the breakpoint).
    # NOTE: debugpy suspends at the frame's *next* line event; the loop's jump back is one, on the
    # same line (a second line would show the user the line after the op's)
    code = compile("\n" * (frame.line - 1) + "for _opscope_i in (0, 1): _opscope_i or _opscope_break()",
                   frame.path, "exec")
    scope = dict(values)
    scope["_opscope_break"] = debugpy.breakpoint
    exec(code, scope)       # noqa: S102 -- our own two statements, not user input
    return True
