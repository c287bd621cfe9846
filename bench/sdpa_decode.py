"""One decode layer of bench_hf.py's Llama-3-8B shape, in-process, on the GPU: what the
sdpa-static run spends per layer (the K/V index_copy into its StaticCache and sdpa_gqa_fold's
SDPA over the whole static length, masked) against what an attnd stream step adds on the
worker's side (Q/K/V copied into the registered step tensors). CUDA events, median, inputs
rotated over more than the L2; each figure is one call's share of 20 calls captured in a CUDA
graph (queued from Python, small ops measure the host's launch, not the GPU). Usage:
python3 bench/sdpa_decode.py [B:CTX ...]"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.nn.functional as F

HQ, HK, D, NEW = 32, 8, 128, 64


def timed(fn, reps: int = 15, back_to_back: int = 20) -> float:
    """GPU time per call: back_to_back calls (inputs rotated) captured in one CUDA graph, the
    median over reps replays (queued one by one from Python, small ops time the host instead)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(back_to_back):
            fn(i)
    g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / back_to_back)
    return statistics.median(times)


def shape(b: int, ctx: int) -> None:
    s = -(-(ctx + NEW + 1) // 64) * 64  # bench_hf's static length
    sets = max(2, int(2 * 50e6 // (b * HK * s * D * 2 * 2)) + 1)
    kc = [torch.randn(b, HK, s, D, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    vc = [torch.randn_like(k) for k in kc]
    q = torch.randn(b, HQ, 1, D, device="cuda", dtype=torch.bfloat16)
    k1 = torch.randn(b, HK, 1, D, device="cuda", dtype=torch.bfloat16)
    mask = torch.zeros(b, 1, 1, s, device="cuda", dtype=torch.bool)
    mask[..., : ctx + 1] = True
    pos = torch.tensor([ctx], device="cuda")

    def sdpa(i: int) -> None:
        F.scaled_dot_product_attention(q.reshape(b, HK, HQ // HK, D), kc[i % sets], vc[i % sets],
                                       attn_mask=mask)

    def cache_write(i: int) -> None:
        kc[i % sets].index_copy_(2, pos, k1)
        vc[i % sets].index_copy_(2, pos, k1)

    step_q = torch.empty(b, HQ, D, device="cuda", dtype=torch.bfloat16)
    step_kv = [torch.empty(b, HK, D, device="cuda", dtype=torch.bfloat16) for _ in range(2)]

    def copies(i: int) -> None:  # attnd.stream: query/key/value [1, H, T, D] -> step tensors
        step_q.copy_(q.transpose(1, 2)[:, 0])
        for t in step_kv:
            t.copy_(k1.transpose(1, 2)[:, 0])

    def foreach_copy(i: int) -> None:  # the same three copies as one launch
        kv = k1.transpose(1, 2)[:, 0]
        torch._foreach_copy_([step_q, *step_kv], [q.transpose(1, 2)[:, 0], kv, kv])

    bytes_ = b * HK * (ctx + 1) * D * 2 * 2
    t_sdpa, t_write = timed(sdpa), timed(cache_write)
    t_copy, t_foreach = timed(copies), timed(foreach_copy)
    print(f"case=sdpa-fold decode b={b} ctx={ctx} static={s} | us={t_sdpa:.1f} | "
          f"GBps={bytes_ / t_sdpa / 1e3:.0f} | index_copy_us={t_write:.1f} | "
          f"attnd_worker_copies_us={t_copy:.1f} | foreach_copy_us={t_foreach:.1f}", flush=True)


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["16:1024", "32:2048", "16:1056", "32:2080"]:
        b, ctx = (int(x) for x in arg.split(":"))
        shape(b, ctx)
