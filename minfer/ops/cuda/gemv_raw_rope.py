"""Rope and the KV cache append in the raw-block q/k/v GEMV's epilogue (Switches.gemv_raw_rope; issue 12): the
one-pass raw GEMV over a layer's stacked q/k/v blocks (gemv.fuse_raw_group: Qwen2.5-0.5B's Q5_0 q/k/v) stores q
rotated, and k rotated and v straight into the caches' row at the step's position, so the small models' decode
step has no rope_kv launch between the q/k/v GEMV and the attention -- the raw form of gemv_q8g_rope.py's.

A rotation pairs value j of a head with value j + Dh/2 (neox) or 2j with 2j + 1 (normal), rows a BN-row tile of
consecutive rows does not hold together. So a program's BN rows are a permutation of its head's rows
(`rope_row`): lanes l < BN/2 the first values of pairs jj = u BN/2 + l (u: the tile's place in its head), lanes
BN/2 + l their second values. The raw rows stay where they are; only which rows a program reads changes. The
epilogue (`rope_store`) rounds the sums (bias added) to the output dtype, as the GEMV's output was when the rope_kv
kernel read it, and does that kernel's arithmetic (norm_rope_act.rope_angles: the angle in float64 turns, cos /
sin in float32; norm_rope_act.rope_rotate: a c - b s and a s + b c with fixed roundings, then the cache dtype); v
rows are stored as they are.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minfer.ops import paths
from minfer.ops.cuda.norm_rope_act import rope_angles, rope_rotate


@triton.jit
def rope_row(pid_n, lane, BN: tl.constexpr, HD: tl.constexpr, NEOX: tl.constexpr):
    """The stacked row that lane `lane` (any shape, values in [0, BN)) of tile pid_n reads."""
    HB: tl.constexpr = BN // 2
    base = pid_n * BN
    jj = ((base % HD) // BN) * HB + lane % HB
    half = lane // HB
    if NEOX:
        idx = half * (HD // 2) + jj
    else:
        idx = 2 * jj + half
    return (base // HD) * HD + idx


@triton.jit
def rope_store(v, out, pid_n, rp, rt, kc, vc, nq, nk, kvs, BN: tl.constexpr, HD: tl.constexpr, NEOX: tl.constexpr):
    """Tile pid_n's row sums v [BN] (lanes as rope_row's; bias added) rounded to out's dtype, rotated and stored:
    q rows at out + their row, k rows rotated and v rows as they are at kc / vc + pos * kvs + their row in k / v
    (pos = *rp; rt: the (HD/2,) float64 turns, norm_rope_act._turns)."""
    HB: tl.constexpr = BN // 2
    dt = out.dtype.element_ty
    v = v.to(dt).to(tl.float32)                     # the GEMV output's rounding, as rope_kv read it
    a, b = tl.split(tl.permute(tl.reshape(v, (2, HB)), (1, 0)))
    m = tl.arange(0, HB)
    base = pid_n * BN
    head = (base // HD) * HD                        # the head's first row in the stacked q/k/v rows
    jj = ((base % HD) // BN) * HB + m
    p = tl.load(rp)
    c, s, ia, ib = rope_angles(p, rt, jj, jj < HD // 2, HD // 2, NEOX)
    if head < nq + nk:
        ra, rb = rope_rotate(a, b, c, s)
        ra = ra.to(dt)
        rb = rb.to(dt)
        if head < nq:
            dst = out + head
        else:
            dst = kc + p * kvs + (head - nq)
    else:
        ra = a.to(dt)
        rb = b.to(dt)
        dst = vc + p * kvs + (head - nq - nk)
    tl.store(dst + ia, ra)
    tl.store(dst + ib, rb)


def raw_qkv_rope(x: torch.Tensor, wts, biases, positions: torch.Tensor, cfg, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, sw, ws) -> torch.Tensor | None:
    """q (1, Hq * Dh) rotated, with rope(k) and v stored at row positions[0] of the layer's caches, for a decode
    row x (1, D) through a q/k/v group stacked as one raw block tensor (wts[0].raw_group holding all three), in
    one one-pass raw GEMV launch (counted `gemv.raw_rope`); None where that launch does not apply (the switch
    off, another group, a K past the one-pass tile, tiles that do not pair a head's rows, the caches' layout):
    the caller goes the usual way (linear_many, then the rope_kv kernel)."""
    from minfer.ops.cuda import gemv as G
    from minfer.ops.cuda import qmatmul as QM
    from minfer.ops.cuda.norm_rope_act import _turns

    if not sw.gemv_raw_rope:
        return None
    rg = getattr(wts[0], "raw_group", None)
    if rg is None or len(rg[0]) != 3 or not sw.gemv_raw_fuse or not sw.gemv_one_pass or x.shape[0] != 1:
        return None
    lead, cat = rg
    hd = k_cache.shape[-1]
    nq, nk, nv = (w.shape[0] for w in lead)
    n, k = nq + nk + nv, lead[0].shape[1]
    tile = G.one_pass_tile(1, n, k, sw.gemv_raw_tile4)
    kc, vc = k_cache, v_cache
    if (tile is None or tile[0] % 2 or hd % tile[0] or nq % hd or nk % hd or nv != nk or cfg.n_rot != hd
            or cfg.style not in ("neox", "normal") or not (x.dtype == kc.dtype == vc.dtype)
            or kc.stride()[1:] != (hd, 1) or vc.stride() != kc.stride()
            or any(QM._dense_plane(x, w, getattr(w, "batch_dense", None), sw) is not None for w in lead)):
        return None
    QM._realized(x, "the raw q/k/v GEMV with the rope epilogue")
    if x.stride(-1) != 1:
        x = x.contiguous()
    paths.count("gemv.raw_rope")
    out = G.gemv(x, cat, lead[0].qtype, n, k, bias=ws.group_bias(lead, biases[:3], torch.float32),
                 interpret=QM.interpret(), rope=(positions.reshape(1), _turns(cfg, str(x.device)), kc, vc, nq, nk, hd,
                                                  cfg.style == "neox"), **G.raw_kw(sw, x))
    return out[:, :nq]

