"""One name per dtype, shared by torch, numpy, description files and events."""
from __future__ import annotations

import numpy as np
import torch

_TORCH = {
    torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32", torch.int16: "int16",
    torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
    torch.complex64: "complex64", torch.complex128: "complex128",
    # named so that a graph holding them captures; numpy has none of them, so no reference kernel takes them
    torch.complex32: "complex32", torch.uint16: "uint16", torch.uint32: "uint32", torch.uint64: "uint64",
    torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2",
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


def round_to_bfloat16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16, ties to even, as torch's float -> bfloat16 conversion
    (c10::round_to_nearest_even) does; NaN stays NaN. numpy has no bfloat16, so a bfloat16 tensor lives in a
    float32 array whose every value is a bfloat16 -- the storage a chip would hold, in a wider word."""
    a = np.asarray(a, dtype=np.float32)
    bits = a.view(np.uint32)
    rounded = ((bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) & np.uint32(0xFFFF0000))
    out = rounded.view(np.float32)
    return np.where(np.isnan(a), np.float32("nan"), out)


def round_to_storage(a, dtype_name: str):
    """A kernel's result as the storage dtype `dtype_name` holds it (bfloat16: rounded; others: as is)."""
    if dtype_name == "bfloat16" and isinstance(a, np.ndarray) and a.dtype == np.float32:
        return round_to_bfloat16(a)
    return a
