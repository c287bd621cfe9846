"""Tensor references (attnd_ref) for numpy arrays and torch tensors: by reference when the
memory lies in one of the client's regions (offset + strides), else INLINE (CPU memory only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Protocol

import numpy as np

from . import dtypes
from ._lib import ffi

MAX_DIMS = 4


class RegionLike(Protocol):
    id: int
    device: str  # "cpu", or "cuda:N"

    def offset_of(self, ptr: int, nbytes: int) -> int | None: ...


@dataclass(frozen=True)
class View:
    """What a reference needs of an array or tensor."""

    ptr: int
    dtype: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # elements
    device: str
    obj: Any  # keeps the memory alive while the call runs

    @property
    def contiguous(self) -> bool:
        expect = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True

    @property
    def span(self) -> int:
        """Bytes from the first to one past the last element the view touches."""
        if any(n == 0 for n in self.shape):
            return 0
        last = sum((n - 1) * s for n, s in zip(self.shape, self.strides))
        return (last + 1) * dtypes.ITEMSIZE[self.dtype]


def view_of(x: Any) -> View:
    """View of a numpy array or a torch tensor (TypeError for anything else)."""
    if isinstance(x, np.ndarray):
        code = dtypes.from_numpy(x.dtype)
        if any(s % x.itemsize for s in x.strides):
            raise ValueError(f"array strides {x.strides} are not whole elements")
        return View(x.__array_interface__["data"][0], code, tuple(x.shape),
                    tuple(s // x.itemsize for s in x.strides), "cpu", x)
    if dtypes.is_torch_tensor(x):
        dev = x.device
        device = "cpu" if dev.type == "cpu" else f"{dev.type}:{dev.index or 0}"
        return View(x.data_ptr(), dtypes.from_torch(x.dtype), tuple(x.shape), tuple(x.stride()),
                    device, x)
    raise TypeError(f"expected a numpy array or a torch tensor, got {type(x).__name__}")


def _find(regions: Iterable[RegionLike], v: View) -> tuple[int, int] | None:
    for r in regions:
        if r.device != v.device:
            continue
        off = r.offset_of(v.ptr, v.span)
        if off is not None:
            return r.id, off
    return None


def _inline_copy(v: View) -> View:
    """A contiguous CPU copy of an input that is not in a region."""
    if isinstance(v.obj, np.ndarray):
        return view_of(np.ascontiguousarray(v.obj))
    return view_of(v.obj.contiguous())


def fill(ref: Any, x: Any, regions: Iterable[RegionLike], output: bool, keep: list) -> None:
    """Fill the attnd_ref cdata `ref` for x; keep collects what must outlive the call."""
    v = view_of(x)
    if len(v.shape) > MAX_DIMS:
        raise ValueError(f"{len(v.shape)} dims (at most {MAX_DIMS})")
    if any(s < 0 for s in v.strides):
        raise ValueError(f"negative strides {v.strides}")
    where = _find(regions, v)
    if where is None:
        if v.device != "cpu":
            raise ValueError(f"a {v.device} tensor outside every registered region: register its "
                             "buffer once (client.region_from_tensor) or allocate it with "
                             "client.empty(..., device=...)")
        if output and not v.contiguous:
            raise ValueError("an INLINE output must be contiguous (or lie in a region)")
        if not output and not v.contiguous:
            v = _inline_copy(v)
    ref.dtype = v.dtype
    ref.ndim = len(v.shape)
    for i, n in enumerate(v.shape):
        ref.shape[i] = n
    keep.append(v.obj)
    if where is not None:
        ref.region, ref.offset = where
        ref.has_strides = 0 if v.contiguous else 1
        for i, s in enumerate(v.strides):
            ref.strides[i] = s
        return
    ref.region = 0
    ref.bytes = v.span
    ptr = ffi.cast("void *", v.ptr)
    if output:
        ref.out = ptr
    else:
        ref.data = ptr


class Refs:
    """attnd_ref structs for one call, with everything they point to kept alive."""

    def __init__(self, regions: Iterable[RegionLike]) -> None:
        self._regions = list(regions)
        self.keep: list = []

    def __call__(self, x: Any, output: bool = False) -> Any:
        """An attnd_ref * for x, or NULL for None."""
        if x is None:
            return ffi.NULL
        ref = ffi.new("attnd_ref *")
        fill(ref, x, self._regions, output, self.keep)
        self.keep.append(ref)
        return ref
