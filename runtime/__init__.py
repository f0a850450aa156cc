"""opscope.runtime: hardware-agnostic ops, capture, placement, the executor and backends (HDI).

    from opscope.runtime import open_session
    s = open_session("demo:gpt", "sim:npu-a1")
    outputs = s.run_host()

The names below are imported on first use (PEP 562), so `import opscope.runtime.errors` -- what the
CLI, the migration scanner and `--help` need -- does not pay for importing torch.
"""
from __future__ import annotations

import importlib

from .errors import ModelError, OpscopeError, UnsupportedOpError, UsageError

_LAZY = {
    "HybridStrategy": ".hybrid", "run_hybrid": ".hybrid",
    "Executor": ".executor", "OpCall": ".executor", "Plan": ".executor", "RunInfo": ".executor",
    "compile_plan": ".executor",
    "OPS": ".ops", "operator": ".ops",
    "Session": ".session", "compare": ".session", "open_session": ".session",
}

__all__ = sorted([*_LAZY, "ModelError", "OpscopeError", "UnsupportedOpError", "UsageError"])


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:                 # a submodule: `opscope.runtime.executor` after `import opscope.runtime`
        if name.startswith("_"):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from e
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value            # the next lookup is a plain attribute
    return value
