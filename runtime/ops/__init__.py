"""Hardware-agnostic operators: specifications, reference kernels, cost models, `@operator`."""
from . import (convolution as _convolution, dynamic as _dynamic, fft as _fft, indexing as _indexing,  # noqa: F401
               linalg as _linalg, lookup as _lookup, losses as _losses, math as _math, nn as _nn,
               pooling as _pooling, random as _random, recurrent as _recurrent, scans as _scans, shape as _shape,
               sorting as _sorting, special as _special)
from . import backward as _backward, optim as _optim, view_backward as _view_backward  # noqa: F401,E402  (training ops: after the forward ones)
from . import grouped_mm as _grouped_mm  # noqa: F401,E402  (a library's MoE op: transformers' grouped experts)
from . import quantum as _quantum  # noqa: F401,E402  (parameterised circuits: the seed's quantum-op interface)
from .registry import OPS, OpDef, bytes_of, flops_of, op_for_target
from .user import operator

__all__ = ["OPS", "OpDef", "bytes_of", "flops_of", "op_for_target", "operator"]
