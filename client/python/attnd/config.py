"""Daemon configs from HuggingFace model configs: attnd.config.from_hf(config, ...).

    cfg = attnd.config.from_hf(AutoConfig.from_pretrained(path), tp_size=2, tp_rank=0)
    json.dump(cfg, open("/etc/attnd/attnd.json", "w"))

or `python -m attnd.config CONFIG.json [--tp-size N] [--tp-rank R] ...`. What the daemon cannot
express yet raises UnsupportedModel instead of serving different math: per-layer windows or
attention types (Gemma-2's alternating windows), attention sinks, ALiBi split across tensor-
parallel ranks, latent or sparse attention, cross-attention.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

CACHE_DTYPES = ("bf16", "f16", "fp8_e4m3")
BLOCK_SIZES = (16, 32, 64)


class UnsupportedModel(ValueError):
    """The model needs something the daemon's geometry cannot say (yet)."""


def _get(cfg: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    return default


def _window(cfg: Any, layers: int) -> int:
    """The one sliding window every layer uses (0 = none); UnsupportedModel when they differ."""
    window = int(_get(cfg, "sliding_window", default=0) or 0)
    if getattr(cfg, "use_sliding_window", True) is False:
        window = 0
    types = list(getattr(cfg, "layer_types", None) or [])
    if not types:
        return window
    if len(types) != layers:
        raise UnsupportedModel(f"layer_types: {len(types)} entries for {layers} layers")
    kinds = set(types)
    other = kinds - {"full_attention", "sliding_attention"}
    if other:
        raise UnsupportedModel(f"layer_types: {sorted(other)} layers are not paged softmax "
                               "attention (the daemon serves full and sliding-window layers)")
    if kinds == {"full_attention", "sliding_attention"}:
        sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
        raise UnsupportedModel(
            f"layer_types: sliding-window layers {sliding[:4]}... beside full-attention layers: "
            "the daemon's window is one for all layers until per-layer geometry lands (issue 15)")
    return window if kinds == {"sliding_attention"} else 0


def _scale(cfg: Any, head: int) -> float:
    """Softmax scale when it is not 1/sqrt(head) (0 = the daemon's default)."""
    if getattr(cfg, "query_pre_attn_scalar", None):
        scale = float(cfg.query_pre_attn_scalar) ** -0.5
    elif getattr(cfg, "attention_multiplier", None):  # Granite
        scale = float(cfg.attention_multiplier)
    else:
        return 0.0
    return 0.0 if math.isclose(scale, head ** -0.5, rel_tol=1e-7) else scale


def _alibi(cfg: Any) -> bool:
    kind = getattr(cfg, "model_type", "")
    if kind == "bloom":
        return True
    if kind == "mpt":
        return bool(getattr(getattr(cfg, "attn_config", None), "alibi", False))
    return bool(getattr(cfg, "alibi", False))


def _refuse_unsupported(cfg: Any) -> None:
    if getattr(cfg, "is_encoder_decoder", False):
        raise UnsupportedModel("encoder-decoder model: cross-attention is not paged self-attention")
    if getattr(cfg, "kv_lora_rank", None):
        raise UnsupportedModel("kv_lora_rank: latent attention (MLA) is not served")
    if getattr(cfg, "attention_chunk_size", None):
        raise UnsupportedModel("attention_chunk_size: chunked local attention is not served")
    if getattr(cfg, "model_type", "") in ("gpt_oss",) or getattr(cfg, "use_sinks", False):
        raise UnsupportedModel("attention sinks: not in the daemon's geometry yet (issue 15)")


def _split_heads(q_heads: int, kv_heads: int, tp_size: int, tp_rank: int) -> tuple[int, int]:
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} / tp_size {tp_size}: need 0 <= rank < size")
    if q_heads % tp_size:
        raise UnsupportedModel(f"{q_heads} query heads do not split over {tp_size} ranks")
    if kv_heads % tp_size == 0:
        return q_heads // tp_size, kv_heads // tp_size
    if tp_size % kv_heads == 0:  # each rank keeps one replicated kv head (vLLM does the same)
        return q_heads // tp_size, 1
    raise UnsupportedModel(f"{kv_heads} kv heads do not split over {tp_size} ranks")


def from_hf(config: Any, *, tp_size: int = 1, tp_rank: int = 0, cache_dtype: str = "bf16",
            block_size: int = 16, num_blocks: int = 4096, max_model_len: int | None = None,
            backend: str = "cuda", listen: str | None = None) -> dict[str, Any]:
    """A daemon config (the JSON object attnd --config reads) for one tensor-parallel rank of a
    transformers model config (a PretrainedConfig, or its dict). Raises UnsupportedModel for
    models the daemon would serve with different math, ValueError for bad arguments."""
    if isinstance(config, dict):
        config = argparse.Namespace(**config)
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    _refuse_unsupported(cfg)
    layers = int(_get(cfg, "num_hidden_layers", "n_layer"))
    q_heads = int(_get(cfg, "num_attention_heads", "n_head"))
    kv_heads = int(_get(cfg, "num_key_value_heads", default=q_heads))
    if getattr(cfg, "multi_query", False):  # Falcon-7B style
        kv_heads = 1
    head = int(_get(cfg, "head_dim", default=0) or int(_get(cfg, "hidden_size")) // q_heads)
    if not (32 <= head <= 256 and head % 8 == 0):
        raise UnsupportedModel(f"head size {head}: the daemon serves 32..256, multiples of 8")
    if cache_dtype not in CACHE_DTYPES:
        raise ValueError(f"cache_dtype {cache_dtype!r}: one of {CACHE_DTYPES}")
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"block_size {block_size}: one of {BLOCK_SIZES}")
    alibi = _alibi(cfg)
    if alibi and tp_size > 1:
        raise UnsupportedModel("ALiBi over tensor-parallel ranks needs each rank's slice of the "
                               "slopes; the daemon computes them for its own heads only")
    local_q, local_kv = _split_heads(q_heads, kv_heads, tp_size, tp_rank)
    max_len = max_model_len or int(_get(cfg, "max_position_embeddings", "seq_length",
                                        default=4096))
    geometry = {
        "num_layers": layers, "num_q_heads": local_q, "num_kv_heads": local_kv,
        "head_size": head, "block_size": block_size, "cache_dtype": cache_dtype,
        "num_blocks": num_blocks,
        "max_blocks_per_seq": min(-(-max_len // block_size), num_blocks),
        "scale": _scale(cfg, head), "sliding_window": _window(cfg, layers),
        "softcap": float(_get(cfg, "attn_logit_softcapping", default=0.0) or 0.0),
        "alibi": alibi,
    }
    out: dict[str, Any] = {"backend": backend, "geometry": geometry}
    if listen:
        out["server"] = {"listen": listen}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnd.config",
                                 description="print a daemon config for a model's config.json")
    ap.add_argument("config", help="a model's config.json, or a directory holding one")
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--tp-rank", type=int, default=0)
    ap.add_argument("--cache-dtype", default="bf16", choices=CACHE_DTYPES)
    ap.add_argument("--block-size", type=int, default=16, choices=BLOCK_SIZES)
    ap.add_argument("--num-blocks", type=int, default=4096)
    ap.add_argument("--max-model-len", type=int)
    ap.add_argument("--backend", default="cuda", choices=("cuda", "cpu", "auto"))
    ap.add_argument("--listen")
    a = ap.parse_args(argv)
    path = a.config.rstrip("/")
    if not path.endswith(".json"):
        path += "/config.json"
    with open(path) as f:
        raw = json.load(f)
    try:
        from transformers import AutoConfig

        model_type = raw.pop("model_type")
        hf: Any = AutoConfig.for_model(model_type, **raw)
    except ImportError:
        hf = raw
    try:
        cfg = from_hf(hf, tp_size=a.tp_size, tp_rank=a.tp_rank, cache_dtype=a.cache_dtype,
                      block_size=a.block_size, num_blocks=a.num_blocks,
                      max_model_len=a.max_model_len, backend=a.backend, listen=a.listen)
    except (UnsupportedModel, ValueError) as e:
        print(f"attnd.config: {e}", file=sys.stderr)
        return 1
    json.dump(cfg, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
