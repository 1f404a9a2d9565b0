"""Prefill attention through torch's SDPA kernels (ops/cuda/attention.py picks them): cuDNN's
causal kernel from position 0 with the length bucketed, and the memory-efficient kernel with an
explicit mask (after a cached prefix, sliding windows)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from minfer.ops import LENGTH_BUCKET, paths


def cudnn_causal(q, k_cache, v_cache, scale: float):
    """cuDNN SDPA, causal from position 0: q (T, H, Dh) over the caches' first rows -> (T, H, Dh).

    GQA goes in unexpanded (enable_gqa): on the H200 at the 7B geometry and T=3354 it took
    173 us per layer, against 234 us with k/v expanded to H heads first and 339 us for the flash
    (FA2) kernel (docs/perf-log.md section 10; tools/exp_attn.py).

    cuDNN builds an execution plan per shape: 43-60 ms at each new length (same run), more than
    half a 3354-token prefill. So the length is rounded up to a multiple of LENGTH_BUCKET
    (128, docs/perf-log.md section 10): q gets zero rows after the real ones (one pad copy) and k/v are the
    caches' first rows up to the rounded length (a view; rows past the real keys are zeros or
    finite stale keys, and the causal mask keeps them from every real row). At most
    n_ctx / 128 plans are ever built; a 3354-token prompt computes 102 extra query rows.
    """
    t, h, dh = q.shape
    tb = -(-t // LENGTH_BUCKET) * LENGTH_BUCKET
    if tb > k_cache.shape[0]:
        tb = t                                      # no room in the cache: the exact length
    if tb != t:
        q = F.pad(q, (0, 0, 0, 0, 0, tb - t))       # (tb, H, Dh), zero rows after the real ones
        paths.count("attention.prefill.cudnn.padded")
    k = k_cache[:tb].transpose(0, 1).unsqueeze(0)  # (1, Hkv, tb, Dh)
    v = v_cache[:tb].transpose(0, 1).unsqueeze(0)
    qh = q.transpose(0, 1).unsqueeze(0)            # (1, H, tb, Dh)
    if k.dtype != qh.dtype:
        k, v = k.to(qh.dtype), v.to(qh.dtype)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        out = F.scaled_dot_product_attention(qh, k, v, is_causal=True, scale=scale,
                                             enable_gqa=k.shape[1] != h)
    paths.count("attention.prefill.cudnn")
    return out[0].transpose(0, 1)[:t]               # (T, H, Dh)


def masked(q, k_cache, v_cache, start_pos: int, scale: float, window: int, path: str):
    """q (T, H, Dh) at start_pos.. over the caches' first start_pos + T rows with an explicit
    (T, S) mask (causal, and the sliding window when window > 0): the memory-efficient kernel,
    which takes a mask but not GQA, so k/v are expanded to H heads."""
    t, h, _ = q.shape
    s, hkv = start_pos + t, k_cache.shape[1]
    k = k_cache[:s].transpose(0, 1).unsqueeze(0)            # (1, Hkv, S, Dh)
    v = v_cache[:s].transpose(0, 1).unsqueeze(0)
    qh = q.transpose(0, 1).unsqueeze(0)                      # (1, H, T, Dh)
    if k.dtype != qh.dtype:
        k, v = k.to(qh.dtype), v.to(qh.dtype)
    if hkv != h:
        k = k.repeat_interleave(h // hkv, dim=1)
        v = v.repeat_interleave(h // hkv, dim=1)
    j = torch.arange(s, device=q.device)[None, :]
    p = (start_pos + torch.arange(t, device=q.device))[:, None]
    mask = j <= p                                            # (T, S)
    if window > 0:
        mask = mask & (p - j < window)                       # llama.cpp is_masked_swa (STANDARD)
    try:
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale)
        paths.count(path)
    except RuntimeError as e:
        paths.fallback(path, f"SDPA refused fused kernels: {str(e).splitlines()[0][:80]}")
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale)
    return out[0].transpose(0, 1)                            # (T, H, Dh)
