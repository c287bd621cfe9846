"""attnd.config.from_hf on transformers configs: geometry, tensor-parallel splits, and the
models the daemon cannot serve yet refused with a reason."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from transformers import (BloomConfig, Gemma2Config, LlamaConfig, MistralConfig, Qwen2Config)

from attnd.config import UnsupportedModel, from_hf

LLAMA3_8B = LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=8, max_position_embeddings=8192)


def test_llama_gqa():
    g = from_hf(LLAMA3_8B)["geometry"]
    assert (g["num_layers"], g["num_q_heads"], g["num_kv_heads"], g["head_size"]) == (32, 32, 8, 128)
    assert g["scale"] == 0.0 and g["sliding_window"] == 0 and not g["alibi"]
    assert g["max_blocks_per_seq"] == 8192 // 16


def test_tensor_parallel_splits_heads():
    assert [from_hf(LLAMA3_8B, tp_size=2, tp_rank=r)["geometry"]["num_q_heads"]
            for r in (0, 1)] == [16, 16]
    g = from_hf(LLAMA3_8B, tp_size=16, tp_rank=3)["geometry"]
    assert (g["num_q_heads"], g["num_kv_heads"]) == (2, 1)  # kv heads replicated
    with pytest.raises(UnsupportedModel, match="query heads"):
        from_hf(LLAMA3_8B, tp_size=3)
    with pytest.raises(ValueError, match="tp_rank"):
        from_hf(LLAMA3_8B, tp_size=2, tp_rank=2)


def test_mistral_window_and_bloom_alibi():
    m = from_hf(MistralConfig(sliding_window=4096), cache_dtype="fp8_e4m3")["geometry"]
    assert m["sliding_window"] == 4096 and m["cache_dtype"] == "fp8_e4m3"
    b = from_hf(BloomConfig(hidden_size=1024, n_head=16, n_layer=4))["geometry"]
    assert b["alibi"] and b["num_kv_heads"] == 16 and b["head_size"] == 64
    with pytest.raises(UnsupportedModel, match="ALiBi"):
        from_hf(BloomConfig(hidden_size=1024, n_head=16), tp_size=2)


def test_qwen2_window_only_when_used():
    assert from_hf(Qwen2Config())["geometry"]["sliding_window"] == 0


def test_gemma2_alternating_windows_are_refused():
    cfg = Gemma2Config(num_hidden_layers=4, head_dim=128, num_attention_heads=8,
                       num_key_value_heads=4)
    with pytest.raises(UnsupportedModel, match="issue 15"):
        from_hf(cfg)


def test_bad_arguments():
    with pytest.raises(ValueError, match="cache_dtype"):
        from_hf(LLAMA3_8B, cache_dtype="f64")
    with pytest.raises(UnsupportedModel, match="head size 16"):
        from_hf(LlamaConfig(hidden_size=64, num_attention_heads=4))


def test_cli_writes_a_config_the_daemon_accepts(tmp_path):
    from daemon import daemon_path

    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B.to_dict()))
    r = subprocess.run([sys.executable, "-m", "attnd.config", str(tmp_path), "--tp-size", "2",
                        "--backend", "cpu", "--num-blocks", "64"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    cfg = json.loads(r.stdout)
    assert cfg["geometry"]["num_q_heads"] == 16
    path = tmp_path / "attnd.json"
    path.write_text(r.stdout)
    chk = subprocess.run([daemon_path(), "--check-config", "--config", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert chk.returncode == 0, chk.stdout + chk.stderr
