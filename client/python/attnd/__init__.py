"""attnd: Python binding of libattnd-client (ctypes), with numpy arrays in shared memory.

    import numpy as np, attnd
    with attnd.Client("ipc:///tmp/attnd.sock") as c:
        g = c.geometry                                  # from the daemon's Hello
        region = c.region(1 << 20)                      # POSIX shm, registered with the daemon
        q = region.array((5, g["num_q_heads"], g["head_size"]), np.float32)
        ...
        c.create(1)
        step = c.begin_step([(1, 5)])
        for layer in range(g["num_layers"]):            # every layer once: EndStep commits only then
            out = c.attend(step, layer, q, k, v)        # arrays in a region travel by reference
        c.end_step(step)

Arrays that live in one of the client's regions are passed by reference (region + offset);
any other array travels INLINE in the message. float32 and float16 arrays map to f32 / f16;
uint16 arrays are read as bf16 (see to_bf16 / from_bf16). Errors raise AttndError with the
daemon's code name and message.
"""

import ctypes

import numpy as np

from . import _lib

__all__ = ["Client", "Region", "AttndError", "to_bf16", "from_bf16", "DEFAULT_URL"]

DEFAULT_URL = "ipc:///tmp/attnd.sock"
_ALIGN = 64
_NP_DTYPES = {np.dtype(np.float32): _lib.F32, np.dtype(np.float16): _lib.F16,
              np.dtype(np.uint16): _lib.BF16, np.dtype(np.int32): _lib.I32,
              np.dtype(np.int64): _lib.I64}


class AttndError(Exception):
    """A failed call: code (attnd_err value), name ("NOT_FOUND"...), the message, and whether
    the daemon sent it (remote) or the client made it (transport, timeout...)."""

    def __init__(self, code, name, message, remote):
        super().__init__(f"{name}: {message}")
        self.code, self.name, self.message, self.remote = code, name, message, remote


def to_bf16(a):
    """float32 array -> uint16 array of bf16 bits (round to nearest even)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(a), np.uint16(0x7FC0), r)


def from_bf16(b):
    """uint16 array of bf16 bits -> float32 array."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _struct_dict(s):
    out = {}
    for name, _ in s._fields_:
        v = getattr(s, name)
        if isinstance(v, ctypes.Structure):
            v = _struct_dict(v)
        elif isinstance(v, bytes):
            v = v.decode()
        out[name] = v
    if "cache_dtype" in out:
        out["cache_dtype"] = _lib.DTYPE_NAMES.get(out["cache_dtype"], "?")
    return out


class Region:
    """A POSIX shared-memory region registered with the daemon; numpy arrays are carved out of
    it with array() (64-byte aligned, bump allocation; reset() starts over)."""

    def __init__(self, client, size):
        self._client = client
        self._shm = _lib.Shm()
        client._check(client._lib.attnd_client_shm_create(client._c, size, ctypes.byref(self._shm)))
        self.id = self._shm.region
        self.size = self._shm.size
        buf = (ctypes.c_uint8 * self.size).from_address(self._shm.base)
        self._bytes = np.frombuffer(buf, dtype=np.uint8)
        self._used = 0

    @property
    def base(self):
        return self._shm.base

    def array(self, shape, dtype=np.float32):
        """A new array of this shape and dtype inside the region (uninitialised)."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        off = (self._used + _ALIGN - 1) // _ALIGN * _ALIGN
        if off + n > self.size:
            raise MemoryError(f"region {self.id}: {n} bytes do not fit ({self.size - off} left)")
        self._used = off + n
        return self._bytes[off:off + n].view(dt).reshape(shape)

    def reset(self):
        """Forget every array handed out (their memory is reused)."""
        self._used = 0

    def holds(self, a):
        p = a.__array_interface__["data"][0]
        return self._shm.base <= p and p + a.nbytes <= self._shm.base + self.size

    def close(self):
        if self._shm.base:
            self._bytes = None
            self._client._check(
                self._client._lib.attnd_client_shm_destroy(self._client._c, ctypes.byref(self._shm)))
            self._client._regions.remove(self)


class Client:
    """One connection and session (attnd_client) to url: ipc://PATH, tcp://HOST:PORT, or
    tls+tcp://HOST:PORT with tls_ca_file. Use one Client per Python thread. For ipc:// URLs the
    per-step calls go through a shared-memory channel: channel_slots (0 = default, -1 = never)
    and spin_us (how long a call spins on its reply before sleeping; 0 = default, -1 = none)."""

    def __init__(self, url=DEFAULT_URL, name="attnd-python", token=None, timeout_ms=0, lib=None,
                 tls_ca_file=None, tls_server_name=None, channel_slots=0, spin_us=0):
        self._lib = _lib.load(lib)
        self._c = ctypes.c_void_p()
        self._regions = []
        opts = _lib.Opts(name.encode(), token.encode() if token else None, timeout_ms,
                         channel_slots, spin_us)
        rv = self._lib.attnd_client_alloc(ctypes.byref(self._c), ctypes.byref(opts))
        if rv != 0:
            raise AttndError(rv, self._lib.attnd_err_name(rv).decode(), "client alloc", False)
        info = _lib.ServerInfo()
        enc = lambda x: x.encode() if x else None  # noqa: E731
        try:
            self._check(self._lib.attnd_client_set_tls(self._c, enc(tls_ca_file),
                                                       enc(tls_server_name)))
            self._check(self._lib.attnd_client_connect(self._c, url.encode(), ctypes.byref(info)))
        except AttndError:
            self._lib.attnd_client_free(self._c)
            self._c = None
            raise
        self.info = _struct_dict(info)
        self.geometry = self.info["geometry"]

    # -- plumbing
    def _check(self, rv):
        if rv == 0:
            return
        buf = ctypes.create_string_buffer(512)
        self._lib.attnd_client_last_error_copy(self._c, buf, len(buf))
        raise AttndError(rv, self._lib.attnd_err_name(rv).decode(), buf.value.decode(),
                         bool(self._lib.attnd_client_last_error_remote(self._c)))

    def close(self):
        """Destroy the regions and close the connection."""
        if self._c:
            for r in list(self._regions):
                r.close()
            self._lib.attnd_client_free(self._c)
            self._c = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- daemon and regions
    def status(self):
        st = _lib.Status()
        self._check(self._lib.attnd_client_status(self._c, ctypes.byref(st)))
        return _struct_dict(st)

    def region(self, size):
        """A new shared-memory region of size bytes, registered with the daemon."""
        r = Region(self, size)
        self._regions.append(r)
        return r

    # -- sequences and steps
    def create(self, seq_id):
        self._check(self._lib.attnd_client_seq_create(self._c, seq_id, None))

    def fork(self, parent, child):
        self._check(self._lib.attnd_client_seq_fork(self._c, parent, child, None))

    def free(self, seq_id):
        self._check(self._lib.attnd_client_seq_free(self._c, seq_id))

    def query(self, seq_id):
        info = _lib.SeqInfo()
        self._check(self._lib.attnd_client_seq_query(self._c, seq_id, ctypes.byref(info)))
        return _struct_dict(info)

    def seqs(self):
        n = ctypes.c_size_t(0)
        cap = 64
        while True:
            arr = (_lib.SeqInfo * cap)()
            self._check(self._lib.attnd_client_seq_list(self._c, arr, cap, ctypes.byref(n)))
            if n.value <= cap:
                return [_struct_dict(arr[i]) for i in range(n.value)]
            cap = n.value

    def begin_step(self, seqs):
        """seqs: [(seq_id, new_tokens), ...]. Returns a dict: id, num_tokens, query_start_loc."""
        arr = (_lib.StepSeq * len(seqs))(*[_lib.StepSeq(s, n) for s, n in seqs])
        qsl = (ctypes.c_uint32 * (len(seqs) + 1))()
        st = _lib.Step()
        self._check(self._lib.attnd_client_step_begin(self._c, arr, len(seqs), ctypes.byref(st),
                                                      qsl))
        return {"id": st.id, "num_tokens": st.num_tokens, "query_start_loc": list(qsl)}

    def end_step(self, step, abort=False):
        """Commit (every layer must have been attended once: else FAILED_PRECONDITION, and the
        step stays open) or abort (always accepted)."""
        self._check(self._lib.attnd_client_step_end(self._c, _step_id(step), 1 if abort else 0))

    # -- ops
    def _ref(self, a, output):
        """(Ref, keep-alive) for an array: by reference in a region, else INLINE."""
        ref = _lib.Ref()
        if a.dtype not in _NP_DTYPES:
            raise TypeError(f"dtype {a.dtype} not supported (float32, float16, uint16 = bf16)")
        if a.ndim > _lib.REF_MAX_DIMS or (output and not a.flags["C_CONTIGUOUS"]):
            raise ValueError("outputs must be C-contiguous with at most 4 dims")
        ref.dtype = _NP_DTYPES[a.dtype]
        ref.ndim = a.ndim
        for i, d in enumerate(a.shape):
            ref.shape[i] = d
        for r in self._regions:
            if r.holds(a):
                ref.region = r.id
                ref.offset = a.__array_interface__["data"][0] - r.base
                if not a.flags["C_CONTIGUOUS"]:
                    ref.has_strides = 1
                    for i, s in enumerate(a.strides):
                        ref.strides[i] = s // a.itemsize
                return ref, a
        keep = a if output else np.ascontiguousarray(a)
        ref.region = 0
        ref.bytes = keep.nbytes
        ptr = keep.ctypes.data_as(ctypes.c_void_p)
        if output:
            ref.out = ptr
        else:
            ref.data = ptr
        return ref, keep

    def attend(self, step, layer, q, k, v, out=None, lse=False):
        """One layer of a step. q [T, q_heads, head], k/v [T, kv_heads, head]. out: an array to
        write (in a region: by reference) or None for a new one of q's shape and dtype. lse=True
        (or an f32 array [q_heads, T]) also returns the log-sum-exp. Returns out or (out, lse)."""
        if out is None:
            out = np.empty(q.shape, dtype=q.dtype)
        lse_arr = None
        if lse is True:
            lse_arr = np.empty((q.shape[1], q.shape[0]), dtype=np.float32)
        elif lse is not False and lse is not None:
            lse_arr = lse
        keep = []
        refs = []
        for a, is_out in ((q, False), (k, False), (v, False), (out, True), (lse_arr, True)):
            if a is None:
                refs.append(None)
                continue
            r, kept = self._ref(a, is_out)
            keep.append(kept)
            refs.append(ctypes.byref(r))
            keep.append(r)
        self._check(self._lib.attnd_client_attend(self._c, _step_id(step), layer, *refs))
        return out if lse_arr is None else (out, lse_arr)


def _step_id(step):
    return step["id"] if isinstance(step, dict) else int(step)
