"""attnd.rotary: a model's standard rotary embedding writes straight into a stream step's q/k
tensors (the same bits as its own function), falls back to its own function outside a step or
when the tensors do not fit, and a module with another rotation is left alone."""

from __future__ import annotations

import sys
import types

import pytest

torch = pytest.importorskip("torch")

from attnd import rotary  # noqa: E402


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def llama_rotation(q, k, cos, sin, unsqueeze_dim=1):  # transformers' modeling_llama's
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def partial_rotation(q, k, cos, sin, unsqueeze_dim=1):  # only the first half of each head
    h = q.shape[-1] // 2
    cq, ck = llama_rotation(q[..., :h], k[..., :h], cos[..., :h], sin[..., :h], unsqueeze_dim)
    return torch.cat((cq, q[..., h:]), -1), torch.cat((ck, k[..., h:]), -1)


def model_in(name: str, fn) -> tuple[types.ModuleType, torch.nn.Module]:
    """A modeling module `name` holding fn, and a model whose attention layer's class is in it."""
    mod = types.ModuleType(name)
    mod.apply_rotary_pos_emb, mod.rotate_half = fn, rotate_half
    sys.modules[name] = mod
    model = torch.nn.Module()
    model.attn = type("Attention", (torch.nn.Module,), {"__module__": name})()
    model.attn.layer_idx = 0
    return mod, model


def inputs(t: int = 6, hq: int = 4, hk: int = 2, d: int = 8, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, t, hq, d, generator=g).to(dtype).transpose(1, 2)  # [1, H, T, D] views
    k = torch.randn(1, t, hk, d, generator=g).to(dtype).transpose(1, 2)
    cos, sin = (torch.randn(1, t, d, generator=g).to(dtype) for _ in range(2))
    return q, k, cos, sin


def test_the_standard_rotation_writes_into_the_step_tensors():
    mod, model = model_in("attnd_test_modeling_std", llama_rotation)
    q, k, cos, sin = inputs()
    want = llama_rotation(q, k, cos, sin)
    step: list = [None]
    assert rotary.fuse(model, lambda: step[0]) == 1
    assert rotary.fuse(model, lambda: step[0]) == 1  # idempotent: patched once
    assert mod.apply_rotary_pos_emb._attnd_original is llama_rotation
    got = mod.apply_rotary_pos_emb(q, k, cos, sin)  # outside a step: its own function
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    sq = torch.full((6, 4, 8), 7.0, dtype=torch.bfloat16)
    sk = torch.zeros(6, 2, 8, dtype=torch.bfloat16)
    step[0] = (sq, sk)
    got = mod.apply_rotary_pos_emb(q, k, cos, sin)
    assert got[0].data_ptr() == sq.data_ptr() and got[1].data_ptr() == sk.data_ptr()
    assert all(torch.equal(a, b) for a, b in zip(got, want))  # the same bits
    assert torch.equal(sq, want[0][0].transpose(0, 1))
    assert torch.equal(sk, want[1][0].transpose(0, 1))
    step[0] = (torch.zeros(5, 4, 8, dtype=torch.bfloat16), sk)  # 5 rows for 6 tokens: no fit
    got = mod.apply_rotary_pos_emb(q, k, cos, sin)
    assert got[0].data_ptr() != step[0][0].data_ptr() and torch.equal(got[0], want[0])
    step[0] = (sq.float(), sk.float())  # another dtype: no fit
    got = mod.apply_rotary_pos_emb(q, k, cos, sin)
    assert got[0].dtype == torch.bfloat16 and torch.equal(got[0], want[0])


def test_another_rotation_is_left_alone():
    mod, model = model_in("attnd_test_modeling_partial", partial_rotation)
    assert rotary.fuse(model, lambda: None) == 0
    assert mod.apply_rotary_pos_emb is partial_rotation
