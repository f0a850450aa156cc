"""One name per dtype, shared by torch, numpy, description files and events."""
from __future__ import annotations

import numpy as np
import torch

_TORCH = {
    torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32", torch.int16: "int16",
    torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
    torch.complex64: "complex64", torch.complex128: "complex128",
}
_FROM_NAME = {v: k for k, v in _TORCH.items()}
ITEMSIZE = {name: _FROM_NAME[name].itemsize for name in _FROM_NAME}
FLOATS = frozenset({"float64", "float32", "float16", "bfloat16"})


def name_of(dtype) -> str:
    """'float32' for torch.float32, np.float32, np.dtype('float32') or 'float32'."""
    if isinstance(dtype, torch.dtype):
        return _TORCH[dtype]
    if isinstance(dtype, str) and dtype in _FROM_NAME:
        return dtype          # a name already; numpy has no 'bfloat16' to parse it
    return np.dtype(dtype).name


def to_torch(dtype) -> torch.dtype:
    return _FROM_NAME[name_of(dtype)]


def to_numpy(dtype) -> np.dtype:
    """numpy has no bfloat16: it computes in float32 (the reference backend says so in check)."""
    name = name_of(dtype)
    if name == "bfloat16":
        return np.dtype("float32")
    return np.dtype(name)
