#!/usr/bin/env python3
"""Real-model benchmark: a Llama-3-8B-shaped model (random bf16 weights from its config: 32
layers, 32 q / 8 kv heads, head 128) generating greedily with attention through attnd (the
daemon at --url, CUDA IPC) and with transformers' SDPA, in one process: prefill time, decode
tokens/s and the time spent in Attend, for each --shape BATCHxPROMPT, --new tokens each.

    python3 bench/bench_hf.py --url ipc:///tmp/attnd.sock --shape 32x2048 --shape 16x1024
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import attnd
import attnd.transformers as at

LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 max_position_embeddings=8192, rope_theta=500000.0)


def sync_time() -> float:
    torch.cuda.synchronize()
    return time.perf_counter()


def run_sdpa(model: Any, ids: torch.Tensor, new: int) -> dict[str, float]:
    model.config._attn_implementation = "sdpa"
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        t0 = sync_time()
        logits = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        t1 = sync_time()
        for _ in range(new):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            logits = model(nxt, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        t2 = sync_time()
    del cache
    torch.cuda.empty_cache()
    return {"prefill_s": t1 - t0, "decode_tok_s": ids.shape[0] * new / (t2 - t1)}


class AttendTimer:
    """Wall time inside Client.attend (request, daemon kernels, reply), per phase."""

    def __init__(self, client: attnd.Client) -> None:
        self.total = 0.0
        inner = client.attend

        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                self.total += time.perf_counter() - t

        client.attend = timed  # type: ignore[method-assign]


def run_attnd(model: Any, client: attnd.Client, ids: torch.Tensor, new: int) -> dict[str, float]:
    model.config._attn_implementation = at.NAME
    timer = AttendTimer(client)
    with at.Generator(model, client, max_step_tokens=ids.numel()) as gen:
        seqs = [gen.add(row.tolist(), new + 1) for row in ids]
        t0 = sync_time()
        gen.step()  # every prompt whole, each gets its first token
        t1 = sync_time()
        prefill_attend, timer.total = timer.total, 0.0
        while gen.step():
            pass
        t2 = sync_time()
        assert all(len(s.generated) == new + 1 for s in seqs)
    return {"prefill_s": t1 - t0, "decode_tok_s": ids.shape[0] * new / (t2 - t1),
            "prefill_attend_s": prefill_attend, "decode_attend_s": timer.total}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--json")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    at.register()
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(LlamaConfig(**LLAMA3_8B)).eval()
    rows = []
    with attnd.Client(a.url) as c:
        print(f"attnd {c.info['version']} ({c.backend}), spin_us {c.spin_us}, "
              f"channel {c.channel_active} {a.label}")
        for shape in a.shape or ["32x2048", "16x1024"]:
            b, p = (int(x) for x in shape.split("x"))
            ids = torch.randint(1, LLAMA3_8B["vocab_size"], (b, p), device="cuda")
            run_sdpa(model, ids[:2, :64], 2)  # warm-up (kernels, allocator)
            run_attnd(model, c, ids[:2, :64], 2)
            for impl in ("sdpa", "attnd"):
                r = run_sdpa(model, ids, a.new) if impl == "sdpa" else run_attnd(model, c, ids, a.new)
                rows.append({"shape": shape, "impl": impl, "label": a.label, **r})
                print(json.dumps(rows[-1]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
