#!/usr/bin/env python3
"""Anchors for the other seed ops (merge states, varlen flash attention, block-sparse, linear
attention), on the shapes bench_ops.c times attnd on, in the same device call.

The seeds' Triton kernels come from the seed pages (SEEDS_DIR, default .anchors/seeds) through
.anchors/anchors/bench_anchors_loader.py. The lightning (linear) attention page lost its line
breaks, so linear attention is compared with a plain torch implementation (chunked like the
seed, fp32 state) checked against the token recurrence first. Median times from
triton.testing.do_bench (it clears L2 between calls). One line per case on stdout (same format
as bench_ops); JSON to $OUT/anchors_ops.json when OUT is set.

usage: SEEDS_DIR=.anchors/seeds python3 bench/anchors_ops.py
"""
import json, math, os, sys, time

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
os.environ.setdefault("SEEDS_DIR", os.path.join(ROOT, ".anchors", "seeds"))
sys.path.insert(0, os.path.join(ROOT, ".anchors", "anchors"))
from bench_anchors_loader import load  # noqa: E402

dev = "cuda"
torch.manual_seed(0)
res = []


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def emit(**kw):
    res.append(kw)
    print(" | ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in kw.items()),
          flush=True)


HQ, HK, D = 32, 8, 128

# ---------------------------------------------------------------- merge states
mg = load("seed_merge", "merge_attn_states.txt")
for T in [4096, 65536]:
    po = torch.randn(T, HQ, D, device=dev, dtype=torch.bfloat16)
    so = torch.randn_like(po)
    o = torch.empty_like(po)
    pl = torch.randn(HQ, T, device=dev, dtype=torch.float32)
    sl = torch.randn_like(pl)
    ol = torch.empty_like(pl)
    ms = bench(lambda: mg.merge_attn_states(o, po, pl, so, sl, ol))
    nbytes = 3 * po.numel() * 2 + 3 * pl.numel() * 4
    emit(case=f"merge seed-triton T={T} bf16", ms=ms, GBps=nbytes / ms / 1e6)
    buf = torch.empty(nbytes // 2, device=dev, dtype=torch.uint8)
    buf2 = torch.empty_like(buf)
    ms = bench(lambda: buf2.copy_(buf))
    emit(case=f"merge copy-same-bytes T={T}", ms=ms, GBps=nbytes / ms / 1e6)
    del po, so, o, pl, sl, ol, buf, buf2
# host cost of one launch (tiny shape: the GPU is idle, the host is the bottleneck)
po = torch.randn(1, HQ, D, device=dev, dtype=torch.bfloat16)
so, o = torch.randn_like(po), torch.empty_like(po)
pl = torch.randn(HQ, 1, device=dev)
sl, ol = torch.randn_like(pl), torch.empty_like(pl)
for _ in range(100):
    mg.merge_attn_states(o, po, pl, so, sl, ol)
torch.cuda.synchronize()
per = []
for _ in range(2000):
    t0 = time.perf_counter()
    mg.merge_attn_states(o, po, pl, so, sl, ol)
    per.append(time.perf_counter() - t0)
torch.cuda.synchronize()
per.sort()
emit(case="merge seed-triton host-per-call T=1", us=per[len(per) // 2] * 1e6)
lat = []
for _ in range(500):
    t0 = time.perf_counter()
    mg.merge_attn_states(o, po, pl, so, sl, ol)
    torch.cuda.synchronize()
    lat.append(time.perf_counter() - t0)
lat.sort()
emit(case="merge seed-triton call+sync T=1", us=lat[len(lat) // 2] * 1e6)

# ---------------------------------------------------------------- varlen flash attention
fa = load("seed_flash", "triton_flash_attention.txt")
B, L = 8, 2048
for dt, d in [(torch.bfloat16, 128), (torch.float16, 128), (torch.bfloat16, 96)]:
    flops = 4 * B * HQ * d * L * L / 2
    q = torch.randn(B * L, HQ, d, device=dev, dtype=dt)
    k = torch.randn(B * L, HK, d, device=dev, dtype=dt)
    v = torch.randn_like(k)
    cu = torch.arange(0, B + 1, device=dev, dtype=torch.int32) * L
    o = torch.empty_like(q)
    name = "bf16" if dt == torch.bfloat16 else "fp16"
    try:
        f = lambda: fa._attention.apply(q, k, v, o, cu, cu, L, L, True, 1 / math.sqrt(d))
        f()
        ms = bench(f)
        emit(case=f"varlen seed-triton b={B} L={L} d={d} {name} causal", ms=ms, TFLOPs=flops / ms / 1e9)
    except Exception as e:  # noqa: BLE001
        emit(case=f"varlen seed-triton b={B} L={L} d={d} {name}", error=str(e)[:160])
    del q, k, v, o
# fp8 inputs (scales 1), bf16 output
q = torch.randn(B * L, HQ, D, device=dev).to(torch.float8_e4m3fn)
k = torch.randn(B * L, HK, D, device=dev).to(torch.float8_e4m3fn)
v = torch.randn(B * L, HK, D, device=dev).to(torch.float8_e4m3fn)
o = torch.empty(B * L, HQ, D, device=dev, dtype=torch.bfloat16)
cu = torch.arange(0, B + 1, device=dev, dtype=torch.int32) * L
try:
    f = lambda: fa._attention.apply(q, k, v, o, cu, cu, L, L, True, 1 / math.sqrt(D), None,
                                    (1.0, 1.0, 1.0, 1.0 / 448))
    f()
    ms = bench(f)
    emit(case=f"varlen seed-triton b={B} L={L} d={D} fp8 causal", ms=ms,
         TFLOPs=4 * B * HQ * D * L * L / 2 / ms / 1e9)
except Exception as e:  # noqa: BLE001
    emit(case="varlen seed-triton fp8", error=str(e)[:160])
del q, k, v, o
torch.cuda.empty_cache()

# ---------------------------------------------------------------- block-sparse
bsp = load("seed_blocksparse", "blocksparse_attention.txt")
BLK, LOCAL, VERT = 64, 16, 8


def layout(nrows, heads):
    crow, col = [], []
    for h in range(heads):
        c, cc = [0], []
        for qb in range(nrows):
            ks = [kb for kb in range(qb + 1) if qb - kb < LOCAL or (kb + h + 1) % VERT == 0]
            cc += ks
            c.append(len(cc))
        crow.append(c)
        col.append(cc)
    width = max(len(x) for x in col)
    crow_t = torch.tensor(crow, device=dev, dtype=torch.int32)
    col_t = torch.tensor([x + [0] * (width - len(x)) for x in col], device=dev, dtype=torch.int32)
    return crow_t, col_t, col


# prefill 8 x 2048 (the anchors' case)
nqb = L // BLK
crow_t, col_t, col = layout(nqb, HQ)
density = sum(len(x) for x in col) / (HQ * nqb * (nqb + 1) / 2)
q = torch.randn(B * L, HQ, D, device=dev, dtype=torch.bfloat16)
k = torch.randn(B * L, HK, D, device=dev, dtype=torch.bfloat16)
v = torch.randn_like(k)
cu = torch.arange(0, B + 1, device=dev, dtype=torch.int32) * L
flops = 4 * B * HQ * D * L * L / 2
f = lambda: bsp.blocksparse_flash_attn_varlen_fwd(q, k, v, cu, cu, 1 / math.sqrt(D), (crow_t, col_t),
                                                  block_size=BLK)
f()
ms = bench(f)
emit(case=f"blocksparse seed-triton prefill b={B} L={L} bf16 density={density:.3f}", ms=ms,
     TFLOPs=flops * density / ms / 1e9)
del q, k, v
# decode: 64 sequences x 4096 context, one query each
NB, CTX = 64, 4096
crow_t, col_t, col = layout(CTX // BLK, HQ)
q = torch.randn(NB, HQ, D, device=dev, dtype=torch.bfloat16)
k = torch.randn(NB * CTX, HK, D, device=dev, dtype=torch.bfloat16)
v = torch.randn_like(k)
cuq = torch.arange(0, NB + 1, device=dev, dtype=torch.int32)
cuk = torch.arange(0, NB + 1, device=dev, dtype=torch.int32) * CTX
last = CTX // BLK - 1  # every sequence's query sits in the last row block
blocks = sum(1 for h in range(HQ) for kb in range(last + 1) if last - kb < LOCAL or (kb + h + 1) % VERT == 0)
f = lambda: bsp.blocksparse_flash_attn_varlen_fwd(q, k, v, cuk, cuq, 1 / math.sqrt(D), (crow_t, col_t),
                                                  block_size=BLK)
f()
ms = bench(f)
kv_bytes = NB * blocks * BLK * D * 2 * 2  # K and V rows the q heads read (per-head layouts)
emit(case=f"blocksparse seed-triton decode b={NB} ctx={CTX} bf16", ms=ms, GBps=kv_bytes / ms / 1e6)
del q, k, v
torch.cuda.empty_cache()


# ---------------------------------------------------------------- linear attention (torch)
def torch_lightning(q, k, v, s, kv, BLOCK=256):
    """Chunked linear attention, decay exp(-s) per head, exponent i+1 for the carried state.
    bf16 matmuls for the intra-chunk part, fp32 state. n must be a multiple of BLOCK."""
    b, h, n, d = q.shape
    e = v.shape[-1]
    nb = n // BLOCK
    sh = s.view(1, h, 1, 1, 1).float()
    idx = torch.arange(BLOCK, device=q.device, dtype=torch.float32)
    diff = idx.view(-1, 1) - idx.view(1, -1)
    dmask = torch.where(diff >= 0, torch.exp(-sh * diff.clamp(min=0)), torch.zeros((), device=q.device))
    qc, kc, vc = (t.reshape(b, h, nb, BLOCK, -1) for t in (q, k, v))
    att = (qc @ kc.transpose(-1, -2)).float() * dmask
    intra = att.to(q.dtype) @ vc
    kdec = torch.exp(-sh * (BLOCK - 1 - idx).view(1, 1, 1, BLOCK, 1))
    kvc = (kc.float() * kdec).transpose(-1, -2) @ vc.float()  # [b,h,nb,d,e]
    bdec = torch.exp(-s.float() * BLOCK).view(1, h, 1, 1)
    S = kv.float()
    prev = []
    for c in range(nb):
        prev.append(S)
        S = bdec * S + kvc[:, :, c]
    prev = torch.stack(prev, 2)
    qdec = torch.exp(-sh * (idx + 1).view(1, 1, 1, BLOCK, 1))
    inter = (qc.float() * qdec) @ prev
    return (intra.float() + inter).to(q.dtype).reshape(b, h, n, e), S


def recurrence(q, k, v, s, kv):
    b, h, n, d = q.shape
    lam = torch.exp(-s.double()).view(1, h, 1, 1)
    S = kv.double()
    out = []
    for t in range(n):
        S = lam * S + k[:, :, t].double().unsqueeze(-1) * v[:, :, t].double().unsqueeze(-2)
        out.append((q[:, :, t].double().unsqueeze(-2) @ S).squeeze(-2))
    return torch.stack(out, 2), S


H = 64
slopes = torch.tensor([2 ** (-8 * (i + 1) / H) for i in range(H)], device=dev, dtype=torch.float32)
# check the baseline against the recurrence (small n, unscaled inputs)
qs_, ks_, vs_ = (torch.randn(1, H, 512, 64, device=dev, dtype=torch.bfloat16) for _ in range(3))
kv0 = torch.randn(1, H, 64, 64, device=dev)
o_t, S_t = torch_lightning(qs_, ks_, vs_, slopes, kv0)
o_r, S_r = recurrence(qs_, ks_, vs_, slopes, kv0)
emit(case="linear torch-baseline vs recurrence (n=512, d=64, bf16)",
     rel_out=((o_t.double() - o_r).norm() / o_r.norm()).item(),
     rel_state=((S_t.double() - S_r).norm() / S_r.norm()).item())
N = 8192
for d in [96, 128]:
    q = torch.randn(1, H, N, d, device=dev, dtype=torch.bfloat16)
    k = torch.randn_like(q)
    v = torch.randn_like(q)
    kv = torch.zeros(1, H, d, d, device=dev)
    f = lambda: torch_lightning(q, k, v, slopes, kv)
    f()
    ms = bench(f)
    nominal = 1 * H * N * (64 * (d + d) + 4 * d * d)
    emit(case=f"linear torch-chunked prefill b=1 h={H} n={N} d=e={d} bf16", ms=ms, TFLOPs=nominal / ms / 1e9)
    del q, k, v
# decode: 64 rows, slots permuted, against a 128-slot cache
for d in [96, 128]:
    R, SLOTS = 64, 128
    q = torch.randn(R, H, d, device=dev, dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    cache = torch.randn(SLOTS, H, d, d, device=dev)
    slot = torch.randperm(SLOTS, device=dev)[:R]
    lam = torch.exp(-slopes).view(1, H, 1, 1)

    def dec():
        S = cache.index_select(0, slot)
        S = lam * S + k.float().unsqueeze(-1) * v.float().unsqueeze(-2)
        o = (q.float().unsqueeze(-2) @ S).squeeze(-2).to(q.dtype)
        cache.index_copy_(0, slot, S)
        return o

    dec()
    ms = bench(dec)
    nbytes = 2 * R * H * d * d * 4
    emit(case=f"linear torch decode rows={R} h={H} d=e={d} bf16", ms=ms, GBps=nbytes / ms / 1e6)
    del q, k, v, cache

# ---------------------------------------------------------------- ceiling
x = torch.empty(1 << 30, device=dev, dtype=torch.bfloat16)
y = torch.empty_like(x)
ms = bench(lambda: y.copy_(x))
emit(case="ceiling d2d copy 2GiB", ms=ms, GBps=2 * x.numel() * 2 / ms / 1e6)

if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "anchors_ops.json"), "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       triton=triton.__version__, results=res), fh, indent=1)
