"""Registered memory: POSIX shared-memory regions (numpy arrays, CPU torch tensors) and CUDA
regions registered by IPC from a torch CUDA buffer."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from . import dtypes
from ._lib import ffi

if TYPE_CHECKING:
    from .client import Client

ALIGN = 256  # bytes; every dtype's alignment, and a cache line or more


class _Bump:
    """Bump allocation of offsets in [start, size)."""

    def __init__(self, start: int, size: int) -> None:
        self.start, self.size, self.used = start, size, start

    def take(self, nbytes: int, what: str) -> int:
        off = -(-self.used // ALIGN) * ALIGN
        if off + nbytes > self.size:
            raise MemoryError(f"{what}: {nbytes} bytes do not fit ({max(self.size - off, 0)} "
                              f"of {self.size - self.start} left; reset() or a larger region)")
        self.used = off + nbytes
        return off


class Region:
    """A registered region: id (the daemon's), device ("cpu" or "cuda:N"), base pointer and size
    in this process. Arrays and tensors inside it travel by reference."""

    id: int
    device: str
    base: int
    size: int
    _bump: _Bump

    def __init__(self, client: Client) -> None:
        self._client = client

    def offset_of(self, ptr: int, nbytes: int) -> int | None:
        """Offset of [ptr, ptr + nbytes) in this region, None when it is not wholly inside."""
        if self.base <= ptr and ptr + nbytes <= self.base + self.size:
            return ptr - self.base
        return None

    def holds(self, x: Any) -> bool:
        """True when x (array or tensor) lies wholly in this region."""
        from .refs import view_of

        v = view_of(x)
        return v.device == self.device and self.offset_of(v.ptr, v.span) is not None

    def reset(self) -> None:
        """Forget every array or tensor handed out by array() / tensor() (memory is reused)."""
        self._bump.used = self._bump.start

    def tensor(self, shape: tuple[int, ...] | int, dtype: Any) -> Any:
        """A new torch tensor of this shape and dtype inside the region (uninitialised)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        n = math.prod(shape) * dtypes.ITEMSIZE[dtypes.from_torch(dtype)]
        off = self._bump.take(n, f"region {self.id}")
        return self._bytes_at(off, n).view(dtype).view(shape)

    def _bytes_at(self, off: int, n: int) -> Any:
        """A torch uint8 tensor over bytes [off, off + n) of the region."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ShmRegion(Region):
    """A POSIX shared-memory object mapped here and by the daemon (attnd_client_shm_create)."""

    def __init__(self, client: Client, size: int) -> None:
        super().__init__(client)
        self._shm = ffi.new("attnd_shm *")
        client._check(client._lib.attnd_client_shm_create(client._c, size, self._shm))
        self.id, self.device = int(self._shm.region), "cpu"
        self.base, self.size = int(ffi.cast("uintptr_t", self._shm.base)), int(self._shm.size)
        self._bump = _Bump(0, self.size)
        self._bytes: np.ndarray | None = np.frombuffer(ffi.buffer(self._shm.base, self.size),
                                                       dtype=np.uint8)
        self._torch: Any = None

    def array(self, shape: tuple[int, ...] | int, dtype: Any = np.float32) -> np.ndarray:
        """A new numpy array of this shape and dtype inside the region (uninitialised)."""
        dt = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        n = math.prod(shape) * dt.itemsize
        off = self._bump.take(n, f"region {self.id}")
        assert self._bytes is not None
        return self._bytes[off:off + n].view(dt).reshape(shape)

    def _bytes_at(self, off: int, n: int) -> Any:
        if self._torch is None:
            import torch

            self._torch = torch.frombuffer(self._bytes, dtype=torch.uint8)
        return self._torch[off:off + n]

    def close(self) -> None:
        """Unregister and unmap; arrays and tensors inside must not be used afterwards."""
        if self._bytes is None:
            return
        self._bytes = self._torch = None
        c = self._client
        rv = c._lib.attnd_client_shm_destroy(c._c if c._c is not None else ffi.NULL, self._shm)
        c._forget(self)
        c._check(rv)


class CudaRegion(Region):
    """A torch CUDA buffer registered with the daemon by CUDA IPC (zero copy). The region spans
    the allocation the buffer's storage lives in, from its start to the storage's end, so every
    tensor viewing the storage passes by reference. The storage stays alive while registered.
    The client library exports the allocation through the CUDA driver, not torch's
    _share_cuda_(), whose producer-side bookkeeping waits for a torch consumer to release the
    block (the daemon never does: blocks would stay in limbo and torch warn at exit)."""

    def __init__(self, client: Client, t: Any, carve: bool = False) -> None:
        import torch

        super().__init__(client)
        storage = t.untyped_storage()
        self._storage: Any = storage
        self.device = f"cuda:{t.device.index if t.device.index is not None else 0}"
        self.id = int(client._lib.attnd_client_region_next_id(client._c))
        base = ffi.new("uint64_t *")
        with torch.cuda.device(t.device):  # the driver calls need this device's context current
            client._check(client._lib.attnd_client_region_register_cuda_ptr(
                client._c, self.id, ffi.cast("void *", storage.data_ptr()), storage.nbytes(),
                base))
        self.base = int(base[0])
        first = storage.data_ptr() - self.base
        self.size = first + storage.nbytes()
        # only a buffer this package allocated is carved by tensor()
        self._bump = _Bump(first if carve else self.size, self.size)
        self._first = first

    @classmethod
    def allocate(cls, client: Client, nbytes: int, device: Any) -> CudaRegion:
        """A fresh buffer of nbytes on device, registered; tensor() carves it."""
        import torch

        return cls(client, torch.empty(nbytes, dtype=torch.uint8, device=device), carve=True)

    def _bytes_at(self, off: int, n: int) -> Any:
        import torch

        whole = torch.empty(0, dtype=torch.uint8, device=self.device)
        whole.set_(self._storage, off - self._first, (n,), (1,))
        return whole

    def close(self) -> None:
        """Unregister; the buffer is released once nothing else refers to it."""
        if self._storage is None:
            return
        self._storage = None
        c = self._client
        rv = c._lib.attnd_client_region_unregister(c._c, self.id) if c._c is not None else 0
        c._forget(self)
        c._check(rv)
