#!/usr/bin/env python3
"""Real-model benchmark: a Llama-3-8B-shaped model (random bf16 weights from its config: 32
layers, 32 q / 8 kv heads, head 128) generating greedily with attention through attnd (the
daemon at --url, CUDA IPC) and with transformers' SDPA, in one process: prefill time, decode
tokens/s and the time spent in Attend, for each --shape BATCHxPROMPT, --new tokens each.

impls (--impl, default all): sdpa (transformers' loop with a DynamicCache, which concatenates
every layer's K/V each step); sdpa-static (a StaticCache sized to prompt + new tokens, eager);
sdpa-static-graph (the same, with the decode forward captured once in a CUDA graph and replayed
each step); attnd (Client.attend: a host round trip per layer); attnd-stream (a stream channel:
each layer handed over on the model's CUDA stream, decode steps run ahead: the Generator's
run_ahead); attnd-stream-graph (the same, with the decode
step's forward captured once in a CUDA graph and replayed each step, only StreamBegin / StreamEnd
on the host, each replay launched one step ahead); attnd-generator-graph (the product's path:
attnd.transformers.Generator(cuda_graphs=True): replays queued one behind the other, each
step's tokens to the host while the next runs); attnd-stream~sdpa-static (both eager
decodes in one run, their steps taken in turn: the pair's host-bound steps share the machine's
state, which drifts between whole runs). The fair pairs:
attnd-stream / sdpa-static, attnd-stream-graph / sdpa-static-graph.

--repeat N runs every impl N times, alternating (impl order rotated each round), after
--warm-rounds (1) full-size rounds that are not counted, and prints the medians per shape and
impl. The allocator is never emptied, so no impl pays for another's cudaMalloc calls.

    python3 bench/bench_hf.py --url ipc:///tmp/attnd.sock --shape 32x2048 --shape 16x1024
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F
from transformers import (AttentionInterface, AttentionMaskInterface, DynamicCache, LlamaConfig,
                          LlamaForCausalLM, StaticCache)
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

import attnd
import attnd.generate
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
    return {"prefill_s": t1 - t0, "decode_tok_s": ids.shape[0] * new / (t2 - t1)}


SDPA_FOLD = "sdpa_gqa_fold"


def sdpa_gqa_fold(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, dropout: float = 0.0,
                  scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' SDPA, except a decode step (one query token) over grouped K/V heads: with
    a mask (a static cache always has one) transformers copies K/V to every q head (repeat_kv,
    the whole cache per layer per step). Here each kv head's q heads become query rows of one
    SDPA call (q [B, Hkv, group, D] against K/V [B, Hkv, S, D], the mask broadcast over the
    rows), so no copy is made and the fused kernels take it."""
    b, hq, t, d = query.shape
    hk = key.shape[1]
    if t != 1 or hq == hk:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    q = query.reshape(b, hk, hq // hk, d)  # q head kv * group + i -> row i of kv head kv
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, hq, 1, d).transpose(1, 2).contiguous(), None


def register_sdpa_fold() -> None:
    AttentionInterface.register(SDPA_FOLD, sdpa_gqa_fold)
    AttentionMaskInterface.register(SDPA_FOLD, sdpa_mask)


def run_sdpa_static(model: Any, ids: torch.Tensor, new: int,
                    graph: bool = False) -> dict[str, float]:
    """SDPA (sdpa_gqa_fold: decode without repeat_kv) over a StaticCache of prompt + new + 1
    tokens, rounded up to 64 (aligned rows for the mask); with graph, the decode forward is
    captured once (after one eager decode step, which also warms it up) and replayed for the
    remaining steps: the cache's length is a device tensor (StaticLayer.cumulative_length), so
    each replay writes the next position."""
    model.config._attn_implementation = SDPA_FOLD
    b, p = ids.shape
    cache = StaticCache(config=model.config, max_cache_len=(p + new + 1 + 63) // 64 * 64)
    tok = torch.empty((b, 1), dtype=torch.long, device=ids.device)

    def forward() -> torch.Tensor:
        return model(tok, past_key_values=cache, use_cache=True, logits_to_keep=1).logits

    with torch.inference_mode():
        t0 = sync_time()
        logits = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        t1 = t_dec = sync_time()
        steps = new
        for k in range(new):
            tok.copy_(logits[:, -1].argmax(-1, keepdim=True))
            if graph and k == 1:  # step 0 ran eagerly: capture, then replay from step 1 on
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    static = forward()
                t_dec, steps = sync_time(), new - 1  # timed from the first replayed step
            if graph and k >= 1:
                g.replay()
                logits = static
            else:
                logits = forward()
        t2 = sync_time()
    del cache
    return {"prefill_s": t1 - t0, "decode_tok_s": b * steps / (t2 - t_dec)}


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


def run_attnd(model: Any, client: attnd.Client, ids: torch.Tensor, new: int,
              stream: bool = False, graphs: bool = False) -> dict[str, float]:
    model.config._attn_implementation = at.NAME
    timer = AttendTimer(client)
    with at.Generator(model, client, max_step_tokens=ids.numel(), stream=stream,
                      run_ahead=stream, cuda_graphs=graphs) as gen:
        seqs = [gen.add(row.tolist(), new + 1) for row in ids]
        t0 = sync_time()
        gen.step()  # every prompt whole, each gets its first token
        t1 = sync_time()
        prefill_attend, timer.total = timer.total, 0.0
        walls, t = [], time.perf_counter()
        while gen.step():
            now = time.perf_counter()
            walls.append(now - t)
            t = now
        t2 = sync_time()
        assert all(len(s.generated) == new + 1 for s in seqs)
    # steady state: the median step after the first two (an eager step and a capture with
    # cuda_graphs); with run_ahead a step returns once the one before it ended on the GPU
    steady = ids.shape[0] / statistics.median(walls[2:]) if len(walls) > 4 else None
    return {"prefill_s": t1 - t0, "decode_tok_s": ids.shape[0] * new / (t2 - t1),
            "decode_steady_tok_s": steady, "prefill_attend_s": prefill_attend,
            "decode_attend_s": timer.total}


class GraphDecode:
    """bench's own decode loop over the Generator's decode forward of B sequences
    (attnd.generate._Decode: one token each, packed, the stream channel's per-layer handoff
    inside, capturable): the tokens never leave the GPU and each replay runs one step ahead."""

    def __init__(self, gen: at.Generator, seqs: list, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.d = attnd.generate._Decode(gen, len(seqs), dtype, device)
        self.ch = gen._channel
        self.pairs = [(s.seq_id, 1) for s in seqs]
        self.pending: attnd.StreamStep | None = None

    def eager_step(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One real decode step run eagerly (the warm-up capture wants)."""
        st = self.ch.begin(self.pairs, *self.d.bufs)
        try:
            logits = self.d.run(ids, pos)
        except BaseException:  # abort: a commit would wait for layers never handed over
            self.ch.end(st, abort=True)
            raise
        self.ch.end(st)
        return logits

    def replay_step(self, ids: torch.Tensor, pos: torch.Tensor,
                    times: dict[str, list[Any]] | None = None) -> torch.Tensor:
        """One replayed step launched one step ahead: the graph goes on the worker's stream
        behind the step before, whose StreamEnd is sent next, then this step's StreamBegin (the
        protocol lets a stream run one step ahead), so the worker's GPU goes from one step to
        the next without waiting for the host; finish() ends the last. With times, the host's
        walls (launch, the previous StreamEnd, StreamBegin) and a pair of events around the
        replay (its input copies included) on the worker's stream."""
        t0 = time.perf_counter()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if times is not None else []
        if ev:
            ev[0].record()
        logits = self.d.run(ids, pos)
        if ev:
            ev[1].record()
        t1 = time.perf_counter()
        self.finish()
        t2 = time.perf_counter()
        try:
            self.pending = self.ch.begin(self.pairs, *self.d.bufs)
        except BaseException:
            self.ch.release()  # the replay waits on a step the daemon will not run
            raise
        t3 = time.perf_counter()
        if times is not None:
            for k, v in (("replay_launch_us", t1 - t0), ("end_prev_us", t2 - t1),
                         ("begin_us", t3 - t2)):
                times.setdefault(k, []).append(v * 1e6)
            times.setdefault("events", []).append(ev)
        return logits

    def finish(self) -> None:
        """StreamEnd of the step launched last, if any."""
        if self.pending is not None:
            st, self.pending = self.pending, None
            self.ch.end(st)


def run_attnd_graph(model: Any, client: attnd.Client, ids: torch.Tensor,
                    new: int) -> dict[str, float]:
    """Prefill through the Generator's stream channel, then `new` decode steps whose forward is
    one CUDA graph replay each (the first decode step runs eagerly, before the capture)."""
    model.config._attn_implementation = at.NAME
    with at.Generator(model, client, max_step_tokens=ids.numel(), stream=True) as gen, \
            torch.inference_mode():
        seqs = [gen.add(row.tolist(), new + 1) for row in ids]
        t0 = sync_time()
        gen.step()  # every prompt whole, each gets its first token
        t1 = sync_time()
        gd = GraphDecode(gen, seqs, next(model.parameters()).dtype, ids.device)
        toks = torch.tensor([s.tokens[-1] for s in seqs], device=ids.device)
        pos = torch.tensor([len(s.tokens) - 1 for s in seqs], device=ids.device)
        times: dict[str, list[Any]] = {}
        for k in range(new):
            if k == 0:
                logits = gd.eager_step(toks[None], (pos + k)[None])
            else:
                logits = gd.replay_step(toks[None], (pos + k)[None], times)
            toks = logits.argmax(-1)
            if k == 0:
                torch.cuda.synchronize()
                gd.d.capture()
                t2 = sync_time()  # decode timed from the first replayed step
        gd.finish()
        t3 = sync_time()
    # where a step's wall goes (medians over the replayed steps, us): the GPU idles outside
    # replay_gpu_us (SDPA's replays queue back to back instead)
    gpu = [a.elapsed_time(b) * 1e3 for a, b in times.pop("events")]  # synchronized above
    step = {k: round(statistics.median(v), 1) for k, v in times.items()}
    step["replay_gpu_us"] = round(statistics.median(gpu), 1)
    step["wall_us"] = round((t3 - t2) / (new - 1) * 1e6, 1)
    return {"prefill_s": t1 - t0, "decode_tok_s": ids.shape[0] * (new - 1) / (t3 - t2),
            "step": step}


def run_interleaved(model: Any, c: attnd.Client, ids: torch.Tensor,
                    new: int) -> dict[str, float]:
    """attnd-stream's and sdpa-static's eager decode steps in turn, one for one (which goes
    first alternates), each model's steps on its own cache: host-bound steps whose machine state
    drifts by +-20% from round to round compare within a step pair. Walls of the steps after the
    first two and before the last two (the Generator's unchained first and last steps)."""
    b, p = ids.shape
    cache = StaticCache(config=model.config, max_cache_len=(p + new + 1 + 63) // 64 * 64)
    tok = torch.empty((b, 1), dtype=torch.long, device=ids.device)
    model.config._attn_implementation = at.NAME
    with at.Generator(model, c, max_step_tokens=ids.numel(), stream=True,
                      run_ahead=True) as gen, torch.inference_mode():
        model.config._attn_implementation = SDPA_FOLD
        logits = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        model.config._attn_implementation = at.NAME
        for row in ids:
            gen.add(row.tolist(), new + 1)
        t0 = sync_time()
        gen.step()
        t1 = sync_time()

        def sdpa_step() -> None:
            nonlocal logits
            tok.copy_(logits[:, -1].argmax(-1, keepdim=True))
            logits = model(tok, past_key_values=cache, use_cache=True, logits_to_keep=1).logits

        steps = {"attnd": (at.NAME, gen.step), "sdpa": (SDPA_FOLD, sdpa_step)}
        walls: dict[str, list[float]] = {"attnd": [], "sdpa": []}
        for k in range(new):
            for name in ("attnd", "sdpa") if k % 2 == 0 else ("sdpa", "attnd"):
                model.config._attn_implementation, step = steps[name]
                t = time.perf_counter()
                step()
                walls[name].append(time.perf_counter() - t)
        gen.flush()
        torch.cuda.synchronize()
    mine, base = walls["attnd"][2:-2], walls["sdpa"][2:-2]
    return {"prefill_s": t1 - t0, "decode_tok_s": b / statistics.median(mine),
            "interleaved_sdpa_decode_tok_s": b / statistics.median(base),
            "interleaved_decode_vs_sdpa-static": statistics.median(base) / statistics.median(mine),
            "interleaved_step_pair_ratio_median": statistics.median(
                x / y for x, y in zip(base, mine))}


IMPLS = ("sdpa", "sdpa-static", "sdpa-static-graph", "attnd", "attnd-stream",
         "attnd-stream-graph", "attnd-generator-graph", "attnd-stream~sdpa-static")


def run(impl: str, model: Any, c: attnd.Client, ids: torch.Tensor, new: int) -> dict[str, float]:
    if impl == "sdpa":
        return run_sdpa(model, ids, new)
    if impl.startswith("sdpa-static"):
        return run_sdpa_static(model, ids, new, graph=impl == "sdpa-static-graph")
    if impl == "attnd-stream-graph":
        return run_attnd_graph(model, c, ids, new)
    if impl == "attnd-generator-graph":  # the product's path
        return run_attnd(model, c, ids, new, stream=True, graphs=True)
    if impl == "attnd-stream~sdpa-static":
        return run_interleaved(model, c, ids, new)
    return run_attnd(model, c, ids, new, stream=impl == "attnd-stream")


PAIRS = (("attnd-stream", "sdpa-static"), ("attnd-stream-graph", "sdpa-static-graph"),
         ("attnd", "sdpa"))


def round_ratios(rows: list[dict[str, Any]], shape: str, mine: str, base: str) -> list[float]:
    """mine's decode over base's, round by round, where both ran."""
    tok = {(r["impl"], r["repeat"]): r["decode_tok_s"] for r in rows
           if r["shape"] == shape and "error" not in r}
    return [tok[(mine, k)] / tok[(base, k)] for i, k in tok if i == mine and (base, k) in tok]


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per shape and impl: the median of every repeat's prefill and decode, and the decode and
    prefill ratios of each fair pair (PAIRS) from those medians; beside them the median of the
    pair's per-round decode ratios (a round's two runs share its machine state: steadier when
    rounds drift, as host-bound eager runs do)."""
    out: list[dict[str, Any]] = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        med: dict[str, dict[str, Any]] = {}
        for impl in dict.fromkeys(r["impl"] for r in rows if r["shape"] == shape):
            ok = [r for r in rows if r["shape"] == shape and r["impl"] == impl and "error" not in r]
            if not ok:
                continue
            med[impl] = {"shape": shape, "impl": impl, "median_of": len(ok),
                         "prefill_s": statistics.median(r["prefill_s"] for r in ok),
                         "decode_tok_s": statistics.median(r["decode_tok_s"] for r in ok),
                         "decode_runs": [round(r["decode_tok_s"], 1) for r in ok]}
            for key in (k for k in ok[0] if k.startswith("interleaved_")):
                med[impl][key] = statistics.median(r[key] for r in ok)
                med[impl][f"{key}_runs"] = [round(r[key], 3) for r in ok]
        for mine, base in PAIRS:
            if mine in med and base in med:
                med[mine][f"decode_vs_{base}"] = (med[mine]["decode_tok_s"]
                                                  / med[base]["decode_tok_s"])
                med[mine][f"prefill_vs_{base}"] = med[base]["prefill_s"] / med[mine]["prefill_s"]
                ratios = round_ratios(rows, shape, mine, base)
                if ratios:
                    med[mine][f"decode_vs_{base}_per_round"] = [round(x, 3) for x in ratios]
                    med[mine][f"decode_vs_{base}_round_median"] = statistics.median(ratios)
        out.extend(med.values())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--warm-rounds", type=int, default=1,
                    help="full-size rounds first, not counted (kernels, allocator, clocks)")
    ap.add_argument("--json")
    ap.add_argument("--label", default="")
    ap.add_argument("--impl", action="append", choices=IMPLS)
    a = ap.parse_args()
    at.register()
    register_sdpa_fold()
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(LlamaConfig(**LLAMA3_8B)).eval()
    rows: list[dict[str, Any]] = []
    impls = a.impl or list(IMPLS)
    with attnd.Client(a.url) as c:
        print(f"attnd {c.info['version']} ({c.backend}), spin_us {c.spin_us}, "
              f"channel {c.channel_active} {a.label}")
        for shape in a.shape or ["32x2048", "16x1024"]:
            b, p = (int(x) for x in shape.split("x"))
            ids = torch.randint(1, LLAMA3_8B["vocab_size"], (b, p), device="cuda")
            for rnd in range(a.warm_rounds + a.repeat):
                rep = rnd - a.warm_rounds  # < 0: a warm-up round
                k = rnd % len(impls)  # rotate the order so no impl always runs first
                for impl in impls[k:] + impls[:k]:
                    try:
                        r = run(impl, model, c, ids, a.new)
                    except Exception as e:  # noqa: BLE001  one impl failing ends not the bench
                        r = {"error": f"{type(e).__name__}: {e}"}
                    rows.append({"shape": shape, "impl": impl, "label": a.label, "repeat": rep,
                                 **r})
                    print(json.dumps(rows[-1]), flush=True)
    summary = medians([r for r in rows if r["repeat"] >= 0])
    for m in summary:
        print("median", json.dumps(m), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": rows, "medians": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
