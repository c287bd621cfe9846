"""Stream channels from Python (attnd.stream) against a real daemon: on the CPU backend the
per-layer handoff runs on the emulated streams (numpy arrays in shm regions, the "stream" is the
calling thread); with ATTND_TEST_BACKEND=cuda (GPU machine, MPS or not) torch CUDA tensors,
torch streams, and a decode step captured in a CUDA graph and replayed. Outputs through a
channel are bit-identical to the same steps through Client.attend; a stalled step times out and
fails the channel; INLINE tensors are refused."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import attnd
from daemon import Daemon

CUDA = os.environ.get("ATTND_TEST_BACKEND") == "cuda"
L, HQ, HK, D = 2, 8, 2, 64
GEOMETRY = {"num_layers": L, "num_q_heads": HQ, "num_kv_heads": HK, "head_size": D,
            "block_size": 16, "cache_dtype": "bf16", "num_blocks": 256, "max_blocks_per_seq": 64}
STEPS = [[(1, 13), (2, 7)], [(1, 1), (2, 1)], [(1, 1), (2, 1)]]
TMAX = 32


@pytest.fixture
def daemon():
    with Daemon(GEOMETRY, limits={"stream_timeout_ms": 1000}) as d:
        yield d


def inputs(k: int, layer: int, t: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(100 * k + layer)
    return tuple(rng.uniform(-1, 1, (t, h, D)).astype(np.float32) for h in (HQ, HK, HK))


class Buffers:
    """q, k, v, out for TMAX rows in registered regions: shm arrays, or CUDA tensors."""

    def __init__(self, c: attnd.Client) -> None:
        if CUDA:
            import torch

            self.all = [c.empty((TMAX, h, D), torch.float32, "cuda") for h in (HQ, HK, HK, HQ)]
        else:
            r = c.region(4 * TMAX * (2 * HQ + 2 * HK) * D)
            self.all = [r.array((TMAX, h, D)) for h in (HQ, HK, HK, HQ)]

    def rows(self, t: int) -> list:
        return [b[:t] for b in self.all]


def put(dst, src: np.ndarray) -> None:
    if CUDA:
        import torch

        dst.copy_(torch.from_numpy(src))
    else:
        dst[...] = src


def host(x) -> np.ndarray:
    return x.cpu().numpy().copy() if CUDA else np.array(x)


def run_attend(c: attnd.Client) -> list[np.ndarray]:
    b, outs = Buffers(c), []
    for s in (1, 2):
        c.create(s)
    for k, seqs in enumerate(STEPS):
        t = sum(n for _, n in seqs)
        q, kk, v, o = b.rows(t)
        with c.step(seqs) as st:
            for layer in range(L):
                for dst, src in zip((q, kk, v), inputs(k, layer, t)):
                    put(dst, src)
                c.attend(st, layer, q, kk, v, out=o)
                outs.append(host(o))
    return outs


def run_stream(c: attnd.Client, ch: attnd.StreamChannel,
               early: bool = False) -> list[np.ndarray]:
    """The steps through ch; early: each step's layer 0 filled and signalled while its
    StreamBegin travels (a replayed graph launched before the reply)."""
    b, outs = Buffers(c), []
    for s in (1, 2):
        c.create(s)
    for k, seqs in enumerate(STEPS):
        t = sum(n for _, n in seqs)
        q, kk, v, o = b.rows(t)
        if early:
            for dst, src in zip((q, kk, v), inputs(k, 0, t)):
                put(dst, src)
            pending = ch.begin_async(seqs, q, kk, v, o)
            ch.signal(0)
            st = pending.result()
            ch.wait(0)
            outs.append(host(o))
        else:
            st = ch.begin(seqs, q, kk, v, o)
        assert st.num_tokens == t
        for layer in range(1 if early else 0, L):
            for dst, src in zip((q, kk, v), inputs(k, layer, t)):
                put(dst, src)
            outs.append(host(ch.attend(st, layer)))
        ch.end(st)
    return outs


@pytest.mark.parametrize("early", [False, True], ids=["begin_first", "work_queued_first"])
def test_stream_steps_equal_attend_bit_for_bit(daemon, early):
    with attnd.Client(daemon.url) as a, attnd.Client(daemon.url) as b, a.stream() as ch:
        got, want = run_stream(a, ch, early), run_attend(b)
        assert len(got) == len(want) == len(STEPS) * L
        for g, w in zip(got, want):
            assert np.array_equal(g, w)
        assert not ch.failed
        assert a.query(1)["num_tokens"] == 15


def test_a_failed_begin_behind_queued_work_is_released(daemon):
    with attnd.Client(daemon.url) as c, c.stream() as ch:
        b = Buffers(c)
        pending = ch.begin_async([(77, 1)], *b.rows(1))  # no such sequence
        ch.signal(0)
        with pytest.raises(attnd.AttndError, match="77"):
            pending.result()
        ch.release()
        if CUDA:  # the queued wait passes: the stream drains
            import torch

            ch.wait(0)
            torch.cuda.synchronize()
        else:
            with pytest.raises(attnd.AttndError, match="released"):
                ch.wait(0)
        assert ch.failed


def test_a_stalled_step_times_out_and_fails_the_channel(daemon):
    with attnd.Client(daemon.url) as c:
        ch = c.stream()
        b = Buffers(c)
        c.create(1)
        st = ch.begin([(1, 1)], *b.rows(1))
        ch.attend(st, 0)  # layer 1 is never signalled
        with pytest.raises(attnd.AttndError) as e:
            ch.end(st)
        assert e.value.name == "TIMEOUT" and "stream_timeout_ms" in e.value.message
        assert ch.failed
        assert c.query(1)["num_tokens"] == 0
        with pytest.raises(attnd.AttndError, match="open a new one"):
            ch.begin([(1, 1)], *b.rows(1))
        ch.close()
        with c.stream() as again:  # a new channel works from the sequences as they were
            with again.step([(1, 1)], *b.rows(1)) as st:
                for layer in range(L):
                    again.attend(st, layer)
        assert c.query(1)["num_tokens"] == 1


def test_inline_tensors_are_refused(daemon):
    with attnd.Client(daemon.url) as c, c.stream() as ch:
        b = Buffers(c)
        c.create(1)
        q, k, v, o = b.rows(1)
        inline = np.zeros((1, HQ, D), np.float32)
        with pytest.raises(attnd.AttndError, match="q: INLINE"):
            ch.begin([(1, 1)], inline, k, v, o)


@pytest.mark.skipif(CUDA, reason="numpy views; torch's copy onto its own bytes as another dtype "
                    "is not defined")
def test_a_step_tensor_viewed_as_another_dtype_is_copied(daemon):
    """A view of the step's q as int32 names the same bytes but other values: attend copies it
    (converted), as any other source; the step's own tensors are taken in place."""
    with attnd.Client(daemon.url) as c, c.stream() as ch:
        c.create(1)
        q, k, v, o = Buffers(c).rows(1)
        for dst, src in zip((q, k, v), inputs(0, 0, 1)):
            put(dst, src)
        st = ch.begin([(1, 1)], q, k, v, o)
        ch.attend(st, 0, q, k, v)
        assert ch.copied == 0
        bits = q.view(np.int32)
        want = bits.astype(np.float32)
        ch.attend(st, 1, bits)
        assert ch.copied == 1
        assert np.array_equal(q, want)
        ch.end(st)


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need the GPU (ATTND_TEST_BACKEND=cuda)")
@pytest.mark.parametrize("ahead", [False, True], ids=["in_turn", "one_step_ahead"])
def test_a_captured_decode_step_replays(daemon, ahead):
    """The worker's side of a decode step (copies, signal and wait of every layer) captured
    once in a CUDA graph and replayed each step: the same outputs as uncaptured steps; ahead:
    each replay launched before the previous step's StreamEnd and its own StreamBegin, outputs
    kept on the GPU (no host sync between steps)."""
    import torch

    with attnd.Client(daemon.url) as a, attnd.Client(daemon.url) as b, a.stream() as ch:
        want = run_attend(b)
        buf = Buffers(a)
        for s in (1, 2):
            a.create(s)
        got = []
        t0 = sum(n for _, n in STEPS[0])
        with ch.step(STEPS[0], *buf.rows(t0)) as st:  # the prefill, uncaptured
            for layer in range(L):
                for dst, src in zip(buf.rows(t0)[:3], inputs(0, layer, t0)):
                    put(dst, src)
                got.append(host(ch.attend(st, layer)))
        src = [[torch.empty((2, h, D), device="cuda") for h in (HQ, HK, HK)] for _ in range(L)]
        outs = [torch.empty((2, HQ, D), device="cuda") for _ in range(L)]
        q, k, v, o = buf.rows(2)
        s = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=s):
            for layer in range(L):
                ch.attend(ch_step_stub(2, q, k, v, o), layer, *src[layer], out=outs[layer],
                          stream=s)
        pending, kept = None, []
        for k_ in (1, 2):  # replay per decode step, only StreamBegin / StreamEnd on the host
            for layer in range(L):
                for dst, x in zip(src[layer], inputs(k_, layer, 2)):
                    put(dst, x)
            if ahead:
                graph.replay()
                if pending is not None:
                    ch.end(pending)
                pending = ch.begin(STEPS[k_], q, k, v, o)
            else:
                st = ch.begin(STEPS[k_], q, k, v, o)
                graph.replay()
                ch.end(st)
            kept.extend(x.clone() for x in outs)
        if pending is not None:
            ch.end(pending)
        got.extend(host(x) for x in kept)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert np.array_equal(g, w)


@pytest.mark.skipif(not CUDA, reason="the o words' reset copy is the CUDA side's")
def test_a_release_holds_for_a_step_queued_ahead(daemon):
    """A worker whose stream queued the next step's waits before this step's last wait ran,
    and whose next StreamBegin then fails: its release must outlast this step's reset of the
    o words, so that the queued waits pass and the stream drains."""
    import torch

    with attnd.Client(daemon.url) as c, c.stream() as ch:
        b = Buffers(c)
        c.create(1)
        st = ch.begin([(1, 1)], *b.rows(1))
        for layer in range(L - 1):
            ch.attend(st, layer)
        ch.signal(L - 1)
        torch.cuda._sleep(1_000_000_000)  # ~0.5 s: the release comes before the last wait
        ch.wait(L - 1)  # the step's last wait, and its reset of the o words
        ch.signal(0)  # the next step, queued ahead
        ch.wait(0)
        done = torch.cuda.Event()
        done.record()
        ch.end(st)  # the daemon ran every layer
        with pytest.raises(attnd.AttndError, match="77"):
            ch.begin([(77, 1)], *b.rows(1))  # no such sequence: the next step never runs
        ch.release()
        assert ch.failed
        deadline = time.monotonic() + 20
        while not done.query() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert done.query(), "the step queued ahead still waits: the reset erased the release"


def ch_step_stub(t: int, q, k, v, o) -> attnd.StreamStep:
    """The tensors a captured attend() copies into: those of every replayed step."""
    return attnd.StreamStep(0, t, (), q, k, v, o)


def tiny_llama() -> tuple:
    """A 3-layer Llama (random weights, on the GPU with ATTND_TEST_BACKEND=cuda) made for the
    attnd attention, its daemon geometry, and three prompts (5, 23, 40 tokens)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import attnd.config
    import attnd.transformers as at

    at.register()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=256)).eval().to("cuda" if CUDA else "cpu")
    model.config._attn_implementation = at.NAME
    geometry = attnd.config.from_hf(model.config, backend="cpu", num_blocks=128)["geometry"]
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, 512, (n,), generator=g).tolist() for n in (5, 23, 40)]
    return model, geometry, prompts


def test_generator_through_a_stream_channel_matches_attend():
    """attnd.transformers.Generator with its layers handed over on the stream channel: the same
    tokens and logits, bit for bit, as through Client.attend (prefill in chunks, decode), its
    rotary embedding writing q and k straight into the step's tensors (attnd.rotary); also
    with run_ahead (each decode step queued behind the last, fed its tokens on the device, its
    StreamEnd and the next StreamBegin on the channel's thread)."""
    import torch

    import attnd.transformers as at

    model, geometry, prompts = tiny_llama()
    runs = []
    with Daemon(geometry) as d:
        for stream, ahead in ((False, False), (True, False), (True, True)):
            with attnd.Client(d.url) as c, at.Generator(model, c, max_step_tokens=32,
                                                        keep_logits=True, stream=stream,
                                                        run_ahead=ahead) as gen:
                seqs = [gen.add(p, 12) for p in prompts]
                gen.run()
                assert (gen._channel is not None) == stream
                assert (gen.chained > 0) == ahead  # decode steps queued behind the last
                if stream:  # q and k rotated straight into the step's tensors: v copied alone
                    assert gen._channel.copied == gen._channel.attended > 0
                runs.append(seqs)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert a.generated == b.generated
            assert all(torch.equal(x, y) for x, y in zip(a.logits, b.logits))


def test_run_ahead_a_failed_begin_releases_and_raises():
    """A decode step launched ahead whose StreamBegin fails (a sequence freed behind the
    Generator's back): its queued waits are released at once, the error names the sequence, the
    channel is failed and the next step opens a new one."""
    import attnd.transformers as at

    model, geometry, prompts = tiny_llama()
    with Daemon(geometry, limits={"stream_timeout_ms": 1000}) as d, attnd.Client(d.url) as c, \
            at.Generator(model, c, max_step_tokens=64, stream=True, run_ahead=True) as gen:
        seqs = [gen.add(p, 12) for p in prompts[:2]]
        while gen.chained == 0:
            gen.step()
        gen.flush()
        first = gen._channel
        c.free(seqs[0].seq_id)
        t0 = time.monotonic()
        with pytest.raises(attnd.AttndError) as e:
            gen.step()
        assert e.value.name == "NOT_FOUND" and f"{seqs[0].seq_id} not found" in e.value.message
        assert time.monotonic() - t0 < 5, "released, not timed out"
        assert first.failed
        seqs[0].finished = True  # the engine drops it; the other goes on over a new channel
        gen.run()
        assert gen._channel is not first and len(seqs[1].generated) == 12


def test_decode_graphs_replay_the_eager_steps():
    """Generator(cuda_graphs=True): decode steps of a batch size seen before replay a captured
    CUDA graph, the next replay queued behind the last and fed its tokens on the GPU while the
    batch stays the same; the same tokens as the eager steps, logits within float rounding; a
    replayed step is still on the GPU when step() returns (its tokens reach the host by a copy
    queued before the next step, not by a read that waits for it). Without a CUDA stream channel
    the option is refused."""
    import torch

    import attnd.transformers as at

    model, geometry, prompts = tiny_llama()
    with Daemon(geometry) as d, attnd.Client(d.url) as c:
        if not CUDA:
            with pytest.raises(ValueError, match="cuda_graphs"):
                at.Generator(model, c, cuda_graphs=True)
            with pytest.raises(ValueError, match="cuda_graphs: the model is not on a CUDA"):
                at.Generator(model, c, cuda_graphs=True, stream=True)
            return
        runs = []
        for graphs in (False, True):
            with at.Generator(model, c, max_step_tokens=32, keep_logits=True,
                              cuda_graphs=graphs) as gen:
                seqs = [gen.add(p, 12) for p in prompts]
                busy = []
                while gen.step():
                    busy.append(gen._ahead is not None
                                and not torch.cuda.current_stream().query())
                runs.append(seqs)
                assert any(busy) == graphs
                assert any(x.graph is not None for x in gen._decodes.values()) == graphs
                assert (gen.chained > 0) == graphs  # replays fed their tokens on the GPU
    for a, b in zip(*runs):
        assert a.generated == b.generated
        worst = max(float((x - y).abs().max()) for x, y in zip(a.logits, b.logits))
        assert worst < 1e-4


def other_client_work(url: str) -> None:
    """What must not wait for another session's stream: register and unregister regions (CUDA
    IPC on the GPU, each a fresh 32 MiB allocation), open and close stream channels, and Attend
    steps over host tensors in shared memory, larger each round (the daemon stages them in
    device memory on the GPU, growing its staging buffer: a free and an allocation)."""
    with attnd.Client(url) as b:
        keep = []  # every round's buffer stays alive: no allocation is reused
        for r, t in enumerate((8, 64, 250)):
            region = b.alloc(32 << 20, "cuda") if CUDA else b.region(1 << 20)
            keep.append(region)
            with b.stream():
                pass
            hb = b.region(4 * t * (2 * HQ + 2 * HK) * D)
            q, k, v, o = (hb.array((t, h, D)) for h in (HQ, HK, HK, HQ))
            b.create(10 + r)
            with b.step([(10 + r, t)]) as st:
                for layer in range(L):
                    for dst, src in zip((q, k, v), inputs(7, layer, t)):
                        dst[...] = src
                    b.attend(st, layer, q, k, v, out=o)
                    assert np.isfinite(o).all() and np.abs(o).max() > 0
            region.close()
            hb.close()


def test_a_waiting_stream_stalls_no_other_client():
    """A channel's stream waits mid-step (layer 0 handed over, layer 1 not yet) while another
    client registers and unregisters regions, opens and closes channels and runs Attend steps
    that need new staging: all of it completes while the stream waits (no call of the daemon's
    waits for the whole device), then the worker goes on and its outputs equal Client.attend's."""
    import threading

    with Daemon(GEOMETRY, limits={"stream_timeout_ms": 60000}) as d, \
            attnd.Client(d.url) as a, attnd.Client(d.url) as ref:
        want = run_attend(ref)[:L]
        ch, buf = a.stream(), Buffers(a)
        for s in (1, 2):
            a.create(s)
        t = sum(n for _, n in STEPS[0])
        q, k, v, o = buf.rows(t)
        st = ch.begin(STEPS[0], q, k, v, o)
        got = []
        for dst, src in zip((q, k, v), inputs(0, 0, t)):
            put(dst, src)
        got.append(host(ch.attend(st, 0)))  # the daemon's stream now waits for layer 1
        errors: list[BaseException] = []

        def other() -> None:
            try:
                other_client_work(d.url)
            except BaseException as e:  # noqa: BLE001  reported below
                errors.append(e)

        th = threading.Thread(target=other, daemon=True)
        th.start()
        th.join(30)
        stalled = th.is_alive()
        for layer in range(1, L):  # go on either way: a stalled daemon is freed before failing
            for dst, src in zip((q, k, v), inputs(0, layer, t)):
                put(dst, src)
            got.append(host(ch.attend(st, layer)))
        ch.end(st)
        th.join(30)
        assert not stalled, "the other client's calls waited for the stalled stream"
        assert not errors, errors
        assert not ch.failed
        for g, w in zip(got, want):
            assert np.array_equal(g, w)
        ch.close()


def test_status_says_whether_the_daemon_runs_under_mps(daemon):
    """The Status RPC carries what /status and the log say: MPS on or off on a GPU (the log's
    event=mps active=), unknown (-1) on the CPU backend."""
    import re

    with attnd.Client(daemon.url) as c:
        mps = c.status()["mps"]
    if not CUDA:
        assert mps == -1
        return
    logged = re.search(r"event=mps active=(-?\d+)", daemon.logs())
    assert mps in (0, 1)
    if logged is not None:
        assert mps == int(logged.group(1))
    else:  # below log level info only "not under MPS" (a warning) shows
        assert mps == 1
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):  # the GPU run starts the MPS control daemon
        assert mps == 1
