"""opscope.runtime: hardware-agnostic ops, capture, placement, the executor and backends (HDI).

    from opscope.runtime import open_session
    s = open_session("demo:gpt", "sim:npu-a1")
    outputs = s.run_host()
"""
from .errors import ModelError, OpscopeError, UnsupportedOpError, UsageError
from .hybrid import HybridStrategy, run_hybrid
from .executor import Executor, OpCall, Plan, RunInfo, compile_plan
from .ops import OPS, operator
from .session import Session, compare, open_session

__all__ = ["Executor", "HybridStrategy", "run_hybrid", "ModelError", "OPS", "OpCall", "OpscopeError", "Plan", "RunInfo", "Session",
           "UnsupportedOpError", "UsageError", "compare", "compile_plan", "open_session", "operator"]
