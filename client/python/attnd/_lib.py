"""Loading libattnd-client through cffi (ABI mode) and checking that the declarations in
_cdef match the library that was loaded."""

from __future__ import annotations

import ctypes.util
import functools
import os
from pathlib import Path
from typing import Any, Iterator

import cffi

from ._cdef import CDEF, STRUCTS

ffi = cffi.FFI()
ffi.cdef(CDEF)

_NOT_KNOWN = (1 << (8 * ffi.sizeof("size_t"))) - 1  # (size_t)-1

LIB_ENV = "ATTND_CLIENT_LIB"
_HERE = Path(__file__).resolve().parent


class LayoutError(ImportError):
    """The loaded libattnd-client was built from a client.h that attnd._cdef does not match."""


def _candidates() -> Iterator[str]:
    env = os.environ.get(LIB_ENV)
    if env:
        yield env
        return
    bundled = _HERE / "libattnd-client.so"  # what `pip install ./client/python` puts here
    if bundled.exists():
        yield str(bundled)
    root = _HERE.parents[2]  # a source checkout: client/python/attnd -> the repository
    for build in ("build", "build-client"):
        path = root / build / "client" / "libattnd-client.so"
        if path.exists():
            yield str(path)
    found = ctypes.util.find_library("attnd-client")
    if found:
        yield found


def check_layout(lib: Any, decl: cffi.FFI = ffi) -> None:
    """Raise LayoutError naming the first struct or field whose size or offset differs between
    the declarations (_cdef's) and the library, or an enum value the library names otherwise."""
    ffi = decl
    for name in STRUCTS:
        size = lib.attnd_client_abi_offset(name.encode(), ffi.NULL)
        if size == _NOT_KNOWN or size != ffi.sizeof(name):
            raise LayoutError(f"{name}: {ffi.sizeof(name)} bytes declared in attnd._cdef, "
                              f"the library says {'unknown' if size == _NOT_KNOWN else size}")
        for field, _ in ffi.typeof(name).fields:
            off = lib.attnd_client_abi_offset(name.encode(), field.encode())
            if off != ffi.offsetof(name, field):
                raise LayoutError(f"{name}.{field}: offset {ffi.offsetof(name, field)} in "
                                  f"attnd._cdef, the library says "
                                  f"{'unknown' if off == _NOT_KNOWN else off}")
    for enum, namer, prefix in (("attnd_err", lib.attnd_err_name, "ATTND_ERR_"),
                                ("attnd_dtype", lib.attnd_dtype_name, "ATTND_DTYPE_")):
        for value, label in ffi.typeof(enum).elements.items():
            if label.endswith("_COUNT"):
                continue
            got = ffi.string(namer(value)).decode().upper()
            if prefix + got != label:
                raise LayoutError(f"{enum} {value}: {label} in attnd._cdef, the library says "
                                  f"{prefix + got}")


@functools.lru_cache(maxsize=None)
def load(path: str | None = None) -> Any:
    """The library: path, else $ATTND_CLIENT_LIB, the copy bundled in the package, a source
    checkout's build/, or the system's; its layout checked (LayoutError)."""
    tried = []
    for p in [path] if path else _candidates():
        try:
            # never unmapped: NNG threads may still call into it while the interpreter exits
            lib = ffi.dlopen(p, ffi.RTLD_NOW | ffi.RTLD_NODELETE)
        except OSError as e:
            tried.append(f"{p}: {e}")
            continue
        try:
            lib.attnd_client_abi_offset
        except AttributeError as e:
            raise LayoutError(f"{p}: no attnd_client_abi_offset (a libattnd-client older than "
                              f"this package)") from e
        check_layout(lib)
        return lib
    raise OSError(f"libattnd-client not found (set {LIB_ENV}); tried: " +
                  ("; ".join(tried) or "nothing"))
