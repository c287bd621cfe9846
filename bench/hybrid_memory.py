#!/usr/bin/env python3
"""KV-cache memory of a model whose layers differ in window, held today (every layer keeps every
block of a sequence: one block table for all layers) and with a block table per group of layers
of one window (vLLM's hybrid allocator): what the groups would save, per sequence length.

    python3 bench/hybrid_memory.py CONFIG.json [--lengths 1024,4096,8192] [--block-size 16]
    python3 bench/hybrid_memory.py --gemma2-9b        # google/gemma-2-9b-it's config.json values

Counts blocks as the daemon does (cache.c): a sequence of L tokens holds ceil(L / bs) blocks in
every layer; a group windowed by w would hold only the blocks that hold keys L - w + 1 .. L - 1
and the next token's (those wholly before it released, as attnd does today when every layer is
windowed). Bytes: 2 (K and V) x kv heads x head size x dtype bytes per token and layer."""

from __future__ import annotations

import argparse
import json
import math

# google/gemma-2-9b-it config.json (the fields this needs)
GEMMA2_9B = {"model_type": "gemma2", "num_hidden_layers": 42, "num_key_value_heads": 8,
             "head_dim": 256, "sliding_window": 4096, "max_position_embeddings": 8192}


def layer_windows(cfg: dict) -> list[int]:
    n, w = cfg["num_hidden_layers"], int(cfg.get("sliding_window") or 0)
    types = cfg.get("layer_types")
    if not types:  # Gemma-2's configs before layer_types: even layers slide
        pattern = int(cfg.get("sliding_window_pattern", 2 if cfg["model_type"] == "gemma2" else 1))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                 for i in range(n)] if pattern > 1 else ["sliding_attention"] * n
    return [w if t == "sliding_attention" else 0 for t in types]


def blocks_held(length: int, window: int, bs: int) -> int:
    """Blocks a sequence of `length` tokens holds after a commit (attnd's windowed release)."""
    total = math.ceil(length / bs)
    if window == 0 or length < window:
        return total
    return total - (length - window + 1) // bs


def table(cfg: dict, lengths: list[int], bs: int, elem: int) -> list[tuple]:
    windows = layer_windows(cfg)
    per_block = 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * elem * bs  # one layer
    rows = []
    for n in lengths:
        today = len(windows) * math.ceil(n / bs) * per_block
        grouped = sum(blocks_held(n, w, bs) for w in windows) * per_block
        rows.append((n, today, grouped, 1 - grouped / today))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", nargs="?", help="a model's config.json")
    ap.add_argument("--gemma2-9b", action="store_true", help="google/gemma-2-9b-it's values")
    ap.add_argument("--lengths", default="1024,2048,4096,6144,8192")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--elem-bytes", type=int, default=2, help="2: bf16 cache")
    a = ap.parse_args()
    cfg = GEMMA2_9B if a.gemma2_9b or not a.config else json.load(open(a.config))
    cfg = cfg.get("text_config", cfg)
    lengths = [int(x) for x in a.lengths.split(",")]
    w = layer_windows(cfg)
    print(f"{cfg['model_type']}: {len(w)} layers ({sum(1 for x in w if x)} windowed, window "
          f"{max(w)}), {cfg['num_key_value_heads']} kv heads x {cfg['head_dim']}, "
          f"block {a.block_size}, {a.elem_bytes}-byte cache")
    print(f"{'tokens':>8} {'one table (MiB)':>16} {'per group (MiB)':>16} {'saved':>7}")
    for n, today, grouped, saved in table(cfg, lengths, a.block_size, a.elem_bytes):
        print(f"{n:>8} {today / 2**20:>16.1f} {grouped / 2**20:>16.1f} {saved:>7.1%}")


if __name__ == "__main__":
    main()
