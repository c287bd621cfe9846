#!/usr/bin/env python3
"""Stream channels on the GPU (issue 16), against a CUDA daemon at --url (under MPS or not):

  e2e       two workers on stream channels, one killed mid-step (its layer 0 handed over, the
            daemon's stream waiting on layer 1): the other's outputs must be bit-identical to a
            solo run, the daemon must stay up, release the dead step and get every block back
  overhead  the decode-step per-layer cost of the handoff: a step of L layers whose worker only
            signals and waits (serial) against the same step with every layer signalled first
            (the daemon's kernels back to back), with and without a projection-sized GEMM per
            layer on the worker, the worker's step captured in a CUDA graph, and Client.attend
            (a host round trip per layer) for comparison; CUDA events on the worker's stream

    python3 bench/stream_gpu.py e2e --url ipc:///tmp/a.sock
    python3 bench/stream_gpu.py overhead --url ipc:///tmp/a.sock [--batch 32 --ctx 2048]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import torch

import attnd

D = 128


def shapes(c: attnd.Client) -> tuple[int, int, int]:
    g = c.geometry
    return g["num_layers"], g["num_q_heads"], g["num_kv_heads"]


def buffers(c: attnd.Client, rows: int) -> list[torch.Tensor]:
    _, hq, hk = shapes(c)
    return [c.empty((rows, h, D), torch.bfloat16, "cuda") for h in (hq, hk, hk, hq)]


def layer_inputs(k: int, layer: int, t: int, hq: int, hk: int) -> list[torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(1000 * k + layer)
    return [torch.randn((t, h, D), generator=g, device="cuda", dtype=torch.bfloat16)
            for h in (hq, hk, hk)]


STEPS = [[(1, 100), (2, 37)], [(1, 1), (2, 1)], [(1, 1), (2, 1)], [(1, 1), (2, 1)]]


def run_worker(c: attnd.Client, ch: attnd.StreamChannel, steps=STEPS, first=0,
               bufs=None) -> list[torch.Tensor]:
    """Steps through the channel; every layer's output copied out (on the GPU)."""
    L, hq, hk = shapes(c)
    bufs = bufs or buffers(c, 256)
    outs = []
    for k, seqs in enumerate(steps, start=first):
        t = sum(n for _, n in seqs)
        rows = [b[:t] for b in bufs]
        with ch.step(seqs, *rows) as st:
            for layer in range(L):
                out = ch.attend(st, layer, *layer_inputs(k, layer, t, hq, hk))
                outs.append(out.clone())
    torch.cuda.synchronize()
    return [o.cpu() for o in outs]


def child(url: str) -> None:
    """The worker that dies: a step over one sequence, layer 0 handed over, then it waits."""
    with attnd.Client(url) as c:
        ch = c.stream()
        L, hq, hk = shapes(c)
        bufs = buffers(c, 64)
        c.create(1)
        st = ch.begin([(1, 50)], *[b[:50] for b in bufs])
        ch.attend(st, 0, *layer_inputs(9, 0, 50, hq, hk))
        torch.cuda.synchronize()
        print("READY", c.info["session"], flush=True)
        time.sleep(600)


def status(c: attnd.Client) -> dict:
    return c.status()


def e2e(url: str, log: str | None) -> dict:
    res: dict = {}
    with attnd.Client(url) as solo:
        total_blocks = status(solo)["blocks_free"]
        for s in (1, 2):
            solo.create(s)
        with solo.stream() as ch:
            want = run_worker(solo, ch)
        for s in (1, 2):
            solo.free(s)
    # the survivor's regions and channel are set up first: while the child's step waits on the
    # GPU only per-step requests reach the daemon
    with attnd.Client(url) as b, b.stream() as ch:
        for s in (1, 2):
            b.create(s)
        bufs = buffers(b, 256)
        kid = subprocess.Popen([sys.executable, os.path.abspath(__file__), "child", "--url", url],
                               stdout=subprocess.PIPE, text=True)
        line = kid.stdout.readline().strip()
        res["child_mid_step"] = line.startswith("READY")
        print("child:", line, flush=True)
        got = run_worker(b, ch, STEPS[:1], 0, bufs)
        print("survivor: step 0 done; killing the child", flush=True)
        kid.send_signal(signal.SIGKILL)
        kid.wait()
        got += run_worker(b, ch, STEPS[1:], 1, bufs)
        res["layers_compared"] = len(got)
        res["bit_identical"] = len(got) == len(want) and all(torch.equal(x, y)
                                                             for x, y in zip(got, want))
        res["worst_abs_diff"] = max(float((x.float() - y.float()).abs().max())
                                    for x, y in zip(got, want))
        for s in (1, 2):
            b.free(s)
        for _ in range(100):  # the dead session is reclaimed after limits.reclaim_timeout_ms
            st = status(b)
            if st["blocks_free"] == total_blocks and st["num_sessions"] == 1:
                break
            time.sleep(0.05)
        res["blocks_back"] = st["blocks_free"] == total_blocks
        res["sessions_left"] = st["num_sessions"]
        with b.stream() as again:  # the daemon still serves new channels
            for s in (1, 2):
                b.create(s)
            res["after_kill_identical"] = all(torch.equal(x, y) for x, y in
                                              zip(run_worker(b, again), want))
    if log:
        with open(log) as f:
            text = f.read()
        res["release_logged"] = 'why="a disconnect"' in text
        res["device_failed_logged"] = "event=device_failed" in text
    return res


# ---------------------------------------------------------------------- per-layer overhead
def timed(fn, reps: int) -> float:
    """Median ms over reps of fn(a, b): fn records CUDA events a and b on the current stream
    around the GPU work it times (host calls before and after stay outside)."""
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn(a, b)
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def around(a, b, body) -> None:
    a.record()
    body()
    b.record()


class Decode:
    """B sequences of ctx tokens in the daemon; decode steps of one token each."""

    def __init__(self, c: attnd.Client, batch: int, ctx: int) -> None:
        self.c, self.batch = c, batch
        self.L, self.hq, self.hk = shapes(c)
        self.ch = c.stream()
        self.bufs = buffers(c, max(batch, 1))
        big = buffers(c, batch * ctx) if ctx else None
        for s in range(1, batch + 1):
            c.create(s)
        if ctx:  # prefill: every layer signalled at once
            with self.ch.step([(s, ctx) for s in range(1, batch + 1)], *big) as st:
                for layer in range(self.L):
                    self.ch.signal(layer)
                for layer in range(self.L):
                    self.ch.wait(layer)
        self.seqs = [(s, 1) for s in range(1, batch + 1)]
        self.rows = [b[:batch] for b in self.bufs]
        hidden = self.hq * D
        self.x = torch.randn((batch, hidden), device="cuda", dtype=torch.bfloat16)
        self.w_qkv = torch.randn((hidden, (self.hq + 2 * self.hk) * D), device="cuda",
                                 dtype=torch.bfloat16) * 0.01
        self.w_o = torch.randn((hidden, hidden), device="cuda", dtype=torch.bfloat16) * 0.01

    def layers(self, serial: bool, gemm: bool) -> None:
        ch = self.ch
        if not serial:
            for layer in range(self.L):
                ch.signal(layer)
        for layer in range(self.L):
            if gemm:
                torch.matmul(self.x, self.w_qkv)
            if serial:
                ch.signal(layer)
            ch.wait(layer)
            if gemm:
                torch.matmul(self.x, self.w_o)

    def step(self, a, b, body) -> None:
        """StreamBegin, the timed body, StreamEnd (the daemon ran every layer)."""
        st = self.ch.begin(self.seqs, *self.rows)
        around(a, b, body)
        self.ch.end(st)

    def gemm_only(self) -> None:
        for _ in range(self.L):
            torch.matmul(self.x, self.w_qkv)
            torch.matmul(self.x, self.w_o)


def overhead(url: str, batch: int, ctx: int, reps: int) -> dict:
    with attnd.Client(url) as c:
        d = Decode(c, batch, ctx)
        print(f"overhead: {batch} x {ctx} prefilled", flush=True)
        L = d.L
        res = {"batch": batch, "ctx": ctx, "layers": L}
        for name, serial, gemm in (("presignalled", False, False), ("serial", True, False),
                                   ("presignalled_gemm", False, True), ("serial_gemm", True, True)):
            body = lambda: d.layers(serial, gemm)  # noqa: E731
            timed(lambda a, b: d.step(a, b, body), 2)  # warm-up
            res[name + "_ms"] = timed(lambda a, b: d.step(a, b, body), reps)
        res["gemm_only_ms"] = timed(lambda a, b: around(a, b, d.gemm_only), reps)
        # the worker's step captured once, replayed per step (StreamBegin / StreamEnd on the host)
        s = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for layer in range(L):
                torch.matmul(d.x, d.w_qkv)
                d.ch.signal(layer, s)
                d.ch.wait(layer, s)
                torch.matmul(d.x, d.w_o)

        def graph_step(a=None, b=None) -> None:
            st = d.ch.begin(d.seqs, *d.rows)
            if a is None:
                g.replay()
            else:
                around(a, b, g.replay)
            d.ch.end(st)

        graph_step()
        res["graph_gemm_ms"] = timed(graph_step, reps)
        host = []
        for _ in range(reps):  # host wall time of a whole graph step, RPCs included
            torch.cuda.synchronize()
            t = time.perf_counter()
            graph_step()
            torch.cuda.synchronize()
            host.append((time.perf_counter() - t) * 1e3)
        res["graph_gemm_host_ms"] = sorted(host)[len(host) // 2]
        # Client.attend: a host round trip (and a stream sync) per layer
        q, k, v, o = d.rows

        def attend_step() -> None:
            with c.step(d.seqs) as st:
                for layer in range(L):
                    torch.matmul(d.x, d.w_qkv)
                    c.attend(st, layer, q, k, v, out=o)
                    torch.matmul(d.x, d.w_o)

        attend_step()
        res["attend_gemm_ms"] = timed(lambda a, b: around(a, b, attend_step), reps)
        per = lambda key: res[key] / L * 1e3  # noqa: E731  us per layer
        res["us_per_layer"] = {k[:-3]: round(per(k), 2) for k in list(res) if k.endswith("_ms")}
        res["handoff_overhead_us_per_layer"] = round(per("serial_ms") - per("presignalled_ms"), 2)
        res["overhead_over_kernels_and_gemm_us_per_layer"] = round(
            per("serial_gemm_ms") - per("presignalled_ms") - per("gemm_only_ms"), 2)
        res["graph_overhead_us_per_layer"] = round(
            per("graph_gemm_ms") - per("presignalled_ms") - per("gemm_only_ms"), 2)
        d.ch.close()
        for s_ in range(1, batch + 1):
            c.free(s_)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["e2e", "overhead", "child"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--log")
    ap.add_argument("--batch", type=int, action="append")
    ap.add_argument("--ctx", type=int, action="append")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    import faulthandler

    faulthandler.dump_traceback_later(70)  # where it hangs, if it does
    torch.cuda.init()
    torch.empty(1, device="cuda")  # a current context in this thread for the channel
    if a.what == "child":
        child(a.url)
        return 0
    if a.what == "e2e":
        res = [e2e(a.url, a.log)]
    else:
        res = [overhead(a.url, b, x, a.reps)
               for b, x in zip(a.batch or [32, 8], a.ctx or [2048, 512])]
    for r in res:
        print(json.dumps(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
