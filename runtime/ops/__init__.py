"""Hardware-agnostic operators: specifications, reference kernels, cost models, `@operator`."""
from . import math as _math, nn as _nn, shape as _shape  # noqa: F401  (registration)
from .registry import OPS, OpDef, bytes_of, flops_of, op_for_target
from .user import operator

__all__ = ["OPS", "OpDef", "bytes_of", "flops_of", "op_for_target", "operator"]
