"""gemv_q8_residual: a layer's last q8 GEMV with the residual add (and the next norm's pieces) in the
Gluon kernel's epilogue (moved out of gemv_q8.py, which re-exports the name)."""

from __future__ import annotations

import torch
import triton

from minfer.ops import paths
from minfer.ops.cuda.gemv_q8 import (Q4_K, Q6_K, GemvWorkspace, Repacked, _choose, _glu_cfg_refused, _l2_heads,
                                      _split_scratch, extras, glu_rows_ok, kwarps, x_ahead)


def gemv_q8_residual(q8, rw: Repacked, x: torch.Tensor, act_dtype, ws: GemvWorkspace | None = None,
                     interpret: bool = False, pdl: int = 0, gluon: bool = False, gluon_table: str = "",
                     preload: bool = True, config=None, tail=None, rq=None, refused=None,
                     rq_smem: bool = False, late: int = 0, l2_heads: int = 0, glu=None,
                     split_gather: int = 0) -> tuple | None:
    """(s, ssp): s = x + (W . x_hat rounded to act_dtype), float32 (1, N) -- the residual add of a
    layer's last GEMV, done in the Gluon kernel's epilogue (RSS) -- and ssp (tiles,) float32, each
    row tile's sum of s^2, for the next q/k/v GEMV's norm (gemv_q8's prenorm with ssp:
    Switches.norm_into_gemv = 2). config: an explicit (BN, BB, SPLIT, warps[, prefetch]) instead
    of the table's. None where the Gluon kernel does not take this launch (the interpreter, a
    shape not in its table, another GPU): the caller runs the GEMV and the add + norm kernel.
    tail: (weight (N,), eps) -- the program that finishes the last row tile also makes h =
    rms_norm(s) * weight in act_dtype with its q8 form (Switches.norm_into_gemv = 3,
    gemv_q8g_norm._norm_tail); the result is then (s, ssp, h) with h.q8 set. rq: weight (N,) -- each
    tile's program also makes the q8 form of its rows of s * weight, rstd left to the next GEMV
    (Switches.norm_into_gemv = 4, gemv_q8g_norm._rss_q8); the result is then (s, ssp, (hq, hf)), or
    (s, ssp, None) where the config's tiles are not whole q8 chunks (BN not a multiple of 32); rq_smem:
    that q8 form made from the values in registers (Switches.rq_smem, gemv_q8g_norm._rss_q8_regs). late:
    with PDL, 1 signals the next kernel when the programs end (as the config's late field does), 2
    after their dot products, before the epilogue (Switches.o_signal). l2_heads: as gemv_q8's (the 7B's o
    before gate+up).
    refused (a list): receives why, where the Gluon kernel has the shape but cannot take it. glu: (gate,
    up) rows (1, K) instead of q8 (None): x_hat made from them in the programs (gemv_q8's GLU prologue)."""
    xq, xf = q8 if glu is None else glu
    n, k = rw.n, rw.k
    if rw.qtype not in (Q4_K, Q6_K) or tuple(x.shape) != (1, n) or x.dtype != torch.float32 or (
            xq.numel() * 4 != k if glu is None else not glu_rows_ok(glu, k)):
        return None
    hp = _l2_heads((rw,), ws, l2_heads, None)
    use_g, cfg, why = _choose((rw,), n, k, config, gluon, interpret, gluon_table, xq.device)
    glu_why = None
    if glu is not None and use_g:
        glu_why = _glu_cfg_refused(cfg, k)
        if glu_why is None and tail is not None:
            glu_why = "with the norm tail (norm_into_gemv 3), which has no GLU prologue"
    if not use_g or cfg[2] < 0 or glu_why:         # (stream-K configs have no RSS epilogue)
        if refused is not None and (why or use_g):
            refused.append(why or (f"its config {tuple(cfg)} {glu_why}" if glu_why else
                                   f"its config {tuple(cfg)} is stream-K, which has no residual epilogue"))
        if hp is not None:
            paths.fallback("gemv_q8.l2_heads", "the GEMV before a tile-major one is not the Gluon kernel's residual "
                           "launch: nothing fetched into L2")
        return None
    from minfer.ops.cuda import gemv_q8_gluon as GL

    bn, bb, split, nwarps = cfg[:4]
    prefetch, regs, cfg_late = extras(cfg)
    late = late or cfg_late
    paths.count("gemv_q8.gluon")
    paths.count("gemv_q8.residual_sumsq")
    if hp is not None:
        paths.count("gemv_q8.l2_heads")
    nb = k // 256
    tiles = triton.cdiv(n, bn)
    s = torch.empty((1, n), dtype=torch.float32, device=xq.device)
    ssp = torch.empty(tiles, dtype=torch.float32, device=xq.device)
    bps, split, part, cnt = _split_scratch(nb, split, bb, n, tiles, ws, s)
    ydt = torch.empty(1, dtype=act_dtype, device=xq.device)
    tl_args = h = q8u = None
    if tail is not None:
        paths.count("gemv_q8.norm_tail")
        # the tile tickets and the tail's (cnt[tiles]), zeros between launches, also without a split
        cnt = ws.counters(tiles + 1) if ws is not None else torch.zeros(tiles + 1, dtype=torch.int32, device=xq.device)
        h = torch.empty((1, n), dtype=act_dtype, device=xq.device)
        hq = torch.empty(n // 4, dtype=torch.int32, device=xq.device)
        hf = torch.empty(n // 8, dtype=torch.float32, device=xq.device)
        tl_args = (tail[0], float(tail[1]), h, hq, hf)
        h.q8 = (hq, hf)
    if rq is not None and tail is None and bn % 32 == 0 and n % bn == 0:
        paths.count("gemv_q8.residual_q8")
        q8u = (torch.empty(n // 4, dtype=torch.int32, device=xq.device), torch.empty(n // 8, dtype=torch.float32,
                                                                                    device=xq.device))
    GL.launch((rw,), xq, xf, x, None, s, part, cnt, n, n, tiles, nb, bps, split, bn, bb, nwarps, pdl, (tiles, split),
              prefetch, preload=preload, rss=(ssp, ydt), regs=regs, late=late, tail=tl_args, kwarps=kwarps(cfg),
              x_ahead=x_ahead(cfg), rss_q8=(rq, *q8u) if q8u is not None else None, per_sm=GL.per_sm(cfg),
              rq_smem=rq_smem, l2_heads=hp, glu=glu, gather=split_gather)
    if tail is not None:
        return s, ssp, h
    return (s, ssp, q8u) if rq is not None else (s, ssp)
