"""One-token decode attention over deepseek2's multi-head latent (MLA) cache, in Triton.

The cache (models/deepseek2.py, runtime/kv_cache.py v_in_k) holds per position ONE key row
K = [c, k_pe] of R + Dr values (kv_lora_rank + rope dims: 512 + 64 = 576 for V2-Lite, V3, Kimi-K2),
ONE KV head for every query head, and V = K[:, :R], a view of the same rows. The H query heads
(16 for V2-Lite, 128 for V3) each have R + Dr dims; each head's output has R:

    o[h] = softmax_j(scale * q[h] . K[j]) K[j, :R]          j < n_keys

Kernel (_mla_decode): program (head block b, key split sp) takes query heads [b*BH, (b+1)*BH)
and keys [sp*kps, (sp+1)*kps) (kps: the keys of this call split evenly over the grid's splits,
whole BN tiles). Every head shares every key, so one tile of BN cache rows serves all BH heads:
the tile is loaded as its latent part [BN, R] and its rope part [BN, Dr] (two power-of-two
widths instead of 576 padded to 1024), the scores are two tensor-core dots
q_lat [BH, R] . K_latᵀ + q_pe [BH, Dr] . K_peᵀ -> [BH, BN], and the same latent part, already in
shared memory / registers, is the value tile of the dot p [BH, BN] . K_lat -> [BH, R]: V is
never loaded apart. Online softmax in base 2 (the scale times log2 e folded in once).
With one split the program writes o = acc / l; with several, each split writes its
(acc, max, sum) partials and _mla_merge combines them per (head, chunk of R): w_s = 2^(m_s - max m),
o = sum w_s acc_s / sum w_s l_s (empty splits, m = -inf, weigh 0).

The key count may be a (1,) device tensor (a CUDA-graph step: the grid is sized from the cache's
rows, the kernel reads the count and divides that many keys over its splits).

What it refuses (mla_decode_or_none: a counted fallback to ops/cuda/attention.py's torch path,
attention.mla.torch): a sliding window, soft-capped scores, sink logits, more than one KV head,
a V that is not the view of K's first dims, CPU tensors outside Triton's interpreter. Prefill
(T > 1) is not here: the torch path, counted attention.mla.torch.

The kernels are built on first use for the current TRITON_INTERPRET mode (_built): a module
imported before a test turns the interpreter on still runs interpreted there, without the
reload that tests/ops/kernel_data.interpreted_modules does for the other kernel modules.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minfer.ops import paths

PATH = "attention.mla.decode.triton"
LOG2E = 1.4426950408889634


def _mla_decode(q, kc, n_keys, part_o, part_m, part_l, out, stride_qh, stride_ks, H, qk_scale, n_keys_add,
                R: tl.constexpr, DR: tl.constexpr, BR: tl.constexpr, BDR: tl.constexpr, BH: tl.constexpr,
                BN: tl.constexpr, IEEE: tl.constexpr, DIRECT: tl.constexpr):
    """q (H, stride_qh) rows [q_lat (R) | q_pe (DR)]; kc cache rows of stride_ks, [c (R) | k_pe (DR)];
    qk_scale = scale * log2 e. DIRECT: one split, out (H, R) written here; else partials
    part_o (NS, H, BR) float32, part_m / part_l (NS, H) (max in base 2, sum)."""
    hb = tl.program_id(0)
    sp = tl.program_id(1)
    n_splits = tl.num_programs(1)
    L = tl.load(n_keys) + n_keys_add
    kps = tl.cdiv(tl.cdiv(L, n_splits), BN) * BN
    s0 = sp * kps
    s1 = tl.minimum(s0 + kps, L)
    h = hb * BH + tl.arange(0, BH)
    hm = h < H
    dl = tl.arange(0, BR)
    dlm = dl < R
    dp = tl.arange(0, BDR)
    dpm = dp < DR
    qrow = q + h[:, None] * stride_qh
    q_lat = tl.load(qrow + dl[None, :], mask=hm[:, None] & dlm[None, :], other=0.0)
    q_pe = tl.load(qrow + R + dp[None, :], mask=hm[:, None] & dpm[None, :], other=0.0)
    m_i = tl.full([BH], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BH], dtype=tl.float32)
    acc = tl.zeros([BH, BR], dtype=tl.float32)
    for start in range(s0, s1, BN):
        s = start + tl.arange(0, BN)
        sm = s < s1
        krow = kc + s[:, None].to(tl.int64) * stride_ks
        k_lat = tl.load(krow + dl[None, :], mask=sm[:, None] & dlm[None, :], other=0.0)      # [BN, BR]: K and V
        k_pe = tl.load(krow + R + dp[None, :], mask=sm[:, None] & dpm[None, :], other=0.0)   # [BN, BDR]
        if IEEE:
            sc = tl.dot(q_lat, tl.trans(k_lat), input_precision="ieee")
            sc = tl.dot(q_pe, tl.trans(k_pe), acc=sc, input_precision="ieee")
        else:
            sc = tl.dot(q_lat, tl.trans(k_lat))
            sc = tl.dot(q_pe, tl.trans(k_pe), acc=sc)
        sc = tl.where(sm[None, :], sc * qk_scale, float("-inf"))                           # [BH, BN], base 2
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))     # finite: a split's first tile has a key
        p = tl.exp2(sc - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            pv = tl.dot(p.to(k_lat.dtype), k_lat, input_precision="ieee")
        else:
            pv = tl.dot(p.to(k_lat.dtype), k_lat)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if DIRECT:
        res = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out + h[:, None] * R + dl[None, :], res.to(out.dtype.element_ty), mask=hm[:, None] & dlm[None, :])
    else:
        tl.store(part_o + (sp * H + h[:, None]) * BR + dl[None, :], acc, mask=hm[:, None] & dlm[None, :])
        tl.store(part_m + sp * H + h, m_i, mask=hm)
        tl.store(part_l + sp * H + h, l_i, mask=hm)


def _mla_merge(part_o, part_m, part_l, out, H, NS, R: tl.constexpr, BR: tl.constexpr, DC: tl.constexpr,
               NSP: tl.constexpr):
    """Program (h, j): values [j*DC, (j+1)*DC) of head h merged over the NS splits in one load round."""
    h = tl.program_id(0)
    j = tl.program_id(1)
    c = tl.arange(0, NSP)
    cm = c < NS
    d = j * DC + tl.arange(0, DC)
    ms = tl.load(part_m + c * H + h, mask=cm, other=float("-inf"))
    ls = tl.load(part_l + c * H + h, mask=cm, other=0.0)
    o = tl.load(part_o + (c * H + h)[:, None] * BR + d[None, :], mask=cm[:, None] & (d < R)[None, :], other=0.0)
    M = tl.max(ms, axis=0)
    w = tl.where(ms > float("-inf"), tl.exp2(ms - M), 0.0)
    res = tl.sum(o * w[:, None], axis=0) / tl.sum(w * ls, axis=0)
    tl.store(out + h * R + d, res.to(out.dtype.element_ty), mask=d < R)


_built: dict = {}


def _interpret() -> bool:
    from minfer.ops.cuda.dequant import interpret

    return interpret()


def _kernel(fn):
    """fn as a Triton kernel of the current mode (interpreted or compiled), built once per mode."""
    key = (fn.__name__, _interpret())
    k = _built.get(key)
    if k is None:
        k = _built[key] = triton.jit(fn)
    return k


def tiles(h: int, device) -> tuple[int, int, int]:
    """(BH query heads, BN keys a tile, warps) of a program. The interpreter: the smallest dot
    tiles (16). CUDA: 16 heads for up to 16 (V2-Lite: one head block), else 32 at 8 warps (V3's
    128: 4 head blocks; each block's acc is 32 x 512 float32, 64 registers a thread at 8 warps)."""
    if device.type != "cuda":
        return 16, 16, 4
    return (16, 32, 4) if h <= 16 else (32, 32, 8)


def n_splits(span: int, bn: int, head_blocks: int, programs: int, n_split: int | None = None) -> int:
    """Key splits for a grid covering `span` keys: head blocks x splits about `programs`, at least
    two tiles a split at the longest length, at most one split a tile."""
    if n_split is None:
        n_split = min(triton.cdiv(span, 2 * bn), triton.cdiv(programs, head_blocks))
    return max(1, min(n_split, triton.cdiv(span, bn)))


def mla_decode(q: torch.Tensor, k_cache: torch.Tensor, dv: int, n_keys, scale: float | None = None,
               n_keys_add: int = 0, programs: int = 264, n_split: int | None = None,
               block: tuple | None = None) -> torch.Tensor:
    """q (1, H, Dk) over keys [0, n_keys + n_keys_add) of the cache (S, 1, Dk), values its first dv
    dims -> (1, H, dv) in q's dtype. scale: the scores' factor (None: 1/sqrt(Dk)). n_keys: int, or an
    int (1,) device tensor (the grid then covers the cache's S rows). n_split: the key splits (None:
    n_splits' choice; 1 writes the output directly, several go through the merge launch). block:
    (BH, BN, warps[, stages]), default tiles() (Triton's default stages)."""
    _, h, dk = q.shape
    s_max = k_cache.shape[0]
    bh, bn, warps, *stages = block or tiles(h, q.device)
    if isinstance(n_keys, torch.Tensor):
        span = s_max
        nk = n_keys.reshape(1)
    else:
        span = int(n_keys) + n_keys_add
        n_keys_add = 0
        nk = torch.full((1,), span, dtype=torch.int32, device=q.device)
    hb = triton.cdiv(h, bh)
    ns = n_splits(span, bn, hb, programs, n_split)
    dr = dk - dv
    br = max(16, triton.next_power_of_2(dv))
    bdr = max(16, triton.next_power_of_2(dr))
    q2 = q.reshape(h, dk)
    if q2.dtype != k_cache.dtype:
        q2 = q2.to(k_cache.dtype)
    if q2.stride(-1) != 1:
        q2 = q2.contiguous()
    out = torch.empty((1, h, dv), dtype=q.dtype, device=q.device)
    scale = 1.0 / math.sqrt(dk) if scale is None else float(scale)
    direct = ns == 1
    if direct:
        part_o = part_m = part_l = out
    else:
        part_o = torch.empty((ns, h, br), dtype=torch.float32, device=q.device)
        part_m = torch.empty((ns, h), dtype=torch.float32, device=q.device)
        part_l = torch.empty((ns, h), dtype=torch.float32, device=q.device)
    _kernel(_mla_decode)[(hb, ns)](
        q2, k_cache, nk, part_o, part_m, part_l, out, q2.stride(0), k_cache.stride(0), h, scale * LOG2E, n_keys_add,
        R=dv, DR=dr, BR=br, BDR=bdr, BH=bh, BN=bn, IEEE=k_cache.dtype == torch.float32, DIRECT=direct,
        num_warps=warps, **({"num_stages": stages[0]} if stages else {}))
    if not direct:
        dc = min(br, 128)
        _kernel(_mla_merge)[(h, br // dc)](part_o, part_m, part_l, out, h, ns, R=dv, BR=br, DC=dc,
                                           NSP=max(16, triton.next_power_of_2(ns)), num_warps=4)
    return out


def refusal(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, window: int, softcap: float,
            sinks) -> str | None:
    """Why mla_decode cannot take this call (None: it can)."""
    if window > 0:
        return "a sliding window (the MLA decode kernel has none)"
    if softcap > 0:
        return "soft-capped scores (the MLA decode kernel has no cap)"
    if sinks is not None:
        return "sink logits (the MLA decode kernel has none)"
    if k_cache.shape[1] != 1 or v_cache.shape[1] != 1:
        return f"{k_cache.shape[1]} KV heads (the MLA decode kernel takes one)"
    dv, dk = v_cache.shape[-1], k_cache.shape[-1]
    if not (v_cache.data_ptr() == k_cache.data_ptr() and v_cache.stride() == k_cache.stride() and dv < dk
            and v_cache.shape[0] == k_cache.shape[0] and k_cache.stride(-1) == 1):
        return "the values are not a view of the key rows' first dims (the MLA latent cache)"
    if q.shape[-1] != dk:
        return f"queries of {q.shape[-1]} dims over keys of {dk}"
    if q.device.type != "cuda" and not _interpret():
        return "CPU tensors outside Triton's interpreter"
    return None


def mla_decode_or_none(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start_pos, sw,
                       window: int = 0, softcap: float = 0.0, sinks=None, scale: float | None = None):
    """ops/cuda/attention.attention's one-token MLA dispatch: mla_decode over keys [0, start_pos]
    (start_pos an int or a (1,) device tensor), counted attention.mla.decode.triton; None (the
    caller's torch path) where Switches.decode_attention is off (switched off) or refusal() says
    why not (a fallback)."""
    if not sw.decode_attention:
        paths.switched_off(PATH, "MINFER_DECODE_ATTN")
        return None
    why = refusal(q, k_cache, v_cache, window, softcap, sinks)
    if why is not None:
        paths.fallback(PATH, why)
        return None
    paths.count(PATH)
    return mla_decode(q, k_cache, v_cache.shape[-1], start_pos, scale, n_keys_add=1,
                      programs=sw.decode_attn_programs)
