"""Paged decode attention over deepseek2's multi-head latent (MLA) cache, in Triton.

What: the batch engine's decode rows (one query token per sequence) of an MLA model. The paged
cache (runtime/paged_kv.py, v_in_k) holds per position ONE key row K = [c, k_pe] of R + Dr values
(kv_lora_rank + rope dims), ONE KV head for every query head, and V = K[:, :R], a view of the same
pages (models/deepseek2.py). Row b's keys are its first context_lens[b] positions, position p at
slot block_tables[b, p // page] * page + p % page:

    o[b, h] = softmax_j(scale * q[b, h] . K_b[j]) K_b[j, :R]          j < context_lens[b]

How: ops/cuda/attention_mla.py's kernel (the contiguous cache's, one sequence) with the rows
read through the block table -- a program per (row b, block of BH query heads, key split). Every
head shares every key, so one tile of BN keys (a tile may span pages: each key's page comes from
the block table) serves all BH heads: loaded as its latent part [BN, R] and its rope part
[BN, Dr], scores q_lat . K_latᵀ + q_pe . K_peᵀ, and the same latent tile is the value tile of
p . K_lat: V is never loaded apart. Online softmax in base 2 (scale times log2 e folded in).
The grid comes from the block table's width (span = width * page keys), not the lengths, so a
CUDA graph captured once replays for any lengths: each program divides its row's own length over
the splits (whole tiles), and a split past the row's length writes an empty partial (max -inf,
weight 0). One split writes o = acc / l; several write (acc, max, sum) partials laid out as
(split, row * H + head), merged by attention_mla._mla_merge with B * H heads.

Refused (paged_mla_refusal; the cache then takes paged_attention_ref, a counted fallback): a
sliding window, soft-capped scores, sink logits (deepseek2 has none), more than one KV head,
values that are not the view of the key pages' first dims, CPU tensors outside the interpreter.
Caveats: the Triton interpreter's bf16 dot is not the GPU's (the interpreter tests run fp32 / fp16,
tests/runtime/test_paged_mla.py; bf16 on the device in tests/gpu/test_batching_gpu.py); fp32
inputs use IEEE dots.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minfer.errors import MinferError
from minfer.ops.cuda.attention_mla import LOG2E, _interpret, _kernel, _mla_merge, n_splits, tiles

PATH = "attention.paged_decode.mla.triton"


def _paged_mla_decode(q, kp, block_tables, context_lens, part_o, part_m, part_l, out,
                      stride_qb, stride_qh, stride_ks, stride_bt, H, BHT, NS, qk_scale,
                      PAGE: tl.constexpr, R: tl.constexpr, DR: tl.constexpr, BR: tl.constexpr,
                      BDR: tl.constexpr, BH: tl.constexpr, BN: tl.constexpr, IEEE: tl.constexpr,
                      DIRECT: tl.constexpr):
    """q (B, H, R + DR) rows [q_lat | q_pe]; kp the pool's slots of stride_ks, [c (R) | k_pe (DR)];
    qk_scale = scale * log2 e; BHT = B * H. DIRECT: one split, out (B, H, R) written here; else
    partials part_o (NS, BHT, BR) float32, part_m / part_l (NS, BHT) (max in base 2, sum)."""
    b = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    L = tl.load(context_lens + b)
    kps = tl.cdiv(tl.cdiv(L, NS), BN) * BN           # this row's keys a split, whole tiles
    s0 = sp * kps
    s1 = tl.minimum(s0 + kps, L)
    h = hb * BH + tl.arange(0, BH)
    hm = h < H
    dl = tl.arange(0, BR)
    dlm = dl < R
    dp = tl.arange(0, BDR)
    dpm = dp < DR
    qrow = q + b * stride_qb + h[:, None] * stride_qh
    q_lat = tl.load(qrow + dl[None, :], mask=hm[:, None] & dlm[None, :], other=0.0)
    q_pe = tl.load(qrow + R + dp[None, :], mask=hm[:, None] & dpm[None, :], other=0.0)
    m_i = tl.full([BH], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BH], dtype=tl.float32)
    acc = tl.zeros([BH, BR], dtype=tl.float32)
    for start in range(s0, s1, BN):
        s = start + tl.arange(0, BN)
        sm = s < s1
        page = tl.load(block_tables + b * stride_bt + s // PAGE, mask=sm, other=0)
        krow = kp + (page.to(tl.int64) * PAGE + s % PAGE)[:, None] * stride_ks
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
    row = b * H + h
    if DIRECT:
        res = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out + row[:, None] * R + dl[None, :], res.to(out.dtype.element_ty), mask=hm[:, None] & dlm[None, :])
    else:
        tl.store(part_o + (sp * BHT + row[:, None]) * BR + dl[None, :], acc, mask=hm[:, None] & dlm[None, :])
        tl.store(part_m + sp * BHT + row, m_i, mask=hm)
        tl.store(part_l + sp * BHT + row, l_i, mask=hm)


def paged_mla_refusal(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, window: int = 0,
                      softcap: float = 0.0, sinks=None) -> str | None:
    """Why paged_mla_decode cannot take this call (None: it can)."""
    if window > 0:
        return "a sliding window (the paged MLA kernel has none)"
    if softcap > 0:
        return "soft-capped scores (the paged MLA kernel has no cap)"
    if sinks is not None:
        return "sink logits (the paged MLA kernel has none)"
    if k_pages.shape[2] != 1:
        return f"{k_pages.shape[2]} KV heads (the paged MLA kernel takes one)"
    dv, dk = v_pages.shape[-1], k_pages.shape[-1]
    if not (v_pages.data_ptr() == k_pages.data_ptr() and v_pages.stride()[:2] == k_pages.stride()[:2] and dv < dk
            and v_pages.shape[:3] == k_pages.shape[:3] and k_pages.stride(-1) == v_pages.stride(-1) == 1):
        return "the values are not a view of the key pages' first dims (the MLA latent cache)"
    if q.shape[-1] != dk:
        return f"queries of {q.shape[-1]} dims over keys of {dk}"
    if q.device.type != "cuda" and not _interpret():
        return "CPU tensors outside Triton's interpreter"
    return None


def paged_mla_decode(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_tables: torch.Tensor,
                     context_lens: torch.Tensor, scale: float | None = None, n_split: int | None = None,
                     programs: int = 264, block: tuple | None = None) -> torch.Tensor:
    """q (B, H, Dk); pages (n_blocks, page, 1, Dk) with v_pages the view of their first Dv dims;
    block_tables (B, M) int; context_lens (B,) int (each >= 1) -> (B, H, Dv) in q's dtype.
    scale: the scores' factor (None: 1/sqrt(Dk)). n_split: the key splits (None: about `programs`
    programs over rows x head blocks x splits, at least two tiles a split of the table's span;
    1 writes the output directly). block: (BH, BN, warps[, stages]), default attention_mla.tiles.
    A MinferError where paged_mla_refusal says why not."""
    why = paged_mla_refusal(q, k_pages, v_pages)
    if why is not None:
        raise MinferError(f"paged MLA decode: {why}")
    b, h, dk = q.shape
    page = k_pages.shape[1]
    dv = v_pages.shape[-1]
    bh, bn, warps, *stages = block or tiles(h, q.device)
    hb = triton.cdiv(h, bh)
    span = block_tables.shape[1] * page
    ns = n_splits(span, bn, b * hb, programs, n_split)
    dr = dk - dv
    br = max(16, triton.next_power_of_2(dv))
    bdr = max(16, triton.next_power_of_2(dr))
    qq = q if q.dtype == k_pages.dtype else q.to(k_pages.dtype)
    if qq.stride(-1) != 1:
        qq = qq.contiguous()
    kf = k_pages.view(-1, dk) if k_pages.is_contiguous() else k_pages.reshape(-1, dk)
    if kf.data_ptr() != k_pages.data_ptr():
        raise MinferError("paged MLA decode: the key pages are not one slot-major pool")
    bt = block_tables if block_tables.dtype == torch.int32 else block_tables.to(torch.int32)
    cl = context_lens if context_lens.dtype == torch.int32 else context_lens.to(torch.int32)
    out = torch.empty((b, h, dv), dtype=q.dtype, device=q.device)
    scale = 1.0 / math.sqrt(dk) if scale is None else float(scale)
    direct = ns == 1
    if direct:
        part_o = part_m = part_l = out          # unused by the one-split store
    else:
        part_o = torch.empty((ns, b * h, br), dtype=torch.float32, device=q.device)
        part_m = torch.empty((ns, b * h), dtype=torch.float32, device=q.device)
        part_l = torch.empty((ns, b * h), dtype=torch.float32, device=q.device)
    _kernel(_paged_mla_decode)[(b, hb, ns)](
        qq, kf, bt, cl, part_o, part_m, part_l, out, qq.stride(0), qq.stride(1), kf.stride(0), bt.stride(0),
        h, b * h, ns, scale * LOG2E, PAGE=page, R=dv, DR=dr, BR=br, BDR=bdr, BH=bh, BN=bn,
        IEEE=k_pages.dtype == torch.float32, DIRECT=direct,
        num_warps=warps, **({"num_stages": stages[0]} if stages else {}))
    if not direct:
        dc = min(br, 128)
        _kernel(_mla_merge)[(b * h, br // dc)](part_o, part_m, part_l, out, b * h, ns, R=dv, BR=br, DC=dc,
                                               NSP=max(16, triton.next_power_of_2(ns)), num_warps=4)
    return out
