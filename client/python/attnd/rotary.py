"""Rotary embeddings written straight into a stream step's q/k tensors.

A model's attention rotates its queries and keys (transformers' `apply_rotary_pos_emb`) into
fresh tensors, which the stream channel then copies into the step's q/k tensors, every layer:
at a 32 x 2048 prefill of a Llama-3-8B shape that is ~0.45 ms of the layer's ~0.56 ms of copies
(H100, bench/RESULTS.md). fuse() gives the model's modeling module a rotation that, inside a
stream step whose tensors fit, writes its results into those tensors (the same operations, so
the same bits), and the channel skips copying a tensor onto itself. A module is patched only
when its own function gives the standard rotation's bits on a probe (Llama, Mistral, Qwen2,
Gemma2 share it; a partial or interleaved rotation keeps its own function).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch

# the current forward's step tensors (q [T, Hq, D], k [T, Hkv, D]), or None outside a step
Target = Callable[[], "tuple[torch.Tensor, torch.Tensor] | None"]


def standard(rotate_half: Callable[[torch.Tensor], torch.Tensor], q: torch.Tensor,
             k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             q_out: torch.Tensor | None = None,
             k_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' apply_rotary_pos_emb (unsqueeze_dim 1), optionally into q_out / k_out."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (torch.add(q * cos, rotate_half(q) * sin, out=q_out),
            torch.add(k * cos, rotate_half(k) * sin, out=k_out))


def _is_standard(fn: Callable[..., Any], rotate_half: Callable[..., Any]) -> bool:
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 5, 8, generator=g), torch.randn(1, 2, 5, 8, generator=g)
    cos, sin = torch.randn(1, 5, 8, generator=g), torch.randn(1, 5, 8, generator=g)
    try:
        got = fn(q, k, cos, sin)
    except Exception:  # noqa: BLE001  another signature: not the standard rotation
        return False
    want = standard(rotate_half, q, k, cos, sin)
    return all(isinstance(x, torch.Tensor) and x.shape == y.shape and torch.equal(x, y)
               for x, y in zip(got, want))


def _into_step(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
               target: Target) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The step's q/k as [1, H, T, D] views when the rotation's results fit them exactly."""
    dst = target()
    if dst is None:
        return None
    sq, sk = dst
    t = sq.shape[0]
    fits = (tuple(q.shape) == (1, sq.shape[1], t, sq.shape[2])
            and tuple(k.shape) == (1, sk.shape[1], t, sk.shape[2])
            and torch.result_type(q, cos) == sq.dtype == sk.dtype == torch.result_type(k, cos)
            and sq.device == q.device == sk.device)
    return (sq.unsqueeze(0).transpose(1, 2), sk.unsqueeze(0).transpose(1, 2)) if fits else None


def _fused(original: Callable[..., Any], rotate_half: Callable[..., Any],
           target: Target) -> Callable[..., Any]:
    def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                             sin: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = None if args or kwargs else _into_step(q, k, cos, target)
        if out is None:
            return original(q, k, cos, sin, *args, **kwargs)
        return standard(rotate_half, q, k, cos, sin, *out)

    apply_rotary_pos_emb._attnd_original = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


def fuse(model: Any, target: Target) -> int:
    """Patch the modeling modules of model's attention layers (idempotent); returns how many
    of them rotate into the step's tensors."""
    names = {type(m).__module__ for m in model.modules() if hasattr(m, "layer_idx")}
    n = 0
    for mod in filter(None, (sys.modules.get(name) for name in sorted(names))):
        fn, rot = getattr(mod, "apply_rotary_pos_emb", None), getattr(mod, "rotate_half", None)
        if fn is None or rot is None:
            continue
        if hasattr(fn, "_attnd_original"):
            n += 1
        elif _is_standard(fn, rot):
            mod.apply_rotary_pos_emb = _fused(fn, rot, target)
            n += 1
    return n
