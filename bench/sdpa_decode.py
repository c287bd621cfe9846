"""One decode layer of bench_hf.py's Llama-3-8B shape, in-process, on the GPU: what the
sdpa-static run spends per layer (the K/V index_copy into its StaticCache and sdpa_gqa_fold's
SDPA over the whole static length, masked) against what an attnd stream step adds on the
worker's side (Q/K/V copied into the registered step tensors; a model whose rotary embedding
attnd.rotary writes in place copies only V). CUDA events, median, inputs
rotated over more than the L2; each figure is one call's share of 20 calls captured in a CUDA
graph (queued from Python, small ops measure the host's launch, not the GPU). With pB:CTX, a
prefill layer of B prompts of CTX tokens instead: transformers' sdpa_attention_forward as the
sdpa-static run calls it (empty StaticCache: no mask, causal, GQA in SDPA, its output made
contiguous) under SDPA's default choice and each backend forced, the StaticCache index_copy, and
attnd's worker copies; CUDA events around single calls. Usage:
python3 bench/sdpa_decode.py [B:CTX | pB:CTX ...]"""

from __future__ import annotations

import statistics
import sys
import types

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

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


def timed_once(fn, reps: int = 7) -> float:
    """GPU time of one call (large ops): events around each of reps calls, median."""
    fn(0)
    times = []
    for i in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(i)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def prefill(b: int, ctx: int) -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    s = -(-(ctx + NEW + 1) // 64) * 64
    q = torch.randn(b, ctx, HQ, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(b, ctx, HK, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn_like(k)
    kc = torch.zeros(b, HK, s, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    pos = torch.arange(ctx, device="cuda")
    module = types.SimpleNamespace(num_key_value_groups=HQ // HK, is_causal=True, training=False)
    step_q = torch.empty(b * ctx, HQ, D, device="cuda", dtype=torch.bfloat16)
    step_kv = [torch.empty(b * ctx, HK, D, device="cuda", dtype=torch.bfloat16) for _ in range(2)]

    def sdpa(i: int) -> None:  # StaticCache.update returns the whole cache: sliced inside
        sdpa_attention_forward(module, q, kc, vc, None, scaling=D ** -0.5)

    def cache_write(i: int) -> None:
        kc.index_copy_(2, pos, k)
        vc.index_copy_(2, pos, v)

    def copies(i: int) -> None:  # the packed [T, H, D] views of query/key/value -> step tensors
        step_q.copy_(q.transpose(1, 2).reshape(b * ctx, HQ, D))
        step_kv[0].copy_(k.transpose(1, 2).reshape(b * ctx, HK, D))
        step_kv[1].copy_(v.transpose(1, 2).reshape(b * ctx, HK, D))

    flops = 4 * b * HQ * D * ctx * ctx / 2
    figures = {"default": timed_once(sdpa)}
    for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                     ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            with sdpa_kernel(be):
                figures[name] = timed_once(sdpa)
        except RuntimeError:
            figures[name] = float("nan")
    line = " | ".join(f"{k}_us={t:.0f} ({flops / t / 1e6:.0f} TFLOP/s)" for k, t in figures.items())
    print(f"case=sdpa prefill b={b} ctx={ctx} | {line} | index_copy_us={timed_once(cache_write):.0f}"
          f" | attnd_worker_copies_us={timed_once(copies):.0f}", flush=True)


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["16:1024", "32:2048", "16:1056", "32:2080"]:
        if arg.startswith("p"):
            prefill(*(int(x) for x in arg[1:].split(":")))
        else:
            shape(*(int(x) for x in arg.split(":")))
