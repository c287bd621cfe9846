#!/usr/bin/env python3
"""Write the seed corpus of fuzz_request (fuzz/corpus/*.bin): small valid and invalid request
sequences for the daemon's decode + validation + dispatch path.

An input is a sequence of frames: u8 flags, u16 little-endian length, then that many bytes of an
attnd.Request (proto/attnd.proto). flags bit 0 picks the connection (pipe 1 or 2), bit 1 closes
that connection after the frame; with bit 2 the bytes are written into the harness's shm object
b[0] & 1 at offset b[1] | b[2] << 8 (b[3..]), with bit 3 the Request is posted in channel slot
(flags & 1). In a frame, session 1..4 means "the session of the 1st..4th successful Hello" and
step 1..4 "the 1st..4th step begun", so seeds reach past the handshake whatever ids the daemon
hands out; RegisterRegion names "/0" and "/1" are the harness's two 64 KiB objects (object 0
starts as an i32 ramp 0, 1, 2..., object 1 as zeros), OpenChannel "/c" with size 0 its channel
(2 slots). The harness's geometry (fuzz_request.c): 2 layers, 4 q heads, 2 kv heads, head size
32, block size 16, f16 cache.

Protobuf is encoded by hand here (no dependency); run from anywhere:
    python3 fuzz/gen_corpus.py            # rewrites fuzz/corpus/
"""
import os
import struct
import sys

# ---------------------------------------------------------------- protobuf wire format


def varint(n):
    n &= (1 << 64) - 1  # negative int64 as two's complement, ten bytes
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(num, v):
    return varint(num << 3) + varint(v)


def f_bytes(num, b):
    if isinstance(b, str):
        b = b.encode()
    return varint((num << 3) | 2) + varint(len(b)) + b


def f_float(num, x):
    return varint((num << 3) | 5) + struct.pack("<f", x)


def f_packed(num, values):
    return f_bytes(num, b"".join(varint(v) for v in values))


# ---------------------------------------------------------------- attnd messages

F32, F16, BF16, FP8, I32, I64 = range(6)
LAYERS, QH, KVH, D, BS = 2, 4, 2, 32, 16
DSIZE = {F32: 4, F16: 2, BF16: 2, FP8: 1, I32: 4, I64: 8}


def tensor(shape, dtype=F32, region=0, offset=0, strides=None, data=None, fill=True):
    """A TensorRef; INLINE (region 0) inputs carry data (zeros of the right size by default)."""
    m = b""
    if region:
        m += f_varint(1, region)
    if offset:
        m += f_varint(2, offset)
    if dtype:
        m += f_varint(3, dtype)
    m += f_packed(4, shape)
    if strides is not None:
        m += f_packed(5, strides)
    if data is None and fill and region == 0:
        n = 1
        for s in shape:
            n *= max(s, 0)
        data = bytes(n * DSIZE[dtype])
        # a few non-zero values so the math is not trivially zero
        data = bytes((i * 37) & 0x3F for i in range(len(data)))
    if data:
        m += f_bytes(6, data)
    return m


def request(rid, body_field, body, session=0):
    m = f_varint(1, rid)
    if session:
        m += f_varint(2, session)
    return m + f_bytes(body_field, body)


def hello(rid=1, version=1, name="fuzz", token=None):
    b = f_varint(1, version) + f_bytes(2, name)
    if token is not None:
        b += f_bytes(3, token)
    return request(rid, 10, b)


def hello_expect(rid=1, layers=2, window=0, sinks=None):
    """Hello with an expected geometry (Hello.expect): the shape and one layer pattern."""
    sink_bytes = struct.pack("<%df" % len(sinks), *sinks) if sinks else b""
    lay = f_varint(1, window) + (f_bytes(6, sink_bytes) if sinks else b"")
    expect = f_varint(1, layers) + f_varint(2, 4) + f_bytes(7, lay)
    return request(rid, 10, f_varint(1, 1) + f_bytes(2, "fuzz") + f_bytes(4, expect))


def truncate(rid, seq, tokens, session=1):
    return request(rid, 30, f_varint(1, seq) + f_varint(2, tokens), session)


def create(rid, seq, session=1):
    return request(rid, 13, f_varint(1, seq), session)


def fork(rid, parent, child, session=1):
    return request(rid, 14, f_varint(1, parent) + f_varint(2, child), session)


def free(rid, seq, session=1):
    return request(rid, 15, f_varint(1, seq), session)


def query(rid, seq, session=1):
    return request(rid, 16, f_varint(1, seq), session)


def list_seqs(rid, session=1):
    return request(rid, 17, b"", session)


def begin_step(rid, seqs, session=1):
    body = b"".join(f_bytes(1, f_varint(1, s) + f_varint(2, n)) for s, n in seqs)
    return request(rid, 18, body, session)


def attend(rid, step, layer, ntok, session=1, q=None, k=None, v=None, out=None, lse=None):
    q = q if q is not None else tensor([ntok, QH, D])
    k = k if k is not None else tensor([ntok, KVH, D])
    v = v if v is not None else tensor([ntok, KVH, D])
    out = out if out is not None else tensor([ntok, QH, D], fill=False)
    body = f_varint(1, step) + f_varint(2, layer) + f_bytes(3, q) + f_bytes(4, k)
    body += f_bytes(5, v) + f_bytes(6, out)
    if lse is not None:
        body += f_bytes(7, lse)
    return request(rid, 19, body, session)


def end_step(rid, step, abort=False, session=1):
    return request(rid, 20, f_varint(1, step) + (f_varint(2, 1) if abort else b""), session)


def merge(rid, n, session=1):
    o = tensor([n, QH, D], fill=False)
    lse = tensor([QH, n], fill=False)
    body = f_bytes(1, o) + f_bytes(2, lse) + f_bytes(3, tensor([n, QH, D]))
    body += f_bytes(4, tensor([QH, n])) + f_bytes(5, tensor([n, QH, D])) + f_bytes(6, tensor([QH, n]))
    return request(rid, 21, body, session)


def varlen(rid, n, session=1):
    cu = tensor([2], I32, data=struct.pack("<2i", 0, n))
    body = f_bytes(1, tensor([n, QH, D], F16)) + f_bytes(2, tensor([n, KVH, D], F16))
    body += f_bytes(3, tensor([n, KVH, D], F16)) + f_bytes(4, tensor([n, QH, D], F16, fill=False))
    body += f_bytes(5, cu) + f_bytes(6, cu) + f_varint(8, n) + f_varint(9, n) + f_varint(10, 1)
    return request(rid, 22, body, session)


def register_shm(rid, region, name, size, session=1):
    body = f_varint(1, region) + f_varint(2, 0) + f_bytes(3, name) + f_varint(4, size)
    return request(rid, 11, body, session)


def register_ipc(rid, region, handle, size, session=1):
    body = f_varint(1, region) + f_varint(2, 1) + f_varint(4, size) + f_bytes(5, handle)
    return request(rid, 11, body, session)


def status(rid=1):
    return request(rid, 26, b"")


def open_channel(rid, name="/c", size=0, session=1):
    return request(rid, 27, f_bytes(1, name) + (f_varint(2, size) if size else b""), session)


def frame(msg, pipe=1, close=False):
    flags = (pipe - 1) & 1 | (2 if close else 0)
    return struct.pack("<BH", flags, len(msg)) + msg


def post(msg, slot=0):
    """A Request posted in channel slot `slot`."""
    return struct.pack("<BH", 8 | (slot & 1), len(msg)) + msg


def shm_write(obj, offset, data):
    """Bytes written into the harness's shm object obj at offset, between requests."""
    payload = struct.pack("<BH", obj, offset) + data
    return struct.pack("<BH", 4, len(payload)) + payload


# ---------------------------------------------------------------- tensors in the shm objects
# region 1 = object 0 (i32 ramp: cu_seqlens [0, 1, 2, 3] at offset 0, layouts at 1024),
# region 2 = object 1 (zeros: q at 0, k at 1024, v at 2048, out at 4096; 3 rows, f16)

T3 = 3


def shm_qkvo(out_offset=4096, out_region=2):
    q = tensor([T3, QH, D], F16, region=2, offset=0)
    k = tensor([T3, KVH, D], F16, region=2, offset=1024)
    v = tensor([T3, KVH, D], F16, region=2, offset=2048)
    o = tensor([T3, QH, D], F16, region=out_region, offset=out_offset)
    return f_bytes(1, q) + f_bytes(2, k) + f_bytes(3, v) + f_bytes(4, o)


def shm_varlen(rid, out_offset=4096, out_region=2, session=1):
    cu = tensor([T3 + 1], I32, region=1, offset=0)
    body = shm_qkvo(out_offset, out_region) + f_bytes(5, cu) + f_bytes(6, cu) + f_varint(10, 1)
    return request(rid, 22, body, session)


def shm_blocksparse(rid, session=1):
    cu = tensor([T3 + 1], I32, region=1, offset=0)
    crow = tensor([QH, 2], I32, region=1, offset=1024)
    col = tensor([QH, 1], I32, region=1, offset=2048)
    body = shm_qkvo() + f_bytes(5, cu) + f_bytes(6, cu) + f_bytes(7, crow) + f_bytes(8, col)
    body += f_varint(9, BS)
    return request(rid, 23, body, session)


def shm_attend(rid, step, layer, out_offset=4096, session=1):
    q = tensor([T3, QH, D], F16, region=2, offset=0)
    k = tensor([T3, KVH, D], F16, region=2, offset=1024)
    v = tensor([T3, KVH, D], F16, region=2, offset=2048)
    o = tensor([T3, QH, D], F16, region=2, offset=out_offset)
    return attend(rid, step, layer, T3, session, q=q, k=k, v=v, out=o)


def shm_setup():
    """Hello, both objects registered, a valid block-sparse layout written into object 0."""
    layout = shm_write(0, 1024, struct.pack("<8i", *([0, 1] * QH)))
    layout += shm_write(0, 2048, struct.pack("<4i", 0, 0, 0, 0))
    return [frame(hello()), frame(register_shm(2, 1, "/0", 65536)),
            frame(register_shm(3, 2, "/1", 65536)), layout]


# ---------------------------------------------------------------- seeds

HUGE = 1 << 62


def seeds():
    s = {}
    s["status"] = [frame(status())]
    s["hello"] = [frame(hello())]
    s["hello_bad_version"] = [frame(hello(version=99))]
    s["hello_token"] = [frame(hello(token="not-the-token"))]
    s["sequence_lifecycle"] = [frame(hello()), frame(create(2, 7)), frame(query(3, 7)),
                               frame(list_seqs(4)), frame(fork(5, 7, 8)), frame(free(6, 8)),
                               frame(free(7, 7)), frame(free(8, 7))]
    s["step_prefill_decode"] = [
        frame(hello()), frame(create(2, 1)), frame(create(3, 2)),
        frame(begin_step(4, [(1, 3), (2, 1)])),
        frame(attend(5, 1, 0, 4)), frame(attend(6, 1, 1, 4)), frame(end_step(7, 1)),
        frame(begin_step(8, [(1, 1), (2, 1)])), frame(attend(9, 2, 0, 2)),
        frame(attend(10, 2, 1, 2, lse=tensor([QH, 2], fill=False))), frame(end_step(11, 2))]
    s["step_abort"] = [frame(hello()), frame(create(2, 1)), frame(begin_step(3, [(1, 17)])),
                       frame(attend(4, 1, 0, 17)), frame(end_step(5, 1, abort=True)),
                       frame(query(6, 1))]
    s["step_errors"] = [frame(hello()), frame(create(2, 1)), frame(begin_step(3, [(1, 2), (1, 2)])),
                        frame(begin_step(4, [(9, 1)])), frame(begin_step(5, [(1, 0)])),
                        frame(begin_step(6, [(1, 2)])), frame(attend(7, 1, 5, 2)),
                        frame(attend(8, 1, 0, 3)), frame(attend(9, 99, 0, 2)),
                        frame(end_step(10, 99)), frame(end_step(11, 1)), frame(end_step(12, 1))]
    s["two_clients"] = [frame(hello(), 1), frame(hello(2, name="other"), 2),
                        frame(create(3, 5, session=1), 1), frame(free(4, 5, session=2), 2),
                        frame(query(5, 5, session=1), 2), frame(begin_step(6, [(5, 1)], session=2), 2),
                        frame(query(7, 5, session=1), 1, close=True), frame(list_seqs(8, session=2), 2)]
    s["disconnect_mid_step"] = [frame(hello()), frame(create(2, 1)), frame(begin_step(3, [(1, 4)])),
                                frame(attend(4, 1, 0, 4), close=True), frame(hello(5), 2),
                                frame(status(6), 2)]
    s["hostile_shapes"] = [
        frame(hello()), frame(create(2, 1)), frame(begin_step(3, [(1, 1)])),
        frame(attend(4, 1, 0, 1, q=tensor([HUGE, HUGE, 4], fill=False))),
        frame(attend(5, 1, 0, 1, q=tensor([1, QH, D], strides=[HUGE, HUGE, HUGE]))),
        frame(attend(6, 1, 0, 1, q=tensor([-1, QH, D], fill=False))),
        frame(attend(7, 1, 0, 1, q=tensor([1, 1, 1, 1, 1, 1, 1, 1, 1, 1], fill=False))),
        frame(attend(8, 1, 0, 1, out=tensor([1, QH, D], region=1, offset=HUGE, fill=False))),
        frame(attend(9, 1, 0, 1, q=tensor([1, QH, D], dtype=FP8))),
        frame(attend(10, 1, 0, 1, q=tensor([1, QH, D], data=b"\x00" * 7))),
        frame(begin_step(11, [(1, 0xFFFFFFFF)])),
        frame(end_step(12, 1))]
    s["regions"] = [frame(hello()), frame(register_shm(2, 1, "/attnd-fuzz-missing", 4096)),
                    frame(register_shm(3, 2, "../../etc/passwd", 1 << 63)),
                    frame(register_shm(4, 0, "", 0)), frame(register_ipc(5, 3, b"\x01" * 64, 4096)),
                    frame(register_ipc(6, 4, b"\x01" * 3, 4096)),
                    frame(request(7, 12, f_varint(1, 1), 1)), frame(request(8, 12, f_varint(1, 77), 1))]
    s["hello_expect"] = [frame(hello_expect(1, 3)), frame(hello_expect(2, 2, 7)),
                         frame(hello_expect(3, 2, 0, [0.5, 1.0, 2.0, 3.0])),
                         frame(hello_expect(4))]
    s["truncate"] = [frame(hello()), frame(create(2, 1)), frame(begin_step(3, [(1, 20)])),
                     frame(attend(4, 1, 0, 20)), frame(attend(5, 1, 1, 20)),
                     frame(end_step(6, 1)), frame(truncate(7, 1, 5)), frame(truncate(8, 1, 99)),
                     frame(fork(9, 1, 2)), frame(truncate(10, 2, 15)), frame(truncate(11, 3, 1))]
    s["merge_varlen"] = [frame(hello()), frame(merge(2, 3)), frame(varlen(3, 5))]
    s["garbage"] = [frame(bytes((i * 131 + 7) & 0xFF for i in range(64)))]
    s["truncated"] = [frame(hello()), frame(attend(2, 1, 0, 2)[:-9])]
    s["unknown_fields"] = [frame(status() + f_varint(99, 5) + f_bytes(100, b"xyz")),
                           frame(request(2, 27, b"\x08\x01"))]
    s["no_body"] = [frame(f_varint(1, 5)), frame(b"")]
    s["no_session"] = [frame(create(1, 1, session=0)), frame(create(2, 1, session=3)),
                       frame(create(3, 1, session=HUGE))]
    s["shm_ops"] = shm_setup() + [
        frame(shm_varlen(10)), frame(shm_blocksparse(11)),
        frame(shm_varlen(12, out_offset=0, out_region=1)),  # out over cu_seqlens
        frame(shm_varlen(13, out_offset=512)),  # out over q
        shm_write(0, 0, struct.pack("<i", -100000)), frame(shm_varlen(14)),
        shm_write(0, 0, struct.pack("<2i", 4096, 4099)), frame(shm_varlen(15)),
        shm_write(0, 0, struct.pack("<2i", 0, 1)), shm_write(0, 2048, struct.pack("<i", -7)),
        frame(shm_blocksparse(16))]
    s["shm_step"] = shm_setup() + [
        frame(create(10, 1)), frame(begin_step(11, [(1, T3)])),
        frame(shm_attend(12, 1, 0)), frame(shm_attend(13, 1, 0)),  # layer 0 twice
        frame(shm_attend(14, 1, 1, out_offset=1024)),  # out over k_new
        frame(end_step(15, 1)), frame(shm_attend(16, 1, 1)), frame(end_step(17, 1)),
        frame(end_step(18, 1, abort=True))]
    s["channel"] = shm_setup() + [
        frame(open_channel(10)), post(create(11, 1)), post(begin_step(12, [(1, T3)])),
        post(shm_attend(13, 1, 0)), post(shm_attend(14, 1, 1), slot=1), post(end_step(15, 1)),
        post(status(16)), post(hello(17)), post(bytes(range(40))),
        post(shm_varlen(18)), post(free(19, 1)), frame(open_channel(20, size=4096))]
    return s


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith(".bin"):
            os.unlink(os.path.join(out, f))
    total = 0
    for name, frames in sorted(seeds().items()):
        data = b"".join(frames)
        total += len(data)
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(data)
    print(f"{len(seeds())} seeds, {total} bytes in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
