#!/usr/bin/env python3
"""attnd from Python: two sequences, a prefill step and a few decode steps on every layer, with
Q/K/V and the output as numpy arrays in a shared-memory region; each output is compared with a
plain numpy attention over the keys and values sent so far. Exit status 0 when they agree.

    python3 client/python/example.py --url ipc:///tmp/attnd.sock
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attnd  # noqa: E402


def as_cache(x, dtype):
    """What the daemon's cache keeps of x (its dtype's rounding), as float32."""
    if dtype == "bf16":
        return attnd.from_bf16(attnd.to_bf16(x))
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    return x  # fp8: compared with a looser bound below


def reference(q, keys, values, context, scale):
    """Causal attention of q [n, Hq, D] at positions context.. over keys/values [L, Hkv, D]."""
    n, hq, _ = q.shape
    group = hq // keys.shape[1]
    out = np.zeros(q.shape, dtype=np.float64)
    for i in range(n):
        seen = context + i + 1
        for h in range(hq):
            k, v = keys[:seen, h // group], values[:seen, h // group]
            logits = (k.astype(np.float64) @ q[i, h].astype(np.float64)) * scale
            p = np.exp(logits - logits.max())
            out[i, h] = (p / p.sum()) @ v.astype(np.float64)
    return out


def attend_layer(c, step, layer, region, rng, hist, g, scale):
    """One layer of the step with random Q/K/V in the region; returns the output and its
    largest difference from numpy over the keys and values sent so far."""
    t, hq, hkv, d = step.num_tokens, g["num_q_heads"], g["num_kv_heads"], g["head_size"]
    region.reset()
    q, k, v = region.array((t, hq, d)), region.array((t, hkv, d)), region.array((t, hkv, d))
    q[:], k[:], v[:] = (rng.standard_normal(a.shape, dtype=np.float32) for a in (q, k, v))
    out, lse = c.attend(step, layer, q, k, v, out=region.array((t, hq, d)), lse=True)
    assert np.isfinite(lse).all()
    worst = 0.0
    for i, (s, _) in enumerate(step.seqs):
        rows = step.rows(i)
        ks, vs = hist[(s, layer)]
        ctx = len(ks)
        ks = np.concatenate([ks, as_cache(k[rows], g["cache_dtype"])])
        vs = np.concatenate([vs, as_cache(v[rows], g["cache_dtype"])])
        hist[(s, layer)] = (ks, vs)
        worst = max(worst, float(np.abs(out[rows] - reference(q[rows], ks, vs, ctx, scale)).max()))
    return out, worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=os.environ.get("ATTND_URL", attnd.DEFAULT_URL))
    ap.add_argument("--lib", default=None, help="path of libattnd-client.so")
    ap.add_argument("--steps", type=int, default=4, help="decode steps after the prefill")
    args = ap.parse_args()
    rng = np.random.default_rng(0)

    with attnd.Client(args.url, name="example.py", lib=args.lib) as c:
        g = c.geometry
        hq, hkv, d, layers = g["num_q_heads"], g["num_kv_heads"], g["head_size"], g["num_layers"]
        scale = g["scale"] or 1.0 / np.sqrt(d)
        print(f"attnd {c.info['version']} ({c.info['backend']}): {layers} layers, {hq} q / "
              f"{hkv} kv heads, head {d}, cache {g['cache_dtype']}, session {c.info['session']}")
        prompts = {1: 12, 2: 5}
        region = c.region(1 << 22)
        for s in prompts:
            c.create(s)
        hist = {(s, l): (np.zeros((0, hkv, d), np.float32), np.zeros((0, hkv, d), np.float32))
                for s in prompts for l in range(layers)}
        worst = 0.0
        for step_no in range(1 + args.steps):
            plan = list(prompts.items()) if step_no == 0 else [(s, 1) for s in prompts]
            with c.step(plan) as step:  # EndStep at the end, abort if anything raises
                for layer in range(layers):
                    out, err = attend_layer(c, step, layer, region, rng, hist, g, scale)
                    worst = max(worst, err)
            if step_no == 0:
                print(f"prefill: {step.num_tokens} tokens, out[0, 0, :4] = "
                      f"{np.round(out[0, 0, :4], 4)}")
        print(f"{args.steps} decode steps; sequences: " +
              ", ".join(f"{s['seq_id']}: {s['num_tokens']} tokens" for s in c.seqs()))
        for s in prompts:
            c.free(s)
        try:  # errors carry the daemon's code and message
            c.query(1)
            return 1
        except attnd.AttndError as e:
            print(f"query 1 after free: {e.name}: {e.message}")
            if e.name != "NOT_FOUND" or not e.remote:
                return 1
        bound = 5e-2 if g["cache_dtype"] == "fp8_e4m3" else 1e-3
        print(f"max |out - numpy reference| = {worst:.2e} (bound {bound:g})")
        return 0 if worst <= bound else 1


if __name__ == "__main__":
    sys.exit(main())
