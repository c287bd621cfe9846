"""Daemon configs from HuggingFace model configs, and the geometry a model expects.

    cfg = attnd.config.from_hf(AutoConfig.from_pretrained(path), tp_size=2, tp_rank=0)
    json.dump(cfg, open("/etc/attnd/attnd.json", "w"))

or `python -m attnd.config MODEL_DIR [--tp-size N] [--tp-rank R] ...`. Layers that differ are
written as geometry.layers, the shortest pattern that repeats over the model's layers:
alternating windows (Gemma-2, GPT-OSS), 5 local : 1 global (Gemma-3), 3 : 1 (Cohere-2),
attention sinks (GPT-OSS: model weights, from `sinks=` / `sinks_of(model)` or the directory's
safetensors), ALiBi slopes sliced per tensor-parallel rank. What the daemon still cannot serve
raises UnsupportedModel: linear or other non-softmax layer types (MiniMax-style hybrids), latent
or chunked attention, cross-attention.

`expectation(geometry)` is what a client sends in Hello (attnd.Client(expect=...)): the
daemon refuses a geometry that differs, naming the first difference; `first_difference` makes
the same comparison against a geometry the daemon reported.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
from typing import Any, Sequence


CACHE_DTYPES = ("bf16", "f16", "fp8_e4m3", "f32")
BLOCK_SIZES = (16, 32, 64)
LAYER_TYPES = ("full_attention", "sliding_attention")
REL_TOL = 1e-6  # as the daemon compares floats (state/model_expect.c)


class UnsupportedModel(ValueError):
    """The model needs something the daemon's geometry cannot say (yet)."""


def _get(cfg: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    return default


# ---------------------------------------------------------------------- the model's layers
def _layer_windows(cfg: Any, layers: int) -> list[int]:
    """Each layer's sliding window (0 = full attention)."""
    window = int(_get(cfg, "sliding_window", default=0) or 0)
    if getattr(cfg, "use_sliding_window", True) is False:
        window = 0
    types = list(getattr(cfg, "layer_types", None) or [])
    if not types:
        return [window] * layers
    if len(types) != layers:
        raise UnsupportedModel(f"layer_types: {len(types)} entries for {layers} layers")
    other = sorted(set(types) - set(LAYER_TYPES))
    if other:
        raise UnsupportedModel(f"layer_types: {other} layers are not paged softmax attention (the "
                               "daemon serves full and sliding-window layers)")
    return [window if t == "sliding_attention" else 0 for t in types]


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


def alibi_slopes(n: int) -> list[float]:
    """ALiBi's standard slopes for n heads (as transformers' Bloom and the daemon compute)."""
    p = 2 ** int(math.floor(math.log2(n)))
    out = [2.0 ** (-8.0 * (i + 1) / p) for i in range(p)]
    out += [2.0 ** (-8.0 * (2 * i + 1) / (2 * p)) for i in range(n - p)]
    return out


def _needs_sinks(cfg: Any) -> bool:
    return getattr(cfg, "model_type", "") == "gpt_oss" or bool(getattr(cfg, "use_sinks", False))


def _refuse_unsupported(cfg: Any) -> None:
    if getattr(cfg, "is_encoder_decoder", False):
        raise UnsupportedModel("encoder-decoder model: cross-attention is not paged self-attention")
    if getattr(cfg, "kv_lora_rank", None):
        raise UnsupportedModel("kv_lora_rank: latent attention (MLA) is not served")
    if getattr(cfg, "attention_chunk_size", None):
        raise UnsupportedModel("attention_chunk_size: chunked local attention is not served")


def sinks_of(model: Any) -> list[list[float]]:
    """Every layer's attention sinks (one logit per q head) from a loaded model: the `sinks`
    parameter of each attention module, in layer order (GPT-OSS)."""
    found: dict[int, list[float]] = {}
    for m in model.modules():
        s, layer = getattr(m, "sinks", None), getattr(m, "layer_idx", None)
        if s is not None and isinstance(layer, int):
            found[layer] = [float(x) for x in s.detach().float().cpu().reshape(-1)]
    return [found[i] for i in sorted(found)]


def _sinks_from_dir(path: str) -> list[list[float]] | None:
    """model.layers.N.self_attn.sinks from a checkpoint directory's safetensors, if any."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        return None
    from safetensors import safe_open

    found: dict[int, list[float]] = {}
    for f in files:
        with safe_open(f, framework="pt") as st:
            for k in st.keys():
                m = re.search(r"layers\.(\d+)\.self_attn\.sinks$", k)
                if m:
                    found[int(m.group(1))] = st.get_tensor(k).float().tolist()
    return [found[i] for i in sorted(found)] or None


def _pattern(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The shortest prefix that repeats over the list, its length dividing the list's."""
    n = len(entries)
    for p in range(1, n + 1):
        if n % p == 0 and all(entries[i] == entries[i % p] for i in range(n)):
            return entries[:p]
    return entries


# ---------------------------------------------------------------------- tensor parallelism
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


def _layer_entries(cfg: Any, layers: int, q_heads: int, local_q: int, tp_rank: int,
                   sinks: Sequence[Sequence[float]] | None) -> tuple[int, list[dict[str, Any]]]:
    """The global sliding window and the per-layer overrides (the pattern; [] when every layer
    is alike)."""
    windows = _layer_windows(cfg, layers)
    heads = slice(tp_rank * local_q, (tp_rank + 1) * local_q)
    window = windows[0] if len(set(windows)) == 1 else 0
    entries: list[dict[str, Any]] = [{} for _ in range(layers)]
    for i, w in enumerate(windows):
        if w != window:
            entries[i]["sliding_window"] = w
    if _needs_sinks(cfg):
        if sinks is None:
            raise UnsupportedModel("attention sinks are model weights, not in config.json: pass "
                                   "sinks=attnd.config.sinks_of(model), or a model directory "
                                   "with its safetensors")
        if len(sinks) != layers or any(len(s) != q_heads for s in sinks):
            raise ValueError(f"sinks: need {layers} layers x {q_heads} heads")
        for i in range(layers):
            entries[i]["sinks"] = [float(x) for x in list(sinks[i])[heads]]
    if _alibi(cfg) and local_q != q_heads:  # a rank's slice of the standard slopes
        for e in entries:
            e["alibi_slopes"] = alibi_slopes(q_heads)[heads]
    return window, ([] if all(e == {} for e in entries) else _pattern(entries))


def from_hf(config: Any, *, tp_size: int = 1, tp_rank: int = 0, cache_dtype: str = "bf16",
            block_size: int = 16, num_blocks: int = 4096, max_model_len: int | None = None,
            backend: str = "cuda", listen: str | None = None,
            sinks: Sequence[Sequence[float]] | None = None) -> dict[str, Any]:
    """A daemon config (the JSON object attnd --config reads) for one tensor-parallel rank of a
    transformers model config (a PretrainedConfig, or its dict). sinks: every layer's sink
    logits for all q heads (GPT-OSS; sinks_of(model)). Raises UnsupportedModel for models the
    daemon would serve with different math, ValueError for bad arguments."""
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
    local_q, local_kv = _split_heads(q_heads, kv_heads, tp_size, tp_rank)
    window, pattern = _layer_entries(cfg, layers, q_heads, local_q, tp_rank, sinks)
    max_len = max_model_len or int(_get(cfg, "max_position_embeddings", "seq_length",
                                        default=4096))
    geometry = {
        "num_layers": layers, "num_q_heads": local_q, "num_kv_heads": local_kv,
        "head_size": head, "block_size": block_size, "cache_dtype": cache_dtype,
        "num_blocks": num_blocks,
        "max_blocks_per_seq": min(-(-max_len // block_size), num_blocks),
        "scale": _scale(cfg, head), "sliding_window": window,
        "softcap": float(_get(cfg, "attn_logit_softcapping", default=0.0) or 0.0),
        "alibi": _alibi(cfg) and local_q == q_heads,
        "layers": pattern,
    }
    out: dict[str, Any] = {"backend": backend, "geometry": geometry}
    if listen:
        out["server"] = {"listen": listen}
    return out


# ---------------------------------------------------------------------- expectations
def resolve_layer(geometry: dict[str, Any], i: int) -> dict[str, Any]:
    """Layer i of a config geometry as the daemon applies it: the pattern's entry over the global
    keys, the scale made effective, alibi_slopes True (standard), False or a list."""
    pattern = geometry.get("layers") or [{}]
    e = pattern[i % len(pattern)]
    head = int(geometry["head_size"])
    scale = float(e.get("scale", geometry.get("scale", 0.0)) or 0.0) or head ** -0.5
    return {
        "sliding_window": int(e.get("sliding_window", geometry.get("sliding_window", 0)) or 0),
        "softcap": float(e.get("softcap", geometry.get("softcap", 0.0)) or 0.0),
        "scale": scale,
        "alibi_slopes": e.get("alibi_slopes", bool(geometry.get("alibi", False))),
        "sinks": e.get("sinks"),
        "k_scale": float(e.get("k_scale", geometry.get("k_scale", 1.0))),
        "v_scale": float(e.get("v_scale", geometry.get("v_scale", 1.0))),
    }


def expectation(geometry: dict[str, Any]) -> dict[str, Any]:
    """What a client running this model expects of the daemon (for Hello): the shape and every
    layer's options, as a pattern; not the capacity (blocks), the cache dtype or the fp8 scales,
    which are the operator's choice."""
    n = len(geometry.get("layers") or [{}])
    layers = []
    for i in range(n):
        lay = resolve_layer(geometry, i)
        lay["k_scale"] = lay["v_scale"] = 0.0  # not compared
        layers.append(lay)
    keys = ("num_layers", "num_q_heads", "num_kv_heads", "head_size")
    return {**{k: int(geometry[k]) for k in keys}, "layers": layers}


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b)) + 1e-30


def _differ(field: str, have: Any, want: Any) -> str:
    return f"geometry.{field}: the daemon serves {have}, the client expects {want}"


def _array_difference(field: str, have: Any, want: Any) -> str | None:
    if (have is None) != (want is None):
        return _differ(field, "them" if have is not None else "none",
                       "them" if want is not None else "none")
    if want is None:
        return None
    if len(have) != len(want):
        return _differ(field, f"{len(have)} entries", f"{len(want)}")
    for h, (a, b) in enumerate(zip(have, want)):
        if not _close(float(a), float(b)):
            return _differ(f"{field}[{h}]", a, b)
    return None


def _layer_difference(i: int, have: dict[str, Any], want: dict[str, Any],
                      hq: int) -> str | None:
    f = f"layers[{i}]."
    if int(have["sliding_window"]) != int(want["sliding_window"]):
        return _differ(f + "sliding_window", have["sliding_window"], want["sliding_window"])
    for key in ("softcap", "scale", "k_scale", "v_scale"):
        if key in ("k_scale", "v_scale") and not want.get(key):
            continue
        if not _close(float(have[key]), float(want[key])):
            return _differ(f + key, have[key], want[key])
    wa = want["alibi_slopes"]
    wa = alibi_slopes(hq) if wa is True else (None if wa is False else wa)
    ha = have["alibi_slopes"] if have["alibi_slopes"] is not False else None
    return (_array_difference(f + "alibi_slopes", ha, wa)
            or _array_difference(f + "sinks", have.get("sinks"), want.get("sinks")))


def first_difference(expect: dict[str, Any], geometry: dict[str, Any]) -> str | None:
    """The first field where a daemon's reported geometry (attnd.Client.geometry) differs from
    an expectation, named as the daemon names it; None when they agree."""
    for key in ("num_layers", "num_q_heads", "num_kv_heads", "head_size", "block_size",
                "cache_dtype"):
        if key in expect and expect[key] != geometry[key]:
            return _differ(key, geometry[key], expect[key])
    want = expect.get("layers") or []
    have = geometry.get("layers") or []
    if want and len(have) != geometry["num_layers"]:
        return "geometry.layers: the daemon does not report its layers' options (too old)"
    for i in range(len(have) if want else 0):
        d = _layer_difference(i, have[i], want[i % len(want)], geometry["num_q_heads"])
        if d:
            return d
    return None


# ---------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnd.config",
                                 description="print a daemon config for a model's config.json")
    ap.add_argument("config", help="a model's config.json, or a directory holding one (and, for "
                                   "attention sinks, its safetensors)")
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
    directory = None if path.endswith(".json") else path
    if directory:
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
        sinks = _sinks_from_dir(directory) if directory and _needs_sinks(
            hf.get_text_config() if hasattr(hf, "get_text_config") else hf) else None
        cfg = from_hf(hf, tp_size=a.tp_size, tp_rank=a.tp_rank, cache_dtype=a.cache_dtype,
                      block_size=a.block_size, num_blocks=a.num_blocks,
                      max_model_len=a.max_model_len, backend=a.backend, listen=a.listen,
                      sinks=sinks)
    except (UnsupportedModel, ValueError) as e:
        print(f"attnd.config: {e}", file=sys.stderr)
        return 1
    json.dump(cfg, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
