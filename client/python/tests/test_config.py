"""attnd.config.from_hf on transformers configs: geometry, tensor-parallel splits, per-layer
patterns (Gemma-2, Gemma-3, Cohere-2, GPT-OSS with its sinks), the models the daemon cannot serve
refused with a reason; expectations and their comparison with a reported geometry."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from transformers import (BloomConfig, Cohere2Config, Gemma2Config, Gemma3TextConfig,
                          GptOssConfig, LlamaConfig, MistralConfig, Qwen2Config)

from attnd.config import (UnsupportedModel, alibi_slopes, expectation, first_difference,
                          from_hf, resolve_layer)

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
    assert m["sliding_window"] == 4096 and m["cache_dtype"] == "fp8_e4m3" and m["layers"] == []
    b = from_hf(BloomConfig(hidden_size=1024, n_head=16, n_layer=4))["geometry"]
    assert b["alibi"] and b["num_kv_heads"] == 16 and b["head_size"] == 64
    # over tensor-parallel ranks: each rank's slice of the 16 heads' slopes, given per layer
    r1 = from_hf(BloomConfig(hidden_size=1024, n_head=16, n_layer=4), tp_size=2, tp_rank=1)
    g = r1["geometry"]
    assert not g["alibi"] and g["layers"] == [{"alibi_slopes": alibi_slopes(16)[8:]}]


def test_qwen2_window_only_when_used():
    assert from_hf(Qwen2Config())["geometry"]["sliding_window"] == 0


def test_gemma2_alternating_windows_softcap_and_scale():
    cfg = Gemma2Config(num_hidden_layers=42, head_dim=256, num_attention_heads=16,
                       num_key_value_heads=8, query_pre_attn_scalar=224, sliding_window=4096)
    g = from_hf(cfg)["geometry"]
    assert g["layers"] == [{"sliding_window": 4096}, {}] and g["sliding_window"] == 0
    assert g["softcap"] == 50.0 and g["scale"] == pytest.approx(224 ** -0.5)
    assert [resolve_layer(g, i)["sliding_window"] for i in range(4)] == [4096, 0, 4096, 0]


def test_gemma3_and_cohere2_patterns():
    g3 = from_hf(Gemma3TextConfig(num_hidden_layers=12, sliding_window=1024))["geometry"]
    assert g3["layers"] == [{"sliding_window": 1024}] * 5 + [{}]
    c2 = from_hf(Cohere2Config(num_hidden_layers=8, sliding_window=4096))["geometry"]
    assert c2["layers"] == [{"sliding_window": 4096}] * 3 + [{}]
    # 3 : 1 over 6 layers repeats no shorter pattern: one entry per layer
    c6 = from_hf(Cohere2Config(num_hidden_layers=6, sliding_window=4096))["geometry"]
    assert len(c6["layers"]) == 6 and c6["layers"][3] == {}


def test_gpt_oss_needs_its_sinks():
    cfg = GptOssConfig(num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                       head_dim=64, sliding_window=128)
    with pytest.raises(UnsupportedModel, match="sinks are model weights"):
        from_hf(cfg)
    sinks = [[float(layer * 10 + h) for h in range(8)] for layer in range(4)]
    g = from_hf(cfg, sinks=sinks)["geometry"]
    assert len(g["layers"]) == 4
    assert g["layers"][0] == {"sliding_window": 128, "sinks": sinks[0]}
    assert g["layers"][1] == {"sinks": sinks[1]}
    rank1 = from_hf(cfg, sinks=sinks, tp_size=2, tp_rank=1)["geometry"]
    assert rank1["layers"][2]["sinks"] == sinks[2][4:]
    with pytest.raises(ValueError, match="sinks: need 4 layers x 8 heads"):
        from_hf(cfg, sinks=sinks[:3])


def test_other_layer_types_are_refused():
    cfg = Qwen2Config(num_hidden_layers=2)
    cfg.layer_types = ["linear_attention", "full_attention"]
    with pytest.raises(UnsupportedModel, match="linear_attention"):
        from_hf(cfg)


def test_expectation_and_first_difference():
    cfg = Gemma2Config(num_hidden_layers=4, head_dim=64, num_attention_heads=4,
                       num_key_value_heads=2, sliding_window=12, attn_logit_softcapping=5.0)
    g = from_hf(cfg, num_blocks=64)["geometry"]
    want = expectation(g)
    assert len(want["layers"]) == 2 and want["num_layers"] == 4
    reported = {**g, "cache_dtype": "bf16", "layers": [resolve_layer(g, i) for i in range(4)]}
    for lay in reported["layers"]:
        lay["alibi_slopes"] = False
    assert first_difference(want, reported) is None
    reported["layers"][3]["softcap"] = 0.0
    assert first_difference(want, reported) == (
        "geometry.layers[3].softcap: the daemon serves 0.0, the client expects 5.0")
    reported["num_kv_heads"] = 4
    assert first_difference(want, reported).startswith("geometry.num_kv_heads: the daemon serves 4")


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


def test_cli_reads_gpt_oss_sinks_from_safetensors(tmp_path):
    import torch
    from safetensors.torch import save_file

    from daemon import daemon_path

    cfg = GptOssConfig(num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                       head_dim=64, sliding_window=128)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    save_file({f"model.layers.{i}.self_attn.sinks": torch.arange(8.0) + i for i in range(2)},
              str(tmp_path / "model.safetensors"))
    r = subprocess.run([sys.executable, "-m", "attnd.config", str(tmp_path), "--backend", "cpu",
                        "--num-blocks", "64"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    g = json.loads(r.stdout)["geometry"]
    assert g["layers"][1]["sinks"] == [float(x) + 1 for x in range(8)]
    path = tmp_path / "attnd.json"
    path.write_text(r.stdout)
    chk = subprocess.run([daemon_path(), "--check-config", "--config", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert chk.returncode == 0, chk.stdout + chk.stderr
