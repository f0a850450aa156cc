"""`--debugpy [PORT]`: the model process listens for a DAP client (VS Code "attach"), on 127.0.0.1 only.

With a client attached, a location breakpoint on an op drops into debugpy *before* the op runs,
so the user can step into the Python of a custom `@operator` kernel.
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
