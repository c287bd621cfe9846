"""Element types: attnd_dtype codes and their numpy (ml_dtypes) and torch equivalents."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

F32, F16, BF16, FP8_E4M3, I32, I64 = range(6)
NAMES = {F32: "f32", F16: "f16", BF16: "bf16", FP8_E4M3: "fp8_e4m3", I32: "i32", I64: "i64"}
CODES = {name: code for code, name in NAMES.items()}
ITEMSIZE = {F32: 4, F16: 2, BF16: 2, FP8_E4M3: 1, I32: 4, I64: 8}

_NUMPY = {np.dtype(np.float32): F32, np.dtype(np.float16): F16, np.dtype(np.int32): I32,
          np.dtype(np.int64): I64,
          np.dtype(np.uint16): BF16}  # raw bf16 bits (to_bf16 / from_bf16), without ml_dtypes
try:  # bfloat16 and float8_e4m3fn as numpy dtypes, when ml_dtypes is installed
    import ml_dtypes

    _NUMPY[np.dtype(ml_dtypes.bfloat16)] = BF16
    _NUMPY[np.dtype(ml_dtypes.float8_e4m3fn)] = FP8_E4M3
except ImportError:  # pragma: no cover - depends on the environment
    ml_dtypes = None  # type: ignore[assignment]

_TORCH_NAMES = {"float32": F32, "float16": F16, "bfloat16": BF16, "float8_e4m3fn": FP8_E4M3,
                "int32": I32, "int64": I64}


def from_numpy(dtype: Any) -> int:
    """attnd_dtype of a numpy dtype; TypeError for one the daemon does not take."""
    code = _NUMPY.get(np.dtype(dtype))
    if code is None:
        raise TypeError(f"dtype {np.dtype(dtype)} not supported (float32, float16, int32, int64, "
                        "ml_dtypes.bfloat16 / float8_e4m3fn, uint16 = bf16 bits)")
    return code


def from_torch(dtype: Any) -> int:
    """attnd_dtype of a torch dtype; TypeError for one the daemon does not take."""
    code = _TORCH_NAMES.get(str(dtype).removeprefix("torch."))
    if code is None:
        raise TypeError(f"dtype {dtype} not supported (float32, float16, bfloat16, "
                        "float8_e4m3fn, int32, int64)")
    return code


def to_numpy(code: int) -> np.dtype:
    """numpy dtype for an attnd_dtype (bf16 and fp8 need ml_dtypes)."""
    if code == BF16 or code == FP8_E4M3:
        if ml_dtypes is None:
            raise TypeError(f"{NAMES[code]} as a numpy dtype needs ml_dtypes (pip install ml_dtypes)")
        return np.dtype(ml_dtypes.bfloat16 if code == BF16 else ml_dtypes.float8_e4m3fn)
    return np.dtype({F32: np.float32, F16: np.float16, I32: np.int32, I64: np.int64}[code])


def to_torch(code: int) -> Any:
    """torch dtype for an attnd_dtype."""
    import torch

    return getattr(torch, {v: k for k, v in _TORCH_NAMES.items()}[code])


def is_torch_tensor(x: Any) -> bool:
    """True for a torch.Tensor, without importing torch when the caller never did."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def to_bf16(a: Any) -> np.ndarray:
    """float32 array -> uint16 array of bf16 bits (round to nearest even; NaN stays NaN)."""
    f = np.ascontiguousarray(a, dtype=np.float32)
    u = f.view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FC0), r)


def from_bf16(b: Any) -> np.ndarray:
    """uint16 array of bf16 bits -> float32 array."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
