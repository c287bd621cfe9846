"""Batched generation through attnd: attnd.transformers.Generator (re-exported there).

Greedy, continuous batching over the daemon's paged cache: each Generator.step() is one daemon
step and one forward of a model made with attn_implementation="attnd" (attnd.transformers). With
a CUDA daemon on this host the layers are handed over on the model's CUDA stream (a stream
channel); run_ahead queues each decode step behind the one before, and cuda_graphs replays a
captured decode forward per batch size.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from .client import Client, Step
from .config import first_difference
from .region import Region
from .stream import StreamChannel, StreamStep
from .transformers import NAME, _Forward, attach, attending, model_expectation


@dataclass
class Generation:
    """One generation: seq_id in the daemon, the tokens so far (prompt, then generated), how
    many of them are in the daemon's cache, and the logits of each generated token when asked."""

    seq_id: int
    tokens: list[int]
    prompt_len: int
    max_new_tokens: int
    computed: int = 0
    logits: list[torch.Tensor] = field(default_factory=list)
    finished: bool = False

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def pending(self) -> int:
        """Known tokens not yet in the cache (the prompt's rest, or the last sampled token)."""
        return len(self.tokens) - self.computed


class _Decode:
    """The decode forward of `batch` sequences (one token each) with the stream channel's
    per-layer handoff inside, on step tensors carved once: run eagerly, or captured in a CUDA
    graph (capture()) and replayed. Every tensor a graph reads stays referenced here."""

    def __init__(self, gen: Generator, batch: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.gen = gen
        self.ids = torch.zeros((1, batch), dtype=torch.long, device=device)
        self.pos = torch.zeros((1, batch), dtype=torch.long, device=device)
        self.keep = torch.arange(batch, device=device)
        self.ws = gen._workspace_for(batch, dtype, device)
        self.ws.reset()  # the step tensors alias other steps': every step rewrites them first
        self.fw = _Forward(gen.client, Step(0, batch, (), ()), gen._checked, self.ws,
                           channel=gen._channel)
        self.bufs = self.fw.carve(batch, dtype)
        self.fw.stream_step = StreamStep(0, batch, (), *self.bufs)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def _forward(self) -> torch.Tensor:
        self.fw.attended.clear()
        with attending(self.gen.client, self.fw.step, self.ws, self.gen._checked, reset=False,
                       fw=self.fw):
            return self.gen.model(input_ids=self.ids, position_ids=self.pos, use_cache=False,
                                  logits_to_keep=self.keep).logits[0]

    def capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.logits = self._forward()
        self.graph = graph

    def run(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The step's logits [batch, vocab] for tokens ids at positions pos ([1, batch])."""
        self.ids.copy_(ids)
        self.pos.copy_(pos)
        if self.graph is None:
            return self._forward()
        self.graph.replay()
        assert self.logits is not None
        return self.logits


@dataclass
class _Readback:
    """A step's tokens (and logits) copied to pinned host memory behind the step on its stream:
    read after `ready`, not with .tolist(), which would wait for the next step queued behind."""

    tokens: torch.Tensor
    logits: torch.Tensor | None
    ready: torch.cuda.Event | None

    @classmethod
    def queue(cls, tokens: torch.Tensor, logits: torch.Tensor | None) -> _Readback:
        if tokens.device.type != "cuda":
            return cls(tokens, None if logits is None else logits.float(), None)
        host_tokens = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host_tokens.copy_(tokens, non_blocking=True)
        host_logits = None
        if logits is not None:
            host_logits = torch.empty(logits.shape, dtype=torch.float32, pin_memory=True)
            host_logits.copy_(logits.float(), non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return cls(host_tokens, host_logits, ready)

    def wait(self) -> None:
        if self.ready is not None:
            self.ready.synchronize()


@dataclass
class _Ahead:
    """A decode step on the GPU whose StreamEnd and tokens are still to come."""

    step: StreamStep
    plan: list[tuple[Generation, int]]
    pos: torch.Tensor  # [1, batch] its positions, on the GPU
    tokens: torch.Tensor  # [batch] its greedy tokens, on the GPU: the next step's input ids
    out: _Readback  # the same tokens (and its logits, keep_logits) for the host


def _release_on_failure(ch: StreamChannel, fut: Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        ch.release()


class Generator:
    """Greedy batched generation on the daemon's paged cache: each step() is one daemon step
    and one forward of the model over every unfinished sequence — decodes one token each,
    prompts in chunks while max_step_tokens allows (chunked prefill) — so sequences added
    between steps join the running batch (continuous batching). The model must have been made
    with attn_implementation="attnd" (register() first) and match the daemon's geometry.

    run_ahead (a stream channel and a model taking position_ids needed): a decode step (every
    sequence one token) returns while the GPU runs it; while the batch stays the same the next
    one is queued behind it, fed its tokens on the GPU, and the first one's StreamEnd and the
    next one's StreamBegin travel on the channel's thread meanwhile, so neither the host nor the
    GPU waits for the other between steps. A step's tokens then reach its Generation with the
    next step() (run() and flush() take them all). cuda_graphs (implies run_ahead; a CUDA model,
    capturable): decode steps of a batch size seen before replay a CUDA graph captured on the
    second step of that size (at most 16 sizes)."""

    def __init__(self, model: Any, client: Client, *, max_step_tokens: int | None = None,
                 keep_logits: bool = False, first_seq_id: int = 1, tp_size: int = 1,
                 tp_rank: int = 0, stream: bool | None = None, run_ahead: bool = False,
                 cuda_graphs: bool = False) -> None:
        impl = getattr(model.config, "_attn_implementation", None)
        if impl != NAME:
            raise ValueError(f'the model runs attn_implementation={impl!r}: load it with '
                             f'attn_implementation="{NAME}" (after attnd.transformers.register())')
        self.model, self.client = model.eval(), client
        self.expect = model_expectation(model, tp_size=tp_size, tp_rank=tp_rank)
        diff = first_difference(self.expect, client.geometry)
        if diff:
            raise ValueError(f"{diff} (this model's geometry: attnd.config.from_hf)")
        self._checked: set[int] = set()
        attach(model)
        limit = client.limits["max_step_tokens"]
        self.max_step_tokens = min(max_step_tokens or limit, limit)
        self.keep_logits = keep_logits
        self.seqs: list[Generation] = []
        self._ids = itertools.count(first_seq_id)
        params = inspect.signature(model.forward).parameters
        self._positions = "position_ids" in params
        self._workspace: Region | None = None
        # stream: hand layers over on the model's CUDA stream (a stream channel). None: when
        # the daemon runs CUDA on this host (ipc://) and the model is on a CUDA device
        device = next(model.parameters()).device
        self.stream = (client.backend == "cuda" and client.url.startswith("ipc://")
                       and device.type == "cuda") if stream is None else stream
        self._channel: StreamChannel | None = None
        self.run_ahead = run_ahead or cuda_graphs
        if self.run_ahead and not (self.stream and self._positions):
            raise ValueError("run_ahead / cuda_graphs need a stream channel (a CUDA daemon on "
                             "this host, or stream=True) and a model taking position_ids")
        if cuda_graphs and device.type != "cuda":
            raise ValueError("cuda_graphs: the model is not on a CUDA device")
        self.cuda_graphs = cuda_graphs
        self._decodes: dict[int, _Decode] = {}  # batch -> its decode forward
        self._ahead: _Ahead | None = None
        self.chained = 0  # decode steps queued behind the one before, fed its tokens on the GPU
        # the step buffers (registered with the daemon) and the stream channel now, as an
        # engine sets up at start: the first step would otherwise pay their allocation, CUDA IPC
        # export and the daemon's mapping (a region of max_step_tokens rows)
        self._workspace_for(self.max_step_tokens, next(model.parameters()).dtype, device)
        self._stream_channel()

    # ------------------------------------------------------------------ sequences
    def add(self, prompt: Sequence[int], max_new_tokens: int) -> Generation:
        """A new sequence; its prompt is prefilled by the next steps."""
        if not prompt:
            raise ValueError("empty prompt")
        s = Generation(next(self._ids), [int(t) for t in prompt], len(prompt), max_new_tokens)
        self.client.create(s.seq_id)
        self.seqs.append(s)
        return s

    def fork(self, parent: Generation, next_token: int, max_new_tokens: int) -> Generation:
        """A sequence sharing parent's cache (copy-on-write) that continues with next_token
        instead of what the parent generates; its `generated` starts with next_token."""
        self.flush()
        if parent.finished:
            raise ValueError(f"sequence {parent.seq_id} finished (its cache is freed)")
        s = Generation(next(self._ids), parent.tokens[:parent.computed] + [int(next_token)],
                      parent.computed, max_new_tokens, computed=parent.computed)
        self.client.fork(parent.seq_id, s.seq_id)
        self.seqs.append(s)
        return s

    def close(self) -> None:
        """Free every unfinished sequence in the daemon; close the stream channel and release
        the step buffers."""
        with contextlib.suppress(Exception):  # closing: a failed last step changes nothing
            self.flush()
        self._decodes.clear()  # they wait on the channel's words
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._workspace is not None:
            self._workspace.close()
            self._workspace = None
        for s in self.seqs:
            if not s.finished:
                s.finished = True
                self.client.free(s.seq_id)

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ steps
    def _plan(self) -> list[tuple[Generation, int]]:
        """Decodes first (one token each), then prompt chunks while the budget lasts."""
        live = [s for s in self.seqs if not s.finished]
        plan = [(s, 1) for s in live if s.pending == 1]
        budget = self.max_step_tokens - len(plan)
        for s in live:
            if s.pending > 1 and budget > 0:
                n = min(s.pending, budget)
                plan.append((s, n))
                budget -= n
        return plan

    def _workspace_for(self, tokens: int, dtype: torch.dtype, device: torch.device) -> Region:
        g = self.client.geometry
        per_token = (2 * g["num_q_heads"] + 2 * g["num_kv_heads"]) * g["head_size"]
        need = 4 * 256 + self.max_step_tokens * per_token * torch.finfo(dtype).bits // 8
        ws = self._workspace
        if ws is None or ws.size < need or ws.device != _device_name(device):
            if ws is not None:
                ws.close()
            ws = self._workspace = self.client.alloc(need, device)
        return ws

    def step(self) -> bool:
        """One daemon step over the scheduled sequences; False when nothing was left to do."""
        if self._ahead is not None and self._chain():
            return True
        self.flush()
        plan = self._plan()
        if not plan:
            return False
        device = next(self.model.parameters()).device
        if (self.run_ahead and all(s.pending == 1 for s, _ in plan)
                and self._stream_channel() is not None):
            self._launch(plan, torch.tensor([[s.tokens[s.computed] for s, _ in plan]],
                                            device=device),
                         torch.tensor([[s.computed for s, _ in plan]], device=device))
            return True
        # through numpy: a whole prompt batch is ~10x faster than torch.tensor of a list
        ids = np.fromiter(itertools.chain.from_iterable(s.tokens[s.computed:s.computed + n]
                                                        for s, n in plan), dtype=np.int64)
        ends = list(itertools.accumulate(n for _, n in plan))
        sample = [i for i, (s, n) in enumerate(plan) if s.computed + n == len(s.tokens)]
        dtype = next(self.model.parameters()).dtype
        kwargs: dict[str, Any] = {
            "input_ids": torch.from_numpy(ids)[None].to(device), "use_cache": False,
            "logits_to_keep": torch.tensor([ends[i] - 1 for i in sample], dtype=torch.long,
                                           device=device)}
        if self._positions:
            pos = np.concatenate([np.arange(s.computed, s.computed + n) for s, n in plan])
            kwargs["position_ids"] = torch.from_numpy(pos)[None].to(device)
        ws = self._workspace_for(len(ids), dtype, device)
        seqs = [(s.seq_id, n) for s, n in plan]
        with torch.inference_mode():
            if self._stream_channel() is not None:
                logits = self._forward_stream(seqs, ws, len(ids), dtype, kwargs)
            else:
                with self.client.step(seqs) as st, attending(self.client, st, ws, self._checked):
                    logits = self.model(**kwargs).logits[0]
        self._take(plan, sample, logits, logits.argmax(-1).tolist())
        return True

    def flush(self) -> None:
        """End the decode step still running ahead, if any, and take its tokens."""
        a, self._ahead = self._ahead, None
        if a is None:
            return
        assert self._channel is not None
        self._channel.end(a.step)  # failed: the library released the replays queued behind
        self._take_ahead(a)

    def _take_ahead(self, a: _Ahead) -> None:
        a.out.wait()
        self._take(a.plan, range(len(a.plan)), a.out.logits, a.out.tokens.tolist())

    def _take(self, plan: list[tuple[Generation, int]], sample: Sequence[int],
              logits: torch.Tensor | None, next_tokens: list[int]) -> None:
        """The step's tokens (rows of `sample`) into its sequences; finished ones freed."""
        for s, n in plan:
            s.computed += n
        for row, i in enumerate(sample):
            s = plan[i][0]
            s.tokens.append(next_tokens[row])
            if self.keep_logits and logits is not None:
                s.logits.append(logits[row].to("cpu", torch.float32, copy=True))
            if len(s.generated) >= s.max_new_tokens:
                s.finished = True
                self.client.free(s.seq_id)

    def _launch(self, plan: list[tuple[Generation, int]], ids: torch.Tensor,
                pos: torch.Tensor) -> None:
        """Decode step `plan` (tokens ids at positions pos, [1, batch] on the GPU) queued on the
        GPU while the channel's thread ends the step ahead, if any, and begins this one (the
        stream may run ahead of its StreamBegin); this step is then ahead until flush()."""
        dev, dtype = ids.device, next(self.model.parameters()).dtype
        d = self._decode_for(len(plan), dtype, dev)  # a capture, if one is due, comes first
        ch = self._channel
        assert ch is not None
        prev, self._ahead = self._ahead, None
        ended = ch.end_async(prev.step) if prev is not None else None
        begun = ch.begin_async([(s.seq_id, 1) for s, _ in plan], *d.bufs)
        for fut in (ended, begun):  # a failure there releases the waits queued here at once
            if fut is not None:
                fut.add_done_callback(functools.partial(_release_on_failure, ch))
        failed: BaseException | None = None
        tokens = out = None
        try:
            with torch.inference_mode():
                logits = d.run(ids, pos)
                tokens = logits.argmax(-1)
                out = _Readback.queue(tokens, logits if self.keep_logits else None)
        except BaseException as e:  # noqa: BLE001  settled below, then raised
            failed = e
        st = self._settle(prev, ended, begun, failed)
        assert tokens is not None and out is not None
        self._ahead = _Ahead(st, plan, pos, tokens, out)

    def _settle(self, prev: _Ahead | None, ended: Future[None] | None,
                begun: Future[StreamStep], failed: BaseException | None) -> StreamStep:
        """The step ahead's StreamEnd (its tokens taken) and the new step's StreamBegin, sent
        while that step was queued (a failure of either released the caller's queued waits: the
        channel failed, the outputs are garbage) and raised; so is the forward's (failed), its
        step aborted. The tokens are read once StreamBegin went out, from their host copy (the
        read waits for that copy, not for the step queued behind), and the channel's thread
        needs no GIL from it then."""
        ch = self._channel
        assert ch is not None
        end_error = ended.exception() if ended is not None else None  # waits
        begin_error = begun.exception()
        st = begun.result() if begin_error is None else None
        if end_error is not None:
            if st is not None:
                with contextlib.suppress(Exception):
                    ch.end(st, abort=True)
            raise end_error
        if prev is not None:
            self._take_ahead(prev)
        if begin_error is not None:
            raise begin_error
        assert st is not None
        if failed is not None:
            with contextlib.suppress(Exception):
                ch.end(st, abort=True)
            raise failed
        return st

    def _chain(self) -> bool:
        """Queue the next decode step behind the one ahead, fed its tokens on the GPU, when the
        batch stays the same (no sequence finishes with them, none joins). False: the next step
        cannot follow it so."""
        a = self._ahead
        assert a is not None
        live = [s for s in self.seqs if not s.finished]
        if [s for s, _ in a.plan] != live or any(len(s.generated) + 1 >= s.max_new_tokens
                                                 for s in live):
            return False
        self._launch([(s, 1) for s in live], a.tokens[None], a.pos + 1)
        self.chained += 1
        return True

    def _decode_for(self, batch: int, dtype: torch.dtype, device: torch.device) -> _Decode:
        """The decode forward of this batch size; captured the second time it is asked for
        (cuda_graphs, at most 16 sizes)."""
        d = self._decodes.get(batch)
        if d is None:
            d = self._decodes[batch] = _Decode(self, batch, dtype, device)
        elif (self.cuda_graphs and d.graph is None
              and sum(x.graph is not None for x in self._decodes.values()) < 16):
            with torch.inference_mode():
                d.capture()
        return d

    def _stream_channel(self) -> StreamChannel | None:
        """The open stream channel (a new one after a failed step, its graphs dropped), or None
        without streams."""
        if self._channel is not None and self._channel.failed:
            self._decodes.clear()
            self._channel.close()
            self._channel = None
        if self.stream and self._channel is None:
            self._channel = self.client.stream()
        return self._channel

    def _forward_stream(self, seqs: list[tuple[int, int]], ws: Region, tokens: int,
                        dtype: torch.dtype, kwargs: dict[str, Any]) -> torch.Tensor:
        """One forward with its layers handed over on the model's CUDA stream: StreamBegin
        (every layer queued daemon-side), the forward, StreamEnd (abort when it raised)."""
        ws.reset()
        ch = self._channel
        assert ch is not None
        fw = _Forward(self.client, Step(0, tokens, (), tuple(seqs)), self._checked, ws,
                      channel=ch)
        with ch.step(seqs, *fw.carve(tokens, dtype)) as st:
            fw.step = Step(st.id, st.num_tokens, st.query_start_loc, tuple(seqs))
            fw.stream_step = st
            with attending(self.client, fw.step, ws, self._checked, reset=False, fw=fw):
                return self.model(**kwargs).logits[0]

    def run(self) -> list[Generation]:
        """Step until every sequence has its tokens; returns the sequences."""
        while self.step():
            pass
        return self.seqs


def _device_name(device: torch.device) -> str:
    return "cpu" if device.type == "cpu" else f"{device.type}:{device.index or 0}"
