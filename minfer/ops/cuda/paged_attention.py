"""Paged decode attention: one query token per row, keys/values read through a block table.

What: q (B, H, Dh) of B sequences, each attending its own first context_lens[b] keys, which live
in fixed-size pages of one pool (n_blocks, page, Hkv, Dh) at the blocks its block-table row names
(minfer/runtime/paged_kv.py). Why: the batched decode of many sequences with one launch and no
per-sequence contiguous cache (vLLM's PagedAttention; the split over keys is flash-decoding).

How: a program per (row, KV head, key split). It takes all G = H / Hkv query heads of its KV head
at once (padded to 16 rows for tl.dot: GQA-grouped, so each key tile is loaded once for the G
heads), walks its split's keys in tiles of BS (a tile may span pages: each key's page comes from
the block table), keeps an online softmax and writes (acc, max, sum) partials; a second kernel
merges the splits with their log-sum-exp weights. The grid comes from the block table's width,
not from the lengths, so a CUDA graph captured once replays for any lengths; programs past a
row's length write an empty partial (max -inf, weight 0 in the merge).

SINK (gpt-oss): sinks (H,) float32, each query head's extra softmax logit with no value
(minfer.ops.reference.attention's sinks). Split 0 starts its online softmax from it -- max = sink,
sum = exp(0) = 1, acc = 0 -- as if it were one more key, so each way out (the one-split store, the
in-kernel merge, the merge kernel) divides by exp(sink) + sum exp(s_j) with no change; the other
splits start empty as before (the contiguous decode kernel's SINK variant, ops/cuda/attention.py).

WINDOW (sliding-window layers): a row at position p = L - 1 sees keys j with p - j < window, i.e.
[lo, L), lo = max(L - window, 0) (llama.cpp's sliding-window mask). The programs divide the tiles
from lo's tile (lo rounded down to BS) to L, so a row reads about window keys whatever its length;
the first tile masks its keys before lo (it always holds lo, so no tile is wholly masked). With
SINK, split 0 still starts from the sink. CAP (gemma2): the scaled scores s become
softcap * tanh(s / softcap) before the mask (as the contiguous kernel's CAP). sm_scale is a runtime
argument (the caller's scale, default 1/sqrt(Dh)). WINDOW / CAP off compile the loop as before.

CHUNK (llama4's chunked layers): a row at position p = L - 1 sees keys j with j // chunk == p // chunk
and j <= p, i.e. [lo, L), lo = p // chunk * chunk (llama.cpp llama-hparams.cpp is_masked_swa,
LLAMA_SWA_TYPE_CHUNKED; HF Llama4's chunked attention mask). Read as WINDOW reads: the splits divide
the tiles from lo's tile on (a row reads at most chunk + BS - 1 keys, never the earlier chunks' tiles),
the first tile masks its keys before lo; lo need not be tile- or page-aligned (any chunk size). With
both WINDOW and CHUNK lo is the larger of the two.

Caveats: the Triton interpreter computes tl.dot on bf16 wrongly, so the interpreter tests run
fp32/fp16 (tests/runtime/test_paged_kv.py); fp32 inputs use IEEE dots. The reference is
minfer.runtime.paged_kv.paged_attention_ref.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minfer.ops import paths


@triton.jit
def _paged_decode_kernel(q, kp, vp, block_tables, context_lens, part_o, part_m, part_l,
                         stride_qb, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_bt,
                         out, stride_ob, stride_oh, cnt,
                         H, G, NS, sm_scale,
                         PAGE: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, GP: tl.constexpr,
                         BS: tl.constexpr, IEEE: tl.constexpr, DIRECT: tl.constexpr, MERGE: tl.constexpr,
                         SINK: tl.constexpr = False, sinks=None, WINDOW: tl.constexpr = False, window=0,
                         CAP: tl.constexpr = False, softcap=1.0, CHUNK: tl.constexpr = False, chunk=1):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    L = tl.load(context_lens + b)
    # the row's own length divided over the NS programs (whole key tiles each): the grid is fixed
    # (a CUDA graph's), the work of each program follows the length of this step
    if WINDOW or CHUNK:     # only keys [lo, L): the tiles from lo's (BS-aligned) tile on, divided over the splits
        lo = L * 0
        if WINDOW:
            lo = tl.maximum(L - window, 0)
        if CHUNK:           # the row's own chunk: from (L - 1) // chunk * chunk (LLAMA_SWA_TYPE_CHUNKED)
            lo = tl.maximum(lo, (L - 1) // chunk * chunk)
        k0 = lo // BS * BS
        keys_per_split = tl.cdiv(tl.cdiv(L - k0, NS), BS) * BS
        s0 = k0 + sp * keys_per_split
    else:
        keys_per_split = tl.cdiv(tl.cdiv(L, NS), BS) * BS
        s0 = sp * keys_per_split
    s1 = tl.minimum(s0 + keys_per_split, L)
    g = tl.arange(0, GP)
    gm = g < G
    qh = kvh * G + g
    d = tl.arange(0, BD)
    dm = d < D
    qt = tl.load(q + b * stride_qb + qh[:, None] * stride_qh + d[None, :], mask=gm[:, None] & dm[None, :], other=0.0)
    if SINK:    # split 0 starts from the sink as from one more key with no value (the docstring)
        m_i = tl.load(sinks + qh, mask=gm & (sp == 0), other=float("-inf")).to(tl.float32)
        l_i = tl.where(m_i > float("-inf"), 1.0, 0.0)
    else:
        m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, BD], dtype=tl.float32)
    for start in range(s0, s1, BS):
        s = start + tl.arange(0, BS)
        sm = s < s1
        if WINDOW or CHUNK:
            sm = sm & (s >= lo)                                         # the first tile's keys before lo
        page = tl.load(block_tables + b * stride_bt + s // PAGE, mask=sm, other=0)
        slot = page.to(tl.int64) * PAGE + (s % PAGE)
        km = sm[:, None] & dm[None, :]
        k = tl.load(kp + slot[:, None] * stride_ks + kvh * stride_kh + d[None, :], mask=km, other=0.0)
        if IEEE:
            sc = tl.dot(qt, tl.trans(k), input_precision="ieee")
        else:
            sc = tl.dot(qt, tl.trans(k))
        if CAP:     # softcap * tanh(s / softcap) of the scaled scores, tanh(x) = 1 - 2 / (exp(2x) + 1)
            sc = sc * (sm_scale * 2.0 / softcap)
            sc = tl.where(sm[None, :], softcap - 2.0 * softcap / (tl.exp(sc) + 1.0), float("-inf"))
        else:
            sc = tl.where(sm[None, :], sc * sm_scale, float("-inf"))   # [GP, BS]
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        p = tl.exp(sc - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(vp + slot[:, None] * stride_vs + kvh * stride_vh + d[None, :], mask=km, other=0.0)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    om = gm[:, None] & dm[None, :]
    if DIRECT:      # one split: the normalized output, no partials and no merge launch
        tl.store(out + b * stride_ob + qh[:, None] * stride_oh + d[None, :],
                 (acc / l_i[:, None]).to(out.dtype.element_ty), mask=om)
        return
    base = (b * NS + sp) * H
    tl.store(part_o + (base + qh[:, None]) * BD + d[None, :], acc, mask=om)
    tl.store(part_m + base + qh, m_i, mask=gm)
    tl.store(part_l + base + qh, l_i, mask=gm)
    if MERGE:
        # the last split of (row, KV head) to finish merges the partials (as _merge_kernel, in
        # split order: deterministic) -- no second launch; a CTA barrier, then one acq_rel ticket
        # per program, orders the partial stores before it
        tl.debug_barrier()
        tile = b * tl.num_programs(1) + kvh
        ticket = tl.atomic_add(cnt + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == NS - 1:
            mx = tl.full([GP], float("-inf"), dtype=tl.float32)
            for s_ in range(NS):
                mx = tl.maximum(mx, tl.load(part_m + (b * NS + s_) * H + qh, mask=gm, other=float("-inf"),
                                            cache_modifier=".cg"))
            num = tl.zeros([GP, BD], dtype=tl.float32)
            den = tl.zeros([GP], dtype=tl.float32)
            for s_ in range(NS):
                row = (b * NS + s_) * H + qh
                w = tl.exp(tl.load(part_m + row, mask=gm, other=float("-inf"), cache_modifier=".cg") - mx)
                den += w * tl.load(part_l + row, mask=gm, other=0.0, cache_modifier=".cg")
                num += w[:, None] * tl.load(part_o + row[:, None] * BD + d[None, :], mask=om, other=0.0,
                                            cache_modifier=".cg")
            tl.store(out + b * stride_ob + qh[:, None] * stride_oh + d[None, :],
                     (num / den[:, None]).to(out.dtype.element_ty), mask=om)
            tl.atomic_xchg(cnt + tile, 0)                              # ready for the next launch (graph replays)


@triton.jit
def _merge_kernel(part_o, part_m, part_l, out, stride_ob, stride_oh, H, NS,
                  D: tl.constexpr, BD: tl.constexpr, CH: tl.constexpr):
    """out[b, h] = sum_s w_s acc_s / sum_s w_s l_s, w_s = exp(m_s - max_s m_s): the splits'
    softmax merged by log-sum-exp; an empty split (m = -inf) weighs 0."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    c = tl.arange(0, CH)
    row = b * NS
    mx = tl.full([CH], float("-inf"), dtype=tl.float32)
    for s0 in range(0, NS, CH):
        mx = tl.maximum(mx, tl.load(part_m + (row + s0 + c) * H + h, mask=s0 + c < NS, other=float("-inf")))
    M = tl.max(mx, axis=0)
    d = tl.arange(0, BD)
    num = tl.zeros([BD], dtype=tl.float32)
    den = tl.zeros([CH], dtype=tl.float32)
    for s0 in range(0, NS, CH):
        sm = s0 + c < NS
        w = tl.exp(tl.load(part_m + (row + s0 + c) * H + h, mask=sm, other=float("-inf")) - M)
        den += w * tl.load(part_l + (row + s0 + c) * H + h, mask=sm, other=0.0)
        o = tl.load(part_o + ((row + s0 + c) * H + h)[:, None] * BD + d[None, :], mask=sm[:, None], other=0.0)
        num += tl.sum(o * w[:, None], axis=0)
    tl.store(out + b * stride_ob + h * stride_oh + d, (num / tl.sum(den, axis=0)).to(out.dtype.element_ty),
             mask=d < D)


def split_count(batch: int, n_kv_heads: int, span: int, bs: int, target_programs: int = 264) -> int:
    """Enough programs to fill the GPU (~2 per SM of an H200's 132), at least 2 key tiles each
    (of the span; the kernel divides each row's actual length over the splits)."""
    return max(1, min(triton.cdiv(span, 2 * bs), triton.cdiv(target_programs, batch * n_kv_heads)))


_COUNTERS: dict = {}                      # device -> the in-kernel merge's tickets (they reset themselves)


def _counters(device, need: int) -> torch.Tensor:
    from minfer.ops.cuda.gemv_repack import GemvWorkspace    # the split-K GEMVs' growable ticket counters

    ws = _COUNTERS.get(device)
    if ws is None:
        ws = _COUNTERS[device] = GemvWorkspace(device)
    return ws.counters(need)


def paged_decode_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           n_split: int | None = None, block_keys: int | None = None,
                           target_programs: int = 264, merge_in_kernel: bool = True,
                           sinks: torch.Tensor | None = None, window: int = 0, softcap: float = 0.0,
                           scale: float | None = None, chunk: int = 0) -> torch.Tensor:
    """q (B, H, Dh); pages (n_blocks, page, Hkv, Dh); block_tables (B, M) int32; context_lens (B,)
    int32 (each >= 1) -> (B, H, Dh). The grid spans M * page keys per row. With splits, the last
    program of each (row, KV head) merges them (merge_in_kernel; False: the second kernel).
    sinks (H,) (gpt-oss): each head's extra softmax logit (the SINK variant). window > 0: only
    the last `window` keys (the WINDOW variant; the splits divide those). softcap > 0: scores
    s -> softcap * tanh(s / softcap) (the CAP variant). scale: the scores' factor (1/sqrt(Dh)).
    chunk > 0 (llama4's chunked layers): only the keys of the row's own chunk, from
    (L - 1) // chunk * chunk to L - 1 (the CHUNK variant; the splits divide those)."""
    b, h, dh = q.shape
    _, page, hkv, _ = k_pages.shape
    g = h // hkv
    bs = block_keys or (16 if q.device.type == "cpu" else 64)
    span = block_tables.shape[1] * page
    window = max(0, int(window))
    if window:      # a row reads at most window keys, from lo's tile on: at most window + bs - 1
        span = min(span, window + bs - 1)
    chunk = max(0, int(chunk))
    if chunk:       # likewise at most chunk keys (its chunk's start to the row's position)
        span = min(span, chunk + bs - 1)
    if n_split is None:
        n_split = split_count(b, hkv, span, bs, target_programs)
    n_split = max(1, min(int(n_split), triton.cdiv(span, bs)))
    bd = max(16, triton.next_power_of_2(dh))   # tl.dot's K is at least 16 (a head of 8 is padded, masked)
    direct = n_split == 1
    out = torch.empty((b, h, dh), dtype=q.dtype, device=q.device)
    if direct:
        paths.count("attention.paged_decode.one_split")
        part_o = part_m = part_l = out          # unused by the one-split kernel
    else:
        part_o = torch.empty((b, n_split, h, bd), dtype=torch.float32, device=q.device)
        part_m = torch.empty((b, n_split, h), dtype=torch.float32, device=q.device)
        part_l = torch.empty((b, n_split, h), dtype=torch.float32, device=q.device)
    qq = q if q.dtype == k_pages.dtype else q.to(k_pages.dtype)
    if qq.stride(-1) != 1:
        qq = qq.contiguous()
    kf = k_pages.view(-1, hkv, dh)   # (n_blocks * page, Hkv, Dh): slot-major
    vf = v_pages.view(-1, hkv, dh)
    bt = block_tables if block_tables.dtype == torch.int32 else block_tables.to(torch.int32)
    cl = context_lens if context_lens.dtype == torch.int32 else context_lens.to(torch.int32)
    merge = merge_in_kernel and not direct
    cnt = _counters(q.device, b * hkv) if merge else cl
    if merge:
        paths.count("attention.paged_decode.merge_in_kernel")
    _paged_decode_kernel[(b, hkv, n_split)](
        qq, kf, vf, bt, cl, part_o, part_m, part_l,
        qq.stride(0), qq.stride(1), kf.stride(0), kf.stride(1), vf.stride(0), vf.stride(1), bt.stride(0),
        out, out.stride(0), out.stride(1), cnt,
        h, g, n_split, 1.0 / dh ** 0.5 if scale is None else float(scale),
        PAGE=page, D=dh, BD=bd, GP=max(16, triton.next_power_of_2(g)), BS=bs,
        IEEE=k_pages.dtype == torch.float32, DIRECT=direct, MERGE=merge, num_warps=4,
        SINK=sinks is not None, sinks=None if sinks is None else sinks.float().contiguous(),
        WINDOW=window > 0, window=window, CAP=softcap > 0, softcap=float(softcap) if softcap > 0 else 1.0,
        CHUNK=chunk > 0, chunk=max(chunk, 1))
    if not direct and not merge:
        _merge_kernel[(b, h)](part_o, part_m, part_l, out, out.stride(0), out.stride(1), h, n_split,
                              D=dh, BD=bd, CH=16, num_warps=4)
    return out
