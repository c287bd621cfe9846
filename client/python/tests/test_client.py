"""The package against a real daemon (CPU backend): every op checked against numpy, numpy /
ml_dtypes / CPU torch tensors by reference in shm regions (strided views too) and INLINE,
steps as a context manager, errors with the daemon's codes, the layout check, the waiting
strategy and the environment variables."""

from __future__ import annotations

import os
import subprocess
import sys

import cffi
import ml_dtypes
import numpy as np
import pytest
import torch

import attnd
from attnd import _cdef, _lib
from daemon import Daemon
from reference import attention, linear

GEOMETRY = {"num_layers": 2, "num_q_heads": 8, "num_kv_heads": 2, "head_size": 64,
            "block_size": 16, "cache_dtype": "bf16", "num_blocks": 256,
            "max_blocks_per_seq": 64}


@pytest.fixture
def daemon():
    with Daemon(GEOMETRY, linear={"slots": 4, "heads": 2, "head_dim": 32}) as d:
        yield d


@pytest.fixture
def client(daemon):
    with attnd.Client(daemon.url) as c:
        yield c


def bf16_round(x: np.ndarray) -> np.ndarray:
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def test_layout_check_names_a_drifted_field():
    lib = _lib.load()
    _lib.check_layout(lib)  # the package's own declarations match
    drifted = cffi.FFI()
    drifted.cdef(_cdef.CDEF.replace("    uint32_t region;\n    uint64_t offset;\n",
                                    "    uint64_t offset;\n    uint32_t region;\n", 1))
    with pytest.raises(_lib.LayoutError, match=r"attnd_ref\.(offset|region)"):
        _lib.check_layout(drifted.dlopen(os.environ.get(_lib.LIB_ENV) or lib_path()), drifted)


def lib_path() -> str:
    return next(_lib._candidates())


def test_import_needs_no_torch(daemon):
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np, attnd\n"
            f"c = attnd.Client({daemon.url!r})\n"
            "r = c.region(1 << 16); q = r.array((1, 8, 64)); q[:] = 1\n"
            "c.create(7)\n"
            "with c.step([(7, 1)]) as st:\n"
            "    for layer in range(2): out = c.attend(st, layer, q, r.array((1, 2, 64)), "
            "r.array((1, 2, 64)))\n"
            "assert out.shape == (1, 8, 64)\n"
            "print('ok', 'torch' in sys.modules and sys.modules['torch'] is not None)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok False"


def test_attend_strided_views_in_a_region_and_lse(client):
    g = client.geometry
    hq, hkv, d = g["num_q_heads"], g["num_kv_heads"], g["head_size"]
    region = client.region(1 << 22)
    rng = np.random.default_rng(1)
    client.create(1)
    client.create(2)
    keys = {1: [], 2: []}
    for plan in ([(1, 11), (2, 4)], [(1, 1), (2, 1)], [(1, 3), (2, 1)]):
        with client.step(plan) as st:
            region.reset()
            # one fused projection [T, Hq + 2 Hkv, D]: q, k, v are strided views of it
            qkv = region.array((st.num_tokens, hq + 2 * hkv, d))
            qkv[:] = rng.standard_normal(qkv.shape, dtype=np.float32)
            q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
            assert region.holds(q) and not q.flags["C_CONTIGUOUS"]
            out = region.array((st.num_tokens, hq, d))
            lse = region.array((hq, st.num_tokens))
            for layer in range(g["num_layers"]):
                got, got_lse = client.attend(st, layer, q, k, v, out=out, lse=lse)
                assert got is out and got_lse is lse
                if layer == 0:
                    for i, (s, _) in enumerate(st.seqs):
                        rows = st.rows(i)
                        keys[s].append((bf16_round(k[rows]), bf16_round(v[rows])))
                        ks = np.concatenate([x for x, _ in keys[s]])
                        vs = np.concatenate([y for _, y in keys[s]])
                        ref, ref_lse = attention(q[rows], ks, vs, len(ks) - len(q[rows]),
                                                 d ** -0.5)
                        assert np.abs(out[rows] - ref).max() < 1e-4
                        assert np.abs(lse[:, rows] - ref_lse).max() < 1e-4
    assert {s["seq_id"]: s["num_tokens"] for s in client.seqs()} == {1: 15, 2: 6}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_attend_cpu_torch_tensors_in_a_region(client, dtype):
    g = client.geometry
    region = client.region(1 << 20)
    t = 6
    q = region.tensor((t, g["num_q_heads"], g["head_size"]), dtype)
    k = region.tensor((t, g["num_kv_heads"], g["head_size"]), dtype)
    v = region.tensor((t, g["num_kv_heads"], g["head_size"]), dtype)
    out = region.tensor(tuple(q.shape), dtype)
    gen = torch.Generator().manual_seed(2)
    for x in (q, k, v):
        x.copy_(torch.randn(x.shape, generator=gen))
    client.create(3)
    with client.step([(3, t)]) as st:
        for layer in range(g["num_layers"]):
            client.attend(st, layer, q, k, v, out=out)
    ref, _ = attention(q.float().numpy(), k.to(torch.bfloat16).float().numpy(),
                       v.to(torch.bfloat16).float().numpy(), 0, g["head_size"] ** -0.5)
    bound = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    assert np.abs(out.float().numpy() - ref).max() < bound


def test_inline_tensors_and_ml_dtypes(client):
    g = client.geometry
    rng = np.random.default_rng(3)
    q = rng.standard_normal((3, g["num_q_heads"], g["head_size"])).astype(ml_dtypes.bfloat16)
    k = rng.standard_normal((3, g["num_kv_heads"], g["head_size"])).astype(ml_dtypes.bfloat16)
    v = rng.standard_normal((3, g["num_kv_heads"], g["head_size"])).astype(ml_dtypes.bfloat16)
    client.create(4)
    with client.step([(4, 3)]) as st:
        for layer in range(g["num_layers"]):
            out, lse = client.attend(st, layer, q, k, v, lse=True)  # INLINE both ways
    assert out.dtype == ml_dtypes.bfloat16 and lse.shape == (g["num_q_heads"], 3)
    ref, ref_lse = attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                             0, g["head_size"] ** -0.5)
    assert np.abs(out.astype(np.float32) - ref).max() < 2e-2
    assert np.abs(lse - ref_lse).max() < 1e-3


def test_step_aborts_on_exception_and_commits_otherwise(client):
    g = client.geometry
    client.create(5)
    q = np.ones((4, g["num_q_heads"], g["head_size"]), np.float32)
    kv = np.ones((4, g["num_kv_heads"], g["head_size"]), np.float32)
    with pytest.raises(KeyError):
        with client.step([(5, 4)]) as st:
            client.attend(st, 0, q, kv, kv)
            raise KeyError("engine failed mid-step")
    assert client.query(5)["num_tokens"] == 0 and client.query(5)["step"] == 0
    with client.step([(5, 4)]) as st:
        for layer in range(g["num_layers"]):
            client.attend(st, layer, q, kv, kv)
    assert client.query(5)["num_tokens"] == 4
    with pytest.raises(attnd.AttndError) as e:  # the aborted step is gone
        client.end_step(st)
    assert e.value.name == "NOT_FOUND" and e.value.remote


def test_errors_carry_code_field_and_origin(client):
    with pytest.raises(attnd.AttndError) as e:
        client.query(99)
    assert (e.value.name, e.value.remote) == ("NOT_FOUND", True)
    assert "seq_id" in e.value.message and "99" in e.value.message
    client.create(6)
    with pytest.raises(attnd.AttndError) as e:
        client.create(6)
    assert e.value.name == "ALREADY_EXISTS"
    with client.step([(6, 2)]) as st:
        g = client.geometry
        bad_q = np.zeros((2, g["num_q_heads"] + 1, g["head_size"]), np.float32)
        kv = np.zeros((2, g["num_kv_heads"], g["head_size"]), np.float32)
        with pytest.raises(attnd.AttndError) as e:
            client.attend(st, 0, bad_q, kv, kv)
        assert e.value.name == "INVALID_ARGUMENT" and "q.shape" in e.value.message
        for layer in range(g["num_layers"]):
            client.attend(st, layer, bad_q[:, :-1], kv, kv)
    with pytest.raises(TypeError, match="float64"):
        client.attend(st, 0, np.zeros((1, 8, 64)), kv, kv)
    with pytest.raises(TypeError, match="CUDA tensor"):
        client.region_from_tensor(torch.zeros(4))


def test_merge_matches_the_lse_formula(client):
    rng = np.random.default_rng(4)
    t, h, d = 5, 3, 32
    po, so = (rng.standard_normal((t, h, d)).astype(np.float32) for _ in range(2))
    pl, sl = (rng.standard_normal((h, t)).astype(np.float32) for _ in range(2))
    pl[0, 0] = -np.inf  # a fully masked prefix row
    out, lse = client.merge(po, pl, so, sl, out_lse=True)
    m = np.maximum(pl, sl)
    wp, ws = np.exp(pl - m), np.exp(sl - m)
    ref = (po * wp.T[..., None] + so * ws.T[..., None]) / (wp + ws).T[..., None]
    assert np.abs(out - ref).max() < 1e-5
    assert np.abs(lse - (m + np.log(wp + ws))).max() < 1e-5


def test_varlen_and_blocksparse(client):
    rng = np.random.default_rng(5)
    lens = [7, 20]
    cu = np.array([0, 7, 27], np.int32)
    q = rng.standard_normal((27, 4, 32)).astype(np.float16)
    k = rng.standard_normal((27, 2, 32)).astype(np.float16)
    v = rng.standard_normal((27, 2, 32)).astype(np.float16)
    out = client.varlen(q, k, v, cu, cu, causal=True)
    for b, n in enumerate(lens):
        rows = slice(cu[b], cu[b + 1])
        ref, _ = attention(q[rows].astype(np.float32), k[rows].astype(np.float32),
                           v[rows].astype(np.float32), 0, 32 ** -0.5)
        assert np.abs(out[rows] - ref).max() < 2e-3
    # a full lower-triangular block layout (16-token blocks) is plain causal attention
    rows_ = -(-max(lens) // 16)
    crow = np.array([[0] + [sum(range(1, r + 2)) for r in range(rows_)]] * 4, np.int32)
    col = np.array([[c for r in range(rows_) for c in range(r + 1)]] * 4, np.int32)
    bs = client.blocksparse(q, k, v, cu, cu, crow, col, block_size=16)
    assert np.abs(bs - out).max() < 2e-3


def test_linear_prefill_then_decode_follow_the_recurrence(client):
    h, d, n = 2, 32, 9
    rng = np.random.default_rng(6)
    slopes = np.array([0.1, 0.5], np.float32)
    q, k, v = (rng.standard_normal((1, h, n, d)).astype(np.float32) * 0.3 for _ in range(3))
    client.create(8)
    out = client.linear_prefill(0, [8], q, k, v, slopes)
    ref, state = linear(q[0], k[0], v[0], slopes, np.zeros((h, d, d)))
    assert np.abs(out[0] - ref).max() < 1e-4
    q1, k1, v1 = (rng.standard_normal((2, h, d)).astype(np.float32) * 0.3 for _ in range(3))
    out1 = client.linear_decode(0, [8, 0], q1, k1, v1, slopes)  # seq 0 = padding
    ref1, _ = linear(q1[0][:, None], k1[0][:, None], v1[0][:, None], slopes, state)
    assert np.abs(out1[0] - ref1[:, 0]).max() < 1e-4
    assert not out1[1].any()


def test_waiting_strategy_follows_the_backend(daemon, monkeypatch):
    assert attnd.choose_spin_us("cpu") == -1
    assert attnd.choose_spin_us("cuda") == 0
    assert attnd.choose_spin_us("cpu", 500) == 500
    monkeypatch.setenv("ATTND_SPIN_US", "250")
    assert attnd.choose_spin_us("cuda") == 250
    monkeypatch.delenv("ATTND_SPIN_US")
    with attnd.Client(daemon.url) as c:
        assert c.backend == "cpu" and c.spin_us == -1 and c.channel_active
    with attnd.Client(daemon.url, spin_us=100, channel_slots=-1) as c:
        assert c.spin_us == 100 and not c.channel_active


def test_url_and_token_from_the_environment(monkeypatch):
    with Daemon(GEOMETRY, server={"token": "s3cret"}) as d:
        monkeypatch.setenv("ATTND_URL", d.url)
        with pytest.raises(attnd.AttndError) as e:
            attnd.Client()
        assert e.value.name == "PERMISSION_DENIED"
        monkeypatch.setenv("ATTND_TOKEN", "s3cret")
        with attnd.Client() as c:
            assert c.url == d.url and c.info["session"] > 0


def test_empty_allocates_a_registered_tensor(client):
    t = client.empty((4, 8, 64), torch.bfloat16)
    assert t.shape == (4, 8, 64) and t.dtype == torch.bfloat16
    assert any(r.holds(t) for r in client._regions)


def test_registering_memory_that_is_not_cuda_fails_cleanly(client):
    """By pointer, through the driver: no driver (CI) -> UNAVAILABLE naming it; a host pointer
    -> INVALID_ARGUMENT naming the pointer. The session goes on."""
    host = np.zeros(64, np.uint8)
    with pytest.raises(attnd.AttndError) as e:
        client._check(client._lib.attnd_client_region_register_cuda_ptr(
            client._c, client._lib.attnd_client_region_next_id(client._c),
            _lib.ffi.cast("void *", host.ctypes.data), 64, _lib.ffi.NULL))
    if e.value.name == "UNAVAILABLE":
        assert "no CUDA driver" in str(e.value)
    else:
        assert e.value.name == "INVALID_ARGUMENT" and "is not CUDA device memory" in str(e.value)
    assert client.seqs() == []


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@CUDA
def test_a_registered_cuda_tensor_goes_back_to_torch(client):
    """Registered and closed, a CUDA buffer is torch's again (no IPC limbo), and a worker that
    registered one exits without torch's warning about shared CUDA tensors."""
    before = torch.cuda.memory_allocated()
    t = torch.ones(1 << 20, device="cuda")
    r = client.region_from_tensor(t)
    assert r.holds(t) and r.holds(t[5:9]) and not r.holds(torch.ones(4, device="cuda"))
    r.close()
    del t, r
    assert torch.cuda.memory_allocated() == before
    code = ("import attnd, torch, sys; c = attnd.Client(sys.argv[1]); "
            "t = torch.ones(4096, device='cuda'); r = c.region_from_tensor(t); r.close(); c.close()")
    p = subprocess.run([sys.executable, "-c", code, client.url], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "shared CUDA tensors" not in p.stderr, p.stderr
