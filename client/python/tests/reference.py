"""numpy references of the daemon's ops (float64)."""

from __future__ import annotations

import numpy as np


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, context: int, scale: float,
              causal: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """q [n, Hq, D] at positions context.. over k/v [L, Hkv, D]: (out [n, Hq, D], lse [Hq, n])."""
    n, hq, _ = q.shape
    group = hq // k.shape[1]
    out = np.zeros(q.shape)
    lse = np.zeros((hq, n))
    for i in range(n):
        seen = context + i + 1 if causal else k.shape[0]
        for h in range(hq):
            logits = k[:seen, h // group].astype(np.float64) @ q[i, h].astype(np.float64) * scale
            m = logits.max()
            p = np.exp(logits - m)
            out[i, h] = p @ v[:seen, h // group].astype(np.float64) / p.sum()
            lse[h, i] = m + np.log(p.sum())
    return out, lse


def linear(q: np.ndarray, k: np.ndarray, v: np.ndarray, slopes: np.ndarray,
           state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The decayed linear-attention recurrence per head over q/k/v [H, n, d] from state
    [H, d, d]: S_t = exp(-s) S_{t-1} + k_t^T v_t, o_t = q_t S_t. Returns (out, state)."""
    s = state.astype(np.float64).copy()
    out = np.zeros(q.shape)
    for h in range(q.shape[0]):
        lam = np.exp(-float(slopes[h]))
        for t in range(q.shape[1]):
            s[h] = lam * s[h] + np.outer(k[h, t], v[h, t])
            out[h, t] = q[h, t] @ s[h]
    return out, s
