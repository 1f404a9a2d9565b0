"""One new decode token's rope, KV cache append and attention in the attention's own launches
(Switches.decode_attn_rope, off: not faster on the H200, perf-log U5). Moved unchanged out of
attention.py, whose split kernel and helpers (_attn_tile, _kv_tile, _n_split, _key_tile) it
shares."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minfer.ops import paths
from minfer.ops.context import DEFAULT, Context
from minfer.ops.cuda.attention import _attn_tile, _fold_score, _key_tile, _kv_tile, _n_split
from minfer.ops.cuda.decode_merge import merge, partials
from minfer.ops.cuda.norm_rope_act import _turns, rope_angles, rope_rotate
from minfer.ops.cuda.pdl import enabled as pdl_enabled
from minfer.ops.cuda.pdl import enter as pdl_enter
from minfer.ops.cuda.pdl import launch_kw


@triton.jit
def _decode_attn_rope_kernel(q, k, v, pos, turns, kc, vc, part_o, part_m, part_l,
                             stride_qh, stride_knh, stride_vnh, stride_ks, stride_kh, stride_vs, stride_vh,
                             H, G, sm_scale, window, softcap,
                             D: tl.constexpr, NEOX: tl.constexpr, GP: tl.constexpr, BS: tl.constexpr,
                             IEEE: tl.constexpr, PDL: tl.constexpr, CAP: tl.constexpr = False,
                             PREWAIT: tl.constexpr = False):
    """_decode_attn_kernel with rope_kv's work folded in (one launch for what _rope_kv_kernel
    and this kernel did in two): q, k, v are the step's raw projections of the new token at
    position pos (the key count is pos + 1). Each program rotates its heads' q in registers; the
    new key (rotated) and value enter the online softmax of the program whose key range holds
    row pos straight from registers, and that program also stores them in the caches for later
    steps. The rotation is norm_rope_act._rope_kv_kernel's (angle in float64 turns, then cos/sin
    in float32), the rotated q and k rounded to the cache dtype as that kernel's outputs were.

    PREWAIT (Switches.decode_attn_prewait): before the PDL wait the program reads what no
    kernel of this step writes (pdl.py's contract): the position (copied in before the step's
    first kernel), the rope table and its first tile of cached keys/values, all rows < pos
    (written by earlier steps; the new row is the one it does not load), so those loads overlap
    the q/k/v GEMV's end; the other tiles follow in a loop of their own. Without it the program
    waits first and runs one loop over all its cached tiles (the compiler pipelines it, as in
    _decode_attn_kernel)."""
    if not PREWAIT:
        pdl_enter(PDL)
    kvh = tl.program_id(0)
    sp = tl.program_id(1)
    p = tl.load(pos)
    L = p + 1
    kps = tl.cdiv(tl.cdiv(L, tl.num_programs(1)), BS) * BS          # as _decode_attn_kernel
    lo = sp * kps
    s1 = tl.minimum(lo + kps, L)
    s0 = tl.maximum(lo, L - window)
    s_end = tl.minimum(s1, L - 1)                                   # cached rows; row L-1 is the new key
    owner = (lo <= L - 1) & (L - 1 < lo + kps)
    d = tl.arange(0, D)
    if PREWAIT:
        s = s0 + tl.arange(0, BS)
        sm = s < s_end
        k0, v0 = _kv_tile(kc, vc, s, sm[:, None], kvh, d, stride_ks, stride_kh, stride_vs, stride_vh)
    HALF: tl.constexpr = D // 2
    j = tl.arange(0, HALF)
    c, sn, ia, ib = rope_angles(p, turns, j, j < HALF, HALF, NEOX)
    if PREWAIT:
        pdl_enter(PDL)   # q, k, v come from the GEMV just before
    g = tl.arange(0, GP)
    gm = g < G
    qh = kvh * G + g
    qa = tl.load(q + qh[:, None] * stride_qh + ia[None, :], mask=gm[:, None], other=0.0).to(tl.float32)
    qb = tl.load(q + qh[:, None] * stride_qh + ib[None, :], mask=gm[:, None], other=0.0).to(tl.float32)
    ka = tl.load(k + kvh * stride_knh + ia).to(tl.float32)
    kb = tl.load(k + kvh * stride_knh + ib).to(tl.float32)
    vn = tl.load(v + kvh * stride_vnh + d).to(kc.dtype.element_ty)
    ra, rb = rope_rotate(qa, qb, c[None, :], sn[None, :])
    ra = ra.to(kc.dtype.element_ty)
    rb = rb.to(kc.dtype.element_ty)
    kra, krb = rope_rotate(ka, kb, c, sn)
    kra = kra.to(kc.dtype.element_ty)
    krb = krb.to(kc.dtype.element_ty)
    krow = kc + (L - 1).to(tl.int64) * stride_ks + kvh * stride_kh
    tl.store(krow + ia, kra, mask=(j < HALF) & owner)
    tl.store(krow + ib, krb, mask=(j < HALF) & owner)
    tl.store(vc + (L - 1).to(tl.int64) * stride_vs + kvh * stride_vh + d, vn, mask=(d < D) & owner)
    # the rotated q rows in the layout of the head dim: halves side by side (neox) or pairs
    # interleaved (normal)
    if NEOX:
        qt = tl.reshape(tl.permute(tl.join(ra, rb), (0, 2, 1)), (GP, D))
    else:
        qt = tl.interleave(ra, rb)
    m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, D], dtype=tl.float32)
    first = s0
    if PREWAIT:
        if s0 < s_end:
            m_i, l_i, acc = _attn_tile(qt, k0, v0, sm, m_i, l_i, acc, sm_scale, softcap, IEEE, CAP)
        first = s0 + BS
    for start in range(first, s_end, BS):
        s = start + tl.arange(0, BS)
        sm = s < s_end
        kt, vt = _kv_tile(kc, vc, s, sm[:, None], kvh, d, stride_ks, stride_kh, stride_vs, stride_vh)
        m_i, l_i, acc = _attn_tile(qt, kt, vt, sm, m_i, l_i, acc, sm_scale, softcap, IEEE, CAP)
    if owner:
        # the new key: its score per query row from the rounded q and k, as the cached keys'
        sc = tl.sum(ra.to(tl.float32) * kra.to(tl.float32)[None, :] + rb.to(tl.float32) * krb.to(tl.float32)[None, :],
                    axis=1)                                                            # [GP]
        m_i, l_i, acc = _fold_score(sc, vn, m_i, l_i, acc, sm_scale, softcap, CAP)
    tl.store(part_o + (sp * H + qh[:, None]) * D + d[None, :], acc, mask=gm[:, None])
    tl.store(part_m + sp * H + qh, m_i, mask=gm)
    tl.store(part_l + sp * H + qh, l_i, mask=gm)


def rope_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, turns,
                          neox: bool, k_cache: torch.Tensor, v_cache: torch.Tensor, window: int = 0,
                          q8: bool = False, pdl: int = 0, programs: int = 264, softcap: float = 0.0,
                          n_split: int | None = None, prewait: bool = False, combine_chunk: int = 32) -> torch.Tensor:
    """One new token's rope, KV append and decode attention in the launches of the attention
    alone (_decode_attn_rope_kernel, then the merge): q (1, H, Dh), k and v (1, Hkv, Dh) the raw
    projections at position positions[0] (a (1,) int64 device tensor, so a graph replays at any
    position); rope(k) and v are stored at that row of the caches (S, Hkv, Dh); returns the
    attention of rope(q) over rows [0, pos] -> (1, H, Dh), with .q8 when q8 (as
    decode_attention). turns: the (Dh/2,) float64 rope table (norm_rope_act._turns). Caller's
    conditions: the whole head rotated, Dh a power of 2, one dtype for q/k/v/caches, pos inside
    the cache (no host check: graph replays). combine_chunk: as decode_attention's."""
    _, h, dh = q.shape
    s_max, hkv, _ = k_cache.shape
    g = h // hkv
    bs = _key_tile(q)
    n_split = _n_split(s_max, bs, hkv, programs, n_split)
    part_o, part_m, part_l = partials(n_split, h, dh, q.device)
    _decode_attn_rope_kernel[(hkv, n_split)](
        q, k, v, positions, turns, k_cache, v_cache, part_o, part_m, part_l,
        q.stride(1), k.stride(1), v.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0),
        v_cache.stride(1), h, g, 1.0 / dh ** 0.5, window if window > 0 else 1 << 30,
        float(softcap) if softcap > 0 else 1.0,
        D=dh, NEOX=neox, GP=max(16, triton.next_power_of_2(g)), BS=bs, IEEE=k_cache.dtype == torch.float32,
        PDL=pdl, CAP=softcap > 0, PREWAIT=prewait, num_warps=4, **launch_kw(pdl))
    return merge(part_o, part_m, part_l, n_split, q.dtype, h, dh, q8, pdl, combine_chunk)


def rope_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cfg,
                   k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: Context | None = None, window: int = 0,
                   softcap: float = 0.0) -> torch.Tensor | None:
    """One decode token's rope(q), rope(k) + v appended to the caches at positions[0], and its
    attention over rows [0, pos] -> (1, H, Dh), in the launches of the attention alone
    (rope_decode_attention; path attention.decode.rope[.window][.softcap]). None when that
    kernel does not apply -- T > 1, Switches.decode_attn_rope or decode_attention off, a partial
    rotation, a head dim that is not a power of 2, mixed dtypes -- and the caller then rotates,
    writes and attends apart (rope_kv.triton, attention.decode.triton, each counted)."""
    sw = (ctx or DEFAULT).switches
    t, h, dh = q.shape
    path = "attention.decode.rope" + (".window" if window > 0 else "") + (".softcap" if softcap > 0 else "")
    if t != 1 or not sw.decode_attention:
        return None
    if not sw.decode_attn_rope:
        paths.switched_off(path, "MINFER_DECODE_ATTN_ROPE")
        return None
    hkv = k_cache.shape[1]
    if (cfg.n_rot != dh or dh < 16 or dh & (dh - 1) or cfg.style not in ("normal", "neox") or h % hkv
            or not (q.dtype == k.dtype == v.dtype == k_cache.dtype == v_cache.dtype)
            or q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1):
        return None
    paths.count(path)
    return rope_decode_attention(q, k, v, positions.reshape(1), _turns(cfg, str(q.device)), cfg.style == "neox",
                                 k_cache, v_cache, window=window, q8=q.dtype != torch.float32 and sw.gemv_q8,
                                 pdl=pdl_enabled(sw, q.device, "decode_attention", early_ok=True),
                                 programs=sw.decode_attn_programs, softcap=softcap,
                                 prewait=sw.decode_attn_prewait, combine_chunk=sw.decode_combine_chunk)
