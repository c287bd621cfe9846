"""Stream channels: each layer of a step handed to the daemon with two GPU stream operations
on the caller's CUDA stream (no host round trip per layer; DESIGN.md "Same-GPU sharing"), so a
decode step can be queued at once and captured in a CUDA graph.

    ch = client.stream()                        # OpenStream (daemon on this GPU, under MPS)
    q, k, v, o = (client.empty(...) ...)        # one set of buffers in registered regions
    with ch.step([(1, 1), (2, 1)], q, k, v, o) as st:   # every layer queued daemon-side
        for layer in range(L):
            ch.attend(st, layer, q_l, k_l, v_l)         # copies into q/k/v, signal, wait: o
    # StreamEnd when the block ends (the daemon ran every layer), abort when it raises

A captured step replays step after step with only StreamBegin / StreamEnd on the host, and the
caller's stream may run one step ahead, so its GPU never waits for the host between steps:

    graph.replay()                              # step k + 1, queued behind step k
    ch.end(step_k)                              # StreamEnd(k), then StreamBegin(k + 1)
    step_k1 = ch.begin(seqs, q, k, v, o)

On a CPU daemon (tests) the "stream" is the calling thread: a signal is a store, a wait polls.
A step the daemon does not see through within its timeout is released and the channel fails
(`failed`): close it and open another; the caller's stream never stalls (the library writes its
own flag words when StreamEnd fails).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from ._lib import ffi

if TYPE_CHECKING:
    from .client import Client


@dataclass(frozen=True)
class StreamStep:
    """A step queued on a stream channel, and the tensors every layer reads and writes."""

    id: int
    num_tokens: int
    query_start_loc: tuple[int, ...]
    q: Any
    k: Any
    v: Any
    out: Any


def _copy(dst: Any, src: Any) -> None:
    """dst[...] = src for a torch tensor (on its current stream) or a numpy array."""
    if hasattr(dst, "copy_"):
        dst.copy_(src)
    else:
        dst[...] = src


def _identity(x: Any) -> Any:
    """What a tensor reference depends on (the object kept alive by the cache holding it)."""
    if x is None:
        return None
    if hasattr(x, "data_ptr"):
        return (id(x), x.data_ptr(), tuple(x.shape), tuple(x.stride()), x.dtype)
    return (id(x), x.__array_interface__["data"][0], x.shape, x.strides, x.dtype)


def _view(x: Any) -> tuple[Any, ...]:
    """The memory a tensor or array names and how it reads it: address, shape, strides, dtype
    (a same-size view as another dtype holds other values, so it is not the step's tensor)."""
    return _identity(x)[1:]


def stream_ptr(stream: Any) -> Any:
    """The CUstream of a torch.cuda.Stream (None: torch's current one) as a void *."""
    if isinstance(stream, int):
        return ffi.cast("void *", stream)
    import torch

    s = torch.cuda.current_stream() if stream is None else stream
    return ffi.cast("void *", s.cuda_stream)


class StreamChannel:
    """One stream channel of a client's session (Client.stream())."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._lib = client._lib
        self.cuda = client.backend == "cuda"
        if self.cuda:  # the library allocates its flag words in this thread's CUDA context
            import torch

            torch.zeros(1, device="cuda")
        p = ffi.new("attnd_client_stream **")
        client._check(self._lib.attnd_client_stream_open(client._c, p))
        self._s: Any = p[0]
        # the last StreamBegin's arguments as C structs: a replayed step sends the same ones,
        # and building them anew costs ~100 us of Python per step
        self._last_layer: tuple[Any, Any, tuple[Any, ...]] | None = None
        self._last_seqs: tuple[tuple[tuple[int, int], ...], Any] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.attended = 0  # attend() calls
        self.copied = 0  # tensors attend() copied into a step's q/k/v (not written in place)

    @property
    def id(self) -> int:
        return int(self._lib.attnd_client_stream_id(self._s))

    @property
    def failed(self) -> bool:
        """A step was released (timeout, abort while queued, daemon gone): only close is left."""
        return self._s is not None and bool(self._lib.attnd_client_stream_failed(self._s))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._s is not None:
            self._lib.attnd_client_stream_close(self._s)
            self._s = None
        self._last_layer = self._last_seqs = None

    def __enter__(self) -> StreamChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stream(self, stream: Any) -> Any:
        return stream_ptr(stream) if self.cuda else ffi.NULL

    def begin(self, seqs: Sequence[tuple[int, int]], q: Any, k: Any, v: Any, out: Any,
              lse: Any = None) -> StreamStep:
        """StreamBegin over [(seq_id, new_tokens), ...] with one set of tensors for every layer
        (q/out [T, q_heads, head], k/v [T, kv_heads, head], lse [q_heads, T] f32 or None), in
        registered regions (device memory on a CUDA daemon): T rows of each are used. The daemon
        queues every layer's cache write and attention behind its flag word."""
        layer = self._layer(q, k, v, out, lse)
        arr = self._seqs(seqs)
        qsl = ffi.new("uint32_t[]", len(seqs) + 1)
        st = ffi.new("attnd_step *")
        self._client._check(self._lib.attnd_client_stream_begin(self._s, arr, len(seqs), layer, 1,
                                                                st, qsl))
        return StreamStep(int(st.id), int(st.num_tokens), tuple(qsl), q, k, v, out)

    def _layer(self, q: Any, k: Any, v: Any, out: Any, lse: Any) -> Any:
        key = tuple(_identity(x) for x in (q, k, v, out, lse))
        if self._last_layer is not None and self._last_layer[0] == key:
            return self._last_layer[1]
        refs = self._client._refs()
        layer = ffi.new("attnd_stream_layer *", {"q": refs(q), "k_new": refs(k), "v_new": refs(v),
                                                 "out": refs(out, True),
                                                 "out_lse": refs(lse, True)})
        # refs keeps the C refs the layer points at, the tensors keep key's ids theirs
        self._last_layer = (key, layer, (refs, q, k, v, out, lse))
        return layer

    def _seqs(self, seqs: Sequence[tuple[int, int]]) -> Any:
        key = tuple((int(s), int(n)) for s, n in seqs)
        if self._last_seqs is None or self._last_seqs[0] != key:
            self._last_seqs = (key, ffi.new("attnd_step_seq[]", [{"seq_id": s, "new_tokens": n}
                                                                 for s, n in key]))
        return self._last_seqs[1]

    def begin_async(self, seqs: Sequence[tuple[int, int]], q: Any, k: Any, v: Any, out: Any,
                    lse: Any = None) -> Future[StreamStep]:
        """begin on the channel's own thread: launch the step's work (a graph replay) while it
        travels, then take its result. If it fails, the caller's stream may already wait on the
        step: call release() (its waits pass, the outputs are garbage, the channel fails)."""
        return self._submit(self.begin, seqs, q, k, v, out, lse)

    def end_async(self, step: StreamStep | int, abort: bool = False) -> Future[None]:
        """end on the channel's own thread, in order with begin_async: a step's StreamEnd and
        the next one's StreamBegin travel while the caller queues the next step's work."""
        return self._submit(self.end, step, abort)

    def _submit(self, fn: Any, *args: Any) -> Future[Any]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"attnd-stream-{self.id}")
        return self._pool.submit(fn, *args)

    def release(self) -> None:
        """Write this side's flag words from the host: every wait queued on the caller's stream
        passes (after a StreamBegin that failed while its work was already queued)."""
        if self._s is not None:
            self._lib.attnd_client_stream_release(self._s)

    def signal(self, layer: int, stream: Any = None) -> None:
        """Queue on stream: layer's Q/K/V are in place."""
        self._client._check(self._lib.attnd_client_stream_signal(self._s, layer,
                                                                 self._stream(stream)))

    def wait(self, layer: int, stream: Any = None) -> None:
        """Queue on stream: wait for the daemon's output of layer (a CPU daemon: wait here).
        On a CUDA daemon the last layer's wait resets every layer's word: queue it after the
        step's other waits."""
        self._client._check(self._lib.attnd_client_stream_wait(self._s, layer,
                                                               self._stream(stream)))

    def attend(self, step: StreamStep, layer: int, q: Any = None, k: Any = None, v: Any = None,
               out: Any = None, *, stream: Any = None) -> Any:
        """One layer on stream (torch's current one by default): q/k/v copied into the step's
        tensors when given (they are queued on the same stream), signal, wait; returns the
        step's out (or copies it into out). Capturable in a CUDA graph."""
        pairs = [(d, s) for d, s in ((step.q, q), (step.k, k), (step.v, v))
                 if s is not None and _view(s) != _view(d)]  # not written in place already
        self.attended += 1
        self.copied += len(pairs)
        if pairs and all(hasattr(d, "copy_") for d, _ in pairs):
            import torch  # one launch for the three copies (per-tensor copies where it must)

            torch._foreach_copy_([d for d, _ in pairs], [s for _, s in pairs])
        else:
            for dst, src in pairs:
                _copy(dst, src)
        self._client._check(self._lib.attnd_client_attend_async(self._s, layer,
                                                                self._stream(stream)))
        if out is None or out is step.out:
            return step.out
        _copy(out, step.out)
        return out

    def end(self, step: StreamStep | int, abort: bool = False) -> None:
        """StreamEnd: returns once the daemon ran every layer (commit), or aborts."""
        sid = step.id if isinstance(step, StreamStep) else int(step)
        self._client._check(self._lib.attnd_client_stream_end(self._s, sid, int(abort)))

    @contextlib.contextmanager
    def step(self, seqs: Sequence[tuple[int, int]], q: Any, k: Any, v: Any, out: Any,
             lse: Any = None) -> Iterator[StreamStep]:
        """begin; end when the block ends, or abort when it raises."""
        st = self.begin(seqs, q, k, v, out, lse)
        try:
            yield st
        except BaseException:
            with contextlib.suppress(Exception):
                self.end(st, abort=True)
            raise
        self.end(st)
