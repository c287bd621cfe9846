#!/usr/bin/env python3
"""Anchors for bench_e2e, same device call: the seed's unified_attention (vLLM's Triton op, from
the seed page via .anchors/anchors/bench_anchors_loader.py, SEEDS_DIR=.anchors/seeds) on the
per-layer work of the end-to-end benchmark (32 q / 8 kv heads, head 128, bf16, block 16,
random block tables), kernel alone, triton.testing.do_bench median:

  decode  64 sequences x 1 new token over 4096 context (the seed picks its 3D kernel)
  mixed   4 prefills of 512 fresh tokens + 60 decodes over 4096 context, one call: the seed's
          single-kernel choice for a batch with a prefill (its 2D kernel for everything)
  tiny    1 sequence x 1 token, no context
"""
import math
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".anchors",
                                "anchors"))
from bench_anchors_loader import load  # noqa: E402

ua = load("seed_unified", "triton_unified_attention.txt")
HQ, HK, D, BS = 32, 8, 128, 16
dev = "cuda"
torch.manual_seed(0)


def batch(q_lens, kv_lens):
    nblk = [math.ceil(k / BS) for k in kv_lens]
    total = sum(nblk) + 8
    width = max(nblk)
    k = torch.randn(total, BS, HK, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(total, BS, HK, D, device=dev, dtype=torch.bfloat16)
    perm = torch.randperm(total - 8, device=dev).int()
    bt = torch.zeros(len(q_lens), width, device=dev, dtype=torch.int32)
    at = 0
    for i, n in enumerate(nblk):
        bt[i, :n] = perm[at:at + n]
        at += n
    q = torch.randn(sum(q_lens), HQ, D, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), device=dev, dtype=torch.int32)
    sl = torch.tensor(kv_lens, device=dev, dtype=torch.int32)
    return q, k, v, out, cu, sl, bt, max(q_lens), max(kv_lens)


def run(args):
    q, k, v, out, cu, sl, bt, mq, mk = args
    ua.unified_attention(q, k, v, out, cu, mq, sl, mk, 1.0 / math.sqrt(D), True, (-1, -1), bt,
                         0.0, None, None, None)


cases = {
    "decode": ([1] * 64, [4097] * 64),
    "mixed": ([512] * 4 + [1] * 60, [512] * 4 + [4097] * 60),
    "tiny": ([1], [1]),
}
print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
for name, (ql, kl) in cases.items():
    a = batch(ql, kl)
    run(a)
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(lambda: run(a), warmup=25, rep=200, return_mode="median")
    print(f"anchor {name:6s}: seed unified_attention {ms * 1e3:8.1f} us per layer "
          f"({len(ql)} seqs, {sum(ql)} query tokens)")
