"""HuggingFace transformers models with their attention served by attnd.

    import attnd, attnd.transformers
    attnd.transformers.register()                     # attn_implementation="attnd"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="attnd")
    with attnd.Client() as c:                         # a daemon on attnd.config.from_hf(...)
        gen = attnd.transformers.Generator(model, c)
        a, b = gen.add(prompt_a, 32), gen.add(prompt_b, 32)
        gen.run()                                     # continuous batching, one step per forward
        print(a.generated, b.generated)

Every attention call of the model becomes one Attend of the open step: the daemon keeps K/V in
its paged cache (the model runs with use_cache=False) and applies each layer's causal mask,
window, softcap, scale, ALiBi and sinks from its config. The Generator checks the daemon's whole
geometry, every layer's options included, against the model before the first step (and each
layer's call once against what the daemon reports for that layer); connect(model) opens a client
whose Hello the daemon refuses when it is configured for another model. With a CUDA daemon on
this host the Generator hands the layers over on the model's CUDA stream instead (a stream
channel, attnd.stream: no host round trip per layer; run the daemon and the engine under MPS).
The forward is packed (batch 1, each sequence's new tokens in turn, with their own position
ids), as the daemon's steps are. Models whose attention does not dispatch through transformers'
AttentionInterface get an adapter (Bloom); for any other, the
forward fails (and its step is aborted) naming the layers that never reached the daemon.
The Generator and Generation live in attnd.generate and are re-exported here.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import types
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from . import rotary
from .client import Client, Step
from .config import expectation, from_hf, sinks_of
from .region import Region
from .stream import StreamChannel, StreamStep

NAME = "attnd"
_current: contextvars.ContextVar[_Forward | None] = contextvars.ContextVar("attnd_forward",
                                                                           default=None)


def register() -> None:
    """Make attn_implementation="attnd" available to every transformers model (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, attention)


# ---------------------------------------------------------------------- one forward = one step
@dataclass
class _Forward:
    """What the attention calls of one forward need: the client, the step, the layers whose
    options were already checked against the daemon's (once per layer: checked is the caller's
    set) and a workspace region holding this step's Q/K/V/out."""

    client: Client
    step: Step
    checked: set[int]
    workspace: Region
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    attended: dict[int, int] = field(default_factory=dict)  # layer -> Attend calls
    channel: StreamChannel | None = None  # a stream channel's step: layers on the CUDA stream
    stream_step: StreamStep | None = None

    def check_complete(self) -> None:
        """Every layer attended exactly once (the daemon would commit zeros for a missed one)."""
        layers = range(self.client.geometry["num_layers"])
        missing = [i for i in layers if self.attended.get(i, 0) == 0]
        twice = [i for i in layers if self.attended.get(i, 0) > 1]
        if missing or twice:
            raise RuntimeError(f"step {self.step.id}: layers {missing} never reached the daemon, "
                               f"{twice} more than once: this model's attention does not go "
                               f"through AttentionInterface (add an adapter to ADAPTERS)")

    def staged(self, name: str, src: torch.Tensor) -> torch.Tensor:
        """src [T, H, D] copied into the workspace (the projections' outputs are not in a
        region); the buffer is carved once per step and reused by every layer."""
        buf = self.buffers.get(name)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
            buf = self.buffers[name] = self.workspace.tensor(tuple(src.shape), src.dtype)
        buf.copy_(src)
        return buf

    def carve(self, tokens: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """q, k, v, out of this step, carved before the forward (a stream step names them when
        it begins; every layer then copies its Q/K/V into them)."""
        g = self.client.geometry
        heads = (g["num_q_heads"], g["num_kv_heads"], g["num_kv_heads"], g["num_q_heads"])
        for name, h in zip(("q", "k", "v", "out"), heads):
            self.buffers[name] = self.workspace.tensor((tokens, h, g["head_size"]), dtype)
        return tuple(self.buffers[n] for n in ("q", "k", "v", "out"))

    def output(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        buf = self.buffers.get("out")
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = self.buffers["out"] = self.workspace.tensor(shape, dtype)
        return buf


@contextlib.contextmanager
def attending(client: Client, step: Step, workspace: Region,
              checked: set[int] | None = None, *, reset: bool = True,
              fw: _Forward | None = None) -> Iterator[None]:
    """Route the attention calls made inside the block (one forward) to `step`, staging Q/K/V
    in `workspace` (a region on the model's device, reset here unless reset=False). Each layer's
    call is checked against the daemon's options for that layer (window, softcap, scale, sinks)
    unless its index is in `checked` (a set kept across steps: checked once)."""
    if reset:
        workspace.reset()
    fw = fw or _Forward(client, step, set() if checked is None else checked, workspace)
    token = _current.set(fw)
    try:
        yield
    finally:
        _current.reset(token)
    fw.check_complete()


def _check_call(fw: _Forward, module: Any, query: torch.Tensor, key: torch.Tensor,
                scaling: float | None, kwargs: dict[str, Any]) -> int:
    g = fw.client.geometry
    layer = getattr(module, "layer_idx", None)
    if not isinstance(layer, int) or not 0 <= layer < g["num_layers"]:
        raise ValueError(f"attention module {type(module).__name__}: layer_idx {layer!r} is not "
                         f"one of the daemon's {g['num_layers']} layers")
    b, hq, t, d = query.shape
    if b != 1:
        raise ValueError(f"attnd attention takes packed input (batch 1, sequences one after the "
                         f"other), got batch {b}: drive the model with attnd.transformers.Generator")
    if t != fw.step.num_tokens:
        raise ValueError(f"layer {layer}: {t} tokens in the forward, {fw.step.num_tokens} in the step")
    if (hq, key.shape[1], d) != (g["num_q_heads"], g["num_kv_heads"], g["head_size"]):
        raise ValueError(f"layer {layer}: {hq} q / {key.shape[1]} kv heads of {d} in the model, "
                         f"the daemon has {g['num_q_heads']} / {g['num_kv_heads']} of "
                         f"{g['head_size']}")
    if layer not in fw.checked:
        _check_layer(g, layer, scaling if scaling is not None else d ** -0.5, kwargs)
        fw.checked.add(layer)
    if kwargs.get("dropout"):
        raise ValueError("attnd attention is for inference: dropout must be 0 (model.eval())")
    if kwargs.get("is_causal") is False:
        raise ValueError("attnd attention is causal self-attention (is_causal=False asked)")
    return layer


def _check_layer(g: dict[str, Any], layer: int, scaling: float, kwargs: dict[str, Any]) -> None:
    """The model's options for this layer's call against the daemon's for the layer."""
    lays = g.get("layers") or []
    lay = lays[layer] if lays else {"sliding_window": None, "softcap": None,
                                    "scale": g["scale"] or g["head_size"] ** -0.5, "sinks": None}
    window = int(kwargs.get("sliding_window") or 0)
    if lay["sliding_window"] is not None and window != lay["sliding_window"]:
        raise ValueError(f"layer {layer}: sliding window {window} in the model, "
                         f"{lay['sliding_window']} in the daemon")
    softcap = float(kwargs.get("softcap") or 0.0)
    if lay["softcap"] is not None and not math.isclose(softcap, lay["softcap"], rel_tol=1e-6):
        raise ValueError(f"layer {layer}: softcap {softcap} in the model, {lay['softcap']} in the "
                         "daemon")
    if not math.isclose(scaling, lay["scale"], rel_tol=1e-5):
        raise ValueError(f"layer {layer}: softmax scale {scaling} in the model, {lay['scale']} "
                         "in the daemon")
    s_aux = kwargs.get("s_aux")
    sinks = None if s_aux is None else s_aux.detach().float().cpu().reshape(-1).tolist()
    if not _same_floats(sinks, lay.get("sinks")):
        raise ValueError(f"layer {layer}: attention sinks {sinks} in the model, "
                         f"{lay.get('sinks')} in the daemon")


def _same_floats(a: list[float] | None, b: list[float] | None) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-30)
                                    for x, y in zip(a, b))


def attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, scaling: float | None = None,
              dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The AttentionInterface function: query [1, Hq, T, D], key/value [1, Hkv, T, D] (this
    step's new tokens) -> ([1, T, Hq, D], None)."""
    fw = _current.get()
    if fw is None:
        raise RuntimeError('attn_implementation="attnd" runs inside a daemon step: use '
                           "attnd.transformers.Generator (or the attending() context)")
    if attention_mask is not None:
        raise ValueError("attnd attention applies the daemon's causal mask; a custom "
                         "attention_mask cannot be honoured")
    layer = _check_call(fw, module, query, key, scaling, {**kwargs, "dropout": dropout})
    if fw.channel is not None and fw.stream_step is not None:
        # the daemon's stream waits for this layer's flag: copy, signal, wait, all on the
        # model's stream, no host round trip
        st = fw.stream_step
        out = fw.channel.attend(st, layer, query[0].transpose(0, 1), key[0].transpose(0, 1),
                                value[0].transpose(0, 1))
        fw.attended[layer] = fw.attended.get(layer, 0) + 1
        return out.unsqueeze(0), None
    q = fw.staged("q", query[0].transpose(0, 1))
    k = fw.staged("k", key[0].transpose(0, 1))
    v = fw.staged("v", value[0].transpose(0, 1))
    out = fw.output(tuple(q.shape), q.dtype)
    fw.client.attend(fw.step, layer, q, k, v, out=out)
    fw.attended[layer] = fw.attended.get(layer, 0) + 1
    return out.unsqueeze(0), None


# ---------------------------------------------------------------------- models without the interface
def _bloom_attention_forward(self: Any, hidden_states: torch.Tensor, residual: torch.Tensor,
                             alibi: torch.Tensor, attention_mask: torch.Tensor | None,
                             layer_past: Any = None, use_cache: bool = False,
                             output_attentions: bool = False, **kwargs: Any) -> tuple:
    """BloomAttention.forward with the daemon's attention (ALiBi is in its config); the
    original forward while the model runs another attn_implementation."""
    from transformers.models.bloom.modeling_bloom import dropout_add

    if self._attnd_config._attn_implementation != NAME:
        return self._attnd_forward(hidden_states, residual, alibi, attention_mask, layer_past,
                                   use_cache, output_attentions, **kwargs)

    b, s, _ = hidden_states.shape
    q, k, v = self._reshape(self.query_key_value(hidden_states))
    out, _ = attention(self, q, k, v, None, scaling=self.inv_norm_factor)
    output = self.dense(out.reshape(b, s, self.num_heads * self.head_dim))
    return dropout_add(output, residual, self.hidden_dropout, self.training), None


# attention classes that compute attention themselves, and the forward that replaces theirs
ADAPTERS = {"BloomAttention": _bloom_attention_forward}


def _rotary_target() -> tuple[torch.Tensor, torch.Tensor] | None:
    """The q/k tensors of the stream step the current forward hands its layers over in."""
    fw = _current.get()
    if fw is None or fw.channel is None or fw.stream_step is None:
        return None
    return fw.stream_step.q, fw.stream_step.k


def attach(model: Any) -> int:
    """Give the adapters to the model's attention modules that need one (idempotent; they
    defer to the original forward unless the model runs attn_implementation="attnd"), and let
    its rotary embedding write into a stream step's q/k (attnd.rotary); returns how many
    modules have an adapter."""
    rotary.fuse(model, _rotary_target)
    n = 0
    for m in model.modules():
        fwd = ADAPTERS.get(type(m).__name__)
        if fwd is None:
            continue
        if getattr(m, "pretraining_tp", 1) > 1 and getattr(m, "slow_but_exact", False):
            raise ValueError("Bloom's slow_but_exact tensor-parallel path is not served")
        if not hasattr(m, "_attnd_forward"):
            m._attnd_forward, m._attnd_config = m.forward, model.config
            m.forward = types.MethodType(fwd, m)
        n += 1
    return n


# ---------------------------------------------------------------------- the model's geometry
def model_expectation(model: Any, *, tp_size: int = 1, tp_rank: int = 0) -> dict[str, Any]:
    """What a daemon serving this model must be (attnd.config.expectation of from_hf, the
    model's own attention sinks included)."""
    sinks = sinks_of(model) or None
    geometry = from_hf(model.config, tp_size=tp_size, tp_rank=tp_rank, sinks=sinks)["geometry"]
    return expectation(geometry)


def connect(model: Any, url: str | None = None, *, tp_size: int = 1, tp_rank: int = 0,
            **kwargs: Any) -> Client:
    """A client whose Hello expects this model's geometry: the daemon refuses it
    (FAILED_PRECONDITION naming the first difference) when configured for another model."""
    return Client(url, expect=model_expectation(model, tp_size=tp_size, tp_rank=tp_rank),
                  **kwargs)


def __getattr__(name: str) -> Any:
    """Generator and Generation live in attnd.generate (imported on first use: no cycle)."""
    if name in ("Generator", "Generation"):
        from . import generate

        return getattr(generate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
