"""attnd.Client: one connection and session to a daemon, its regions, sequences, steps and
ops."""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from . import dtypes
from ._lib import ffi, load
from .errors import AttndError
from .refs import Refs, view_of
from .region import CudaRegion, Region, ShmRegion

if TYPE_CHECKING:
    from .stream import StreamChannel

DEFAULT_URL = "ipc:///tmp/attnd.sock"
SPIN_ENV = "ATTND_SPIN_US"
# Backends whose kernels run on this host's cores: a client spinning on its reply takes a core
# from them, so it sleeps at once (measured: a CPU-backend daemon beside a torch engine ran
# 2-3x slower with the library's default 2 ms spin).
_HOST_BACKENDS = ("cpu",)


_open_clients: weakref.WeakSet[Client] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Close what is still open before the interpreter tears modules down."""
    for c in list(_open_clients):
        c.close()


@dataclass(frozen=True)
class Step:
    """An open step: its id, the rows of Q/K/V of each Attend (num_tokens) and where each
    sequence's rows start (query_start_loc, len(seqs) + 1 entries)."""

    id: int
    num_tokens: int
    query_start_loc: tuple[int, ...]
    seqs: tuple[tuple[int, int], ...]

    def rows(self, i: int) -> slice:
        """Rows of the i-th sequence of the step."""
        return slice(self.query_start_loc[i], self.query_start_loc[i + 1])


def choose_spin_us(backend: str, spin_us: int | None = None) -> int:
    """The channel spin for a daemon of this backend: spin_us when given, else $ATTND_SPIN_US,
    else -1 (sleep at once) for host backends ("cpu") and 0 (the library's 2 ms) otherwise."""
    if spin_us is not None:
        return spin_us
    env = os.environ.get(SPIN_ENV)
    if env:
        return int(env)
    return -1 if backend in _HOST_BACKENDS else 0


def _floats(p: Any, n: int) -> list[float]:
    return [float(p[i]) for i in range(n)]


def _layers_list(g: Any) -> list[dict[str, Any]]:
    """A geometry's per-layer options (as attnd.config.resolve_layer writes them)."""
    if g.layers == ffi.NULL:
        return []
    out = []
    for i in range(g.num_layers):
        lay = g.layers[i]
        out.append({
            "sliding_window": int(lay.sliding_window), "softcap": float(lay.softcap),
            "scale": float(lay.scale),
            "alibi_slopes": _floats(lay.alibi_slopes, lay.num_alibi_slopes) if lay.alibi
            else False,
            "sinks": _floats(lay.sinks, lay.num_sinks) if lay.num_sinks else None,
            "k_scale": float(lay.k_scale), "v_scale": float(lay.v_scale)})
    return out


def _expect_cdata(expect: dict[str, Any]) -> tuple[Any, list[Any]]:
    """An attnd_expect for a dict of attnd.config.expectation's form (keys left out are not
    compared), and the cffi objects it points into."""
    layers = expect.get("layers") or []
    keep: list[Any] = [ffi.new("attnd_layer_opts[]", max(len(layers), 1))]
    for i, lay in enumerate(layers):
        a = lay.get("alibi_slopes", False)
        slopes = list(a) if isinstance(a, (list, tuple)) else []
        sinks = list(lay.get("sinks") or [])
        keep += [ffi.new("float[]", slopes or [0.0]), ffi.new("float[]", sinks or [0.0])]
        o = keep[0][i]
        o.sliding_window = int(lay.get("sliding_window", 0))
        o.softcap, o.scale = float(lay.get("softcap", 0.0)), float(lay.get("scale", 0.0))
        o.k_scale, o.v_scale = float(lay.get("k_scale", 0.0)), float(lay.get("v_scale", 0.0))
        o.alibi = int(a is not False and a is not None)
        o.num_alibi_slopes, o.alibi_slopes = len(slopes), keep[-2]
        o.num_sinks, o.sinks = len(sinks), keep[-1]
    dt = expect.get("cache_dtype")
    e = ffi.new("attnd_expect *", {
        **{k: int(expect.get(k, 0)) for k in ("num_layers", "num_q_heads", "num_kv_heads",
                                               "head_size", "block_size")},
        "compare_cache_dtype": int(bool(dt)), "cache_dtype": dtypes.CODES[dt] if dt else 0,
        "num_layer_opts": len(layers),
        "layer_opts": keep[0]})
    return e, keep


def _struct_dict(s: Any, ctype: Any = None) -> dict[str, Any]:
    ctype = ctype or ffi.typeof(s)
    out: dict[str, Any] = {}
    for name, field in ctype.fields:
        v = getattr(s, name)
        if field.type.kind == "struct":
            v = _struct_dict(v, field.type)
        elif field.type.kind == "array" and field.type.item.cname == "char":
            v = ffi.string(v).decode()
        elif field.type.kind == "pointer":
            v = _layers_list(s) if name == "layers" else None
        out[name] = v
    if "cache_dtype" in out:
        out["cache_dtype"] = dtypes.NAMES.get(out["cache_dtype"], "?")
    return out


def _step_id(step: Step | int) -> int:
    return step.id if isinstance(step, Step) else int(step)


class Client:
    """One connection and session to the daemon at url (ipc://PATH, tcp://HOST:PORT, or
    tls+tcp://HOST:PORT with tls_ca_file); url and token default to $ATTND_URL / $ATTND_TOKEN.
    On ipc:// the per-step calls go through a shared-memory channel (channel_slots: 0 = the
    library's default, -1 = never). spin_us: how long a call spins on its channel reply before
    sleeping (-1 = sleep at once); None picks it from the daemon's backend (choose_spin_us).
    expect: the geometry this client needs (attnd.config.expectation(geometry)); the daemon
    refuses a Hello whose geometry differs (AttndError FAILED_PRECONDITION naming the first
    difference), so a client never runs against a daemon configured for another model."""

    def __init__(self, url: str | None = None, *, name: str = "attnd-python",
                 token: str | None = None, timeout_ms: int = 0, lib: str | None = None,
                 tls_ca_file: str | None = None, tls_server_name: str | None = None,
                 channel_slots: int = 0, spin_us: int | None = None,
                 expect: dict[str, Any] | None = None) -> None:
        self.expect = expect
        self.url = url or os.environ.get("ATTND_URL") or DEFAULT_URL
        token = token if token is not None else os.environ.get("ATTND_TOKEN") or None
        self._lib = load(lib)
        self._c: Any = None
        self._regions: list[Region] = []
        self._lock = threading.Lock()
        self._strings = [ffi.new("char[]", name.encode()),
                         ffi.new("char[]", token.encode()) if token else ffi.NULL]
        opts = ffi.new("attnd_client_opts *", {"name": self._strings[0],
                                                "token": self._strings[1],
                                                "timeout_ms": timeout_ms, "channel_slots": -1})
        cp = ffi.new("attnd_client **")
        rv = self._lib.attnd_client_alloc(cp, opts)
        if rv != 0:
            raise AttndError(rv, ffi.string(self._lib.attnd_err_name(rv)).decode(),
                             "client alloc", False)
        self._c = cp[0]
        _open_clients.add(self)
        try:
            self._connect(tls_ca_file, tls_server_name, channel_slots, spin_us)
        except BaseException:
            self._lib.attnd_client_free(self._c)
            self._c = None
            raise

    def _connect(self, ca: str | None, server_name: str | None, slots: int,
                 spin_us: int | None) -> None:
        enc = lambda s: s.encode() if s else ffi.NULL  # noqa: E731
        info = ffi.new("attnd_server_info *")
        self._check(self._lib.attnd_client_set_tls(self._c, enc(ca), enc(server_name)))
        if self.expect is not None:
            e, keep = _expect_cdata(self.expect)
            self._check(self._lib.attnd_client_set_expect(self._c, e))
            del keep  # the library keeps its own copy
        self._check(self._lib.attnd_client_dial(self._c, self.url.encode()))
        self._check(self._lib.attnd_client_hello(self._c, info))
        self.info = _struct_dict(info[0])
        self.geometry: dict[str, Any] = self.info["geometry"]
        self.limits: dict[str, Any] = self.info["limits"]
        self.backend: str = self.info["backend"]
        self.spin_us = choose_spin_us(self.backend, spin_us)
        self._lib.attnd_client_set_spin(self._c, self.spin_us)
        self.channel_error = ""
        if self.url.startswith("ipc://") and slots >= 0:
            if self._lib.attnd_client_channel_open(self._c, slots) != 0:
                self.channel_error = ffi.string(self._lib.attnd_client_last_error(self._c)).decode()

    # ------------------------------------------------------------------ plumbing
    def _check(self, rv: int) -> None:
        if rv == 0:
            return
        buf = ffi.new("char[512]")
        if self._c is not None:
            self._lib.attnd_client_last_error_copy(self._c, buf, len(buf))
        remote = self._c is not None and bool(self._lib.attnd_client_last_error_remote(self._c))
        raise AttndError(rv, ffi.string(self._lib.attnd_err_name(rv)).decode(),
                         ffi.string(buf).decode(), remote)

    def _forget(self, region: Region) -> None:
        with self._lock:
            if region in self._regions:
                self._regions.remove(region)

    def _refs(self) -> Refs:
        with self._lock:
            return Refs(self._regions)

    def stream(self) -> StreamChannel:
        """A stream channel (same GPU as the daemon, under MPS): per-layer handoffs as GPU
        stream operations (attnd.stream)."""
        from .stream import StreamChannel

        return StreamChannel(self)

    @property
    def channel_active(self) -> bool:
        """True while per-step calls go through the shared-memory channel."""
        return self._c is not None and bool(self._lib.attnd_client_channel_active(self._c))

    def close(self) -> None:
        """Release the regions and close the connection (the daemon frees the session)."""
        if self._c is None:
            return
        for r in list(self._regions):
            with contextlib.suppress(AttndError):
                r.close()
        self._lib.attnd_client_free(self._c)
        self._c = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # ------------------------------------------------------------------ daemon and regions
    def status(self) -> dict[str, Any]:
        """The daemon's StatusReply as a dict."""
        st = ffi.new("attnd_status *")
        self._check(self._lib.attnd_client_status(self._c, st))
        return _struct_dict(st[0])

    def _add(self, region: Region) -> Region:
        with self._lock:
            self._regions.append(region)
        return region

    def region(self, size: int) -> ShmRegion:
        """A new shared-memory region of size bytes, registered; carve it with array() (numpy)
        or tensor() (CPU torch)."""
        r = ShmRegion(self, size)
        self._add(r)
        return r

    def region_from_tensor(self, t: Any) -> CudaRegion:
        """Register the CUDA buffer behind torch tensor t by CUDA IPC, once: afterwards every
        tensor viewing it passes by reference (offset + strides). CPU tensors cannot be
        registered after the fact: make them in a region (region(size).tensor(...))."""
        if not dtypes.is_torch_tensor(t) or t.device.type != "cuda":
            raise TypeError("region_from_tensor takes a torch CUDA tensor; CPU tensors live in "
                            "shared memory: client.region(size).tensor(shape, dtype)")
        r = CudaRegion(self, t)
        self._add(r)
        return r

    def alloc(self, nbytes: int, device: Any = "cpu") -> Region:
        """A registered region of nbytes on device ("cpu": shared memory, "cuda[:N]": a torch
        CUDA buffer by IPC); carve it with tensor() (or array() for cpu)."""
        dev = str(device)
        if dev == "cpu":
            return self.region(nbytes)
        r = CudaRegion.allocate(self, nbytes, dev)
        self._add(r)
        return r

    def empty(self, shape: tuple[int, ...], dtype: Any, device: Any = "cpu") -> Any:
        """A torch tensor in a region of its own (registered, zero copy afterwards)."""
        n = int(np.prod(shape)) * dtypes.ITEMSIZE[dtypes.from_torch(dtype)]
        return self.alloc(max(n, 1), device).tensor(shape, dtype)

    # ------------------------------------------------------------------ sequences and steps
    def create(self, seq_id: int) -> None:
        self._check(self._lib.attnd_client_seq_create(self._c, seq_id, ffi.NULL))

    def fork(self, parent: int, child: int) -> None:
        """child shares parent's blocks (copy-on-write of a partial last block)."""
        self._check(self._lib.attnd_client_seq_fork(self._c, parent, child, ffi.NULL))

    def free(self, seq_id: int) -> None:
        self._check(self._lib.attnd_client_seq_free(self._c, seq_id))

    def truncate(self, seq_id: int, tokens: int) -> dict[str, Any]:
        """Drop the last `tokens` tokens of a sequence (speculative decoding's rollback); its
        info afterwards."""
        info = ffi.new("attnd_seq_info *")
        self._check(self._lib.attnd_client_seq_truncate(self._c, seq_id, tokens, info))
        return _struct_dict(info[0])

    def query(self, seq_id: int) -> dict[str, Any]:
        info = ffi.new("attnd_seq_info *")
        self._check(self._lib.attnd_client_seq_query(self._c, seq_id, info))
        return _struct_dict(info[0])

    def seqs(self) -> list[dict[str, Any]]:
        """This session's sequences."""
        n, cap = ffi.new("size_t *"), 64
        while True:
            arr = ffi.new("attnd_seq_info[]", cap)
            self._check(self._lib.attnd_client_seq_list(self._c, arr, cap, n))
            if n[0] <= cap:
                return [_struct_dict(arr[i]) for i in range(n[0])]
            cap = n[0]

    def begin_step(self, seqs: Sequence[tuple[int, int]]) -> Step:
        """BeginStep over [(seq_id, new_tokens), ...]: Q/K/V rows are their new tokens, in order."""
        arr = ffi.new("attnd_step_seq[]", [{"seq_id": s, "new_tokens": n} for s, n in seqs])
        qsl = ffi.new("uint32_t[]", len(seqs) + 1)
        st = ffi.new("attnd_step *")
        self._check(self._lib.attnd_client_step_begin(self._c, arr, len(seqs), st, qsl))
        return Step(int(st.id), int(st.num_tokens), tuple(qsl), tuple((s, n) for s, n in seqs))

    def end_step(self, step: Step | int, abort: bool = False) -> None:
        """EndStep: commit (every layer attended exactly once), or abort."""
        self._check(self._lib.attnd_client_step_end(self._c, _step_id(step), int(abort)))

    @contextlib.contextmanager
    def step(self, seqs: Sequence[tuple[int, int]]) -> Iterator[Step]:
        """BeginStep; EndStep when the block ends, or abort when it raises."""
        st = self.begin_step(seqs)
        try:
            yield st
        except BaseException:
            with contextlib.suppress(AttndError):
                self.end_step(st, abort=True)
            raise
        self.end_step(st)

    # ------------------------------------------------------------------ ops
    def _sync(self, refs: Refs) -> None:
        """Work queued on a CUDA stream for these tensors must land before the daemon reads."""
        if any(dtypes.is_torch_tensor(x) and x.is_cuda for x in refs.keep):
            import torch

            torch.cuda.current_stream().synchronize()

    def attend(self, step: Step | int, layer: int, q: Any, k: Any, v: Any, out: Any = None,
               lse: Any = False) -> Any:
        """One layer of a step: k/v [T, kv_heads, head] into the cache, paged attention of q
        [T, q_heads, head] into out (a new CPU array/tensor like q when None: INLINE). lse=True
        (or an f32 [q_heads, T] array/tensor) also returns the log-sum-exp: (out, lse)."""
        out = _like(q) if out is None else out
        lse_out = _new_f32(q, (q.shape[1], q.shape[0])) if lse is True else _given(lse)
        refs = self._refs()
        args = (refs(q), refs(k), refs(v), refs(out, True), refs(lse_out, True))
        self._sync(refs)
        self._check(self._lib.attnd_client_attend(self._c, _step_id(step), layer, *args))
        return out if lse_out is None else (out, lse_out)

    def merge(self, prefix_out: Any, prefix_lse: Any, suffix_out: Any, suffix_lse: Any,
              out: Any = None, out_lse: Any = False) -> Any:
        """MergeStates of two partial outputs [T, H, D] with their LSE [H, T] (f32)."""
        out = _like(prefix_out) if out is None else out
        lse_out = (_new_f32(prefix_lse, tuple(prefix_lse.shape)) if out_lse is True
                   else _given(out_lse))
        refs = self._refs()
        a = ffi.new("attnd_merge_args *", {
            "out": refs(out, True), "out_lse": refs(lse_out, True),
            "prefix_out": refs(prefix_out), "prefix_lse": refs(prefix_lse),
            "suffix_out": refs(suffix_out), "suffix_lse": refs(suffix_lse)})
        self._sync(refs)
        self._check(self._lib.attnd_client_merge(self._c, a))
        return out if lse_out is None else (out, lse_out)

    def varlen(self, q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, *,
               causal: bool = True, scale: float = 0.0, bias: Any = None, out: Any = None,
               max_seqlen_q: int = 0, max_seqlen_k: int = 0, q_scale: float = 0.0,
               k_scale: float = 0.0, v_scale: float = 0.0, p_scale: float = 0.0,
               out_scale: float = 0.0) -> Any:
        """VarlenAttention over packed q [Tq, Hq, D], k/v [Tk, Hk, D] (f16/bf16/fp8) with
        cu_seqlens (i32, batch + 1); causal is bottom-right aligned. 0 = default for scales and
        max lengths. out: f32/f16/bf16/fp8 [Tq, Hq, D] (a new f32 CPU one when None)."""
        out = _new_f32(q, tuple(q.shape)) if out is None else out
        refs = self._refs()
        a = ffi.new("attnd_varlen_args *", {
            "q": refs(q), "k": refs(k), "v": refs(v), "out": refs(out, True),
            "cu_seqlens_q": refs(cu_seqlens_q), "cu_seqlens_k": refs(cu_seqlens_k),
            "bias": refs(bias), "max_seqlen_q": max_seqlen_q, "max_seqlen_k": max_seqlen_k,
            "causal": int(causal), "scale": scale, "q_scale": q_scale, "k_scale": k_scale,
            "v_scale": v_scale, "p_scale": p_scale, "out_scale": out_scale})
        self._sync(refs)
        self._check(self._lib.attnd_client_varlen(self._c, a))
        return out

    def blocksparse(self, q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
                    layout_crow: Any, layout_col: Any, *, block_size: int,
                    q_block_size: int = 0, scale: float = 0.0, out: Any = None,
                    max_seqlen_q: int = 0, max_seqlen_k: int = 0) -> Any:
        """BlocksparseAttention: varlen-shaped f16/bf16 inputs, a per-head CSR block layout
        (layout_crow [H, rows + 1], layout_col [H, nnz], i32). out: f32/f16/bf16."""
        out = _new_f32(q, tuple(q.shape)) if out is None else out
        refs = self._refs()
        a = ffi.new("attnd_blocksparse_args *", {
            "q": refs(q), "k": refs(k), "v": refs(v), "out": refs(out, True),
            "cu_seqlens_q": refs(cu_seqlens_q), "cu_seqlens_k": refs(cu_seqlens_k),
            "layout_crow": refs(layout_crow), "layout_col": refs(layout_col),
            "block_size": block_size, "q_block_size": q_block_size,
            "max_seqlen_q": max_seqlen_q, "max_seqlen_k": max_seqlen_k, "scale": scale})
        self._sync(refs)
        self._check(self._lib.attnd_client_blocksparse(self._c, a))
        return out

    def _linear(self, fn: Any, layer: int, seq_ids: Sequence[int], q: Any, k: Any, v: Any,
                slopes: Sequence[float], out: Any, block_size: int) -> Any:
        out = _like(q) if out is None else out
        ids = ffi.new("uint64_t[]", [int(s) for s in seq_ids])
        sl = ffi.new("float[]", [float(s) for s in slopes])
        refs = self._refs()
        a = ffi.new("attnd_linear_args *", {
            "layer": layer, "seq_ids": ids, "batch": len(seq_ids), "q": refs(q), "k": refs(k),
            "v": refs(v), "out": refs(out, True), "slopes": sl, "num_slopes": len(slopes),
            "block_size": block_size})
        self._sync(refs)
        self._check(fn(self._c, a))
        return out

    def linear_prefill(self, layer: int, seq_ids: Sequence[int], q: Any, k: Any, v: Any,
                       slopes: Sequence[float], out: Any = None, block_size: int = 0) -> Any:
        """LinearPrefill against each sequence's daemon-held state: q/k/v/out [B, H, n, d]."""
        return self._linear(self._lib.attnd_client_linear_prefill, layer, seq_ids, q, k, v,
                            slopes, out, block_size)

    def linear_decode(self, layer: int, seq_ids: Sequence[int], q: Any, k: Any, v: Any,
                      slopes: Sequence[float], out: Any = None) -> Any:
        """LinearDecode: q/k/v/out [B, H, d]; a seq_id of 0 is padding (zeros out)."""
        return self._linear(self._lib.attnd_client_linear_decode, layer, seq_ids, q, k, v,
                            slopes, out, 0)


def _given(x: Any) -> Any:
    """An output the caller passed, or None for False / None."""
    return None if x is None or x is False else x


def _like(x: Any) -> Any:
    """A new CPU array/tensor of x's shape and dtype (an INLINE output)."""
    if isinstance(x, np.ndarray):
        return np.empty(x.shape, dtype=x.dtype)
    v = view_of(x)
    if v.device != "cpu":
        raise ValueError("pass out= for CUDA tensors (a tensor in a registered region, e.g. "
                         "client.empty(shape, dtype, device))")
    return x.new_empty(x.shape)


def _new_f32(x: Any, shape: tuple[int, ...]) -> Any:
    """A new CPU f32 array (numpy inputs) or tensor (torch inputs) of shape."""
    if isinstance(x, np.ndarray):
        return np.empty(shape, dtype=np.float32)
    import torch

    if x.device.type != "cpu":
        raise ValueError("pass the output explicitly for CUDA tensors (in a registered region)")
    return torch.empty(shape, dtype=torch.float32)
