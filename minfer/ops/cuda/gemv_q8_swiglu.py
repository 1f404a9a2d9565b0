"""gemv_q8_swiglu: the stacked [gate; up] q8 GEMV with the SwiGLU epilogue (moved out of gemv_q8.py, which
re-exports the name)."""

from __future__ import annotations

import torch
import triton

from minfer.errors import MinferError
from minfer.ops import paths
from minfer.ops.cuda.gemv_q8 import (Q4_K, Q6_K, GemvWorkspace, Repacked, _choose, _l2_heads, _l2_regions, _planes4,
                                      extras, kwarps, region_args)


def gemv_q8_swiglu(q8, rw: Repacked, out_dtype=torch.bfloat16, config=None, ws: GemvWorkspace | None = None,
                   asm: bool | None = None, interpret: bool = False, pdl: int = 0, pdl_prefetch: int = 1,
                   l2: tuple | None = None, gluon: bool = False, pdl_late: bool = False, gluon_table: str = "",
                   paired: bool = False, l2_heads: int = 0):
    """(h (1, F), q8 of h): h = silu(W_gate x_hat) * (W_up x_hat) for the stacked [gate; up]
    planes rw (2F rows), in ONE launch (_glu_pair: the GEMV's epilogue does what swiglu_q8 did
    after it, bit for bit). No K split (each row tile pairs with one other: a config's SPLIT is
    ignored); F a multiple of 256 and of the row tile, the tile a multiple of 32 rows.

    gluon: the Gluon kernel (gemv_q8g_norm._glu_pair, the same epilogue) when its table has a
    config for the stacked shape (the 7B's gate+up: "Q4_K 37888x3584") or one is given
    explicitly (BN, BB, SPLIT, warps[, prefetch]), its tile pairs (BN a power of two, F % BN ==
    0, BN % 32 == 0) and it runs on this GPU; not on the interpreter, not with l2 ranges (as
    gemv_q8). A config the GPU or the pairing refuses is counted as a `gemv_q8.gluon` fallback; the
    Triton kernel then runs with `config` if one was given, else its own table's. Each launch is
    counted as `gemv_q8.gluon` or `gemv_q8.triton`. paired: Switches.gemv_swiglu 2 (launch_swiglu)."""
    xq, xf = q8
    n, k = rw.n, rw.k
    f = n // 2
    if n % 2 or f % 256 or rw.qtype not in (Q4_K, Q6_K) or xq.numel() * 4 != k:
        raise MinferError(f"gemv_q8_swiglu: {n}x{k} type {rw.qtype} is not a [gate; up] pair of a multiple of "
                          f"256 rows each (for {xq.numel() * 4} activations)")
    def pairs(cfg) -> str | None:
        bn = cfg[0]
        if f % bn or bn % 32 or bn & (bn - 1):
            return f"{bn}-row tiles do not pair the gate/up halves of {f} rows"
        return None

    use_g, cfg, why = _choose((rw,), n, k, config, gluon and not l2, interpret, gluon_table, xq.device, pairs)
    if _l2_heads((rw,), ws, l2_heads, l2) is not None:      # (noted, for the plan's cycle)
        paths.fallback("gemv_q8.l2_heads", "the SwiGLU GEMV takes no L2 heads ranges: nothing fetched")
    bn, bb, _, nwarps = cfg[:4]
    if kwarps(cfg):
        raise MinferError(f"gemv_q8_swiglu: config {tuple(cfg)} asks for warps along K (its eighth field), which "
                          "the SwiGLU pair's kernel does not run")
    prefetch, regs, late = extras(cfg)
    pdl_late = pdl_late or late
    if f % bn or bn % 32:
        raise MinferError(f"gemv_q8_swiglu: {n}x{k} type {rw.qtype} with {bn}-row tiles is not a [gate; up] "
                          f"pair of a multiple of 256 rows each")
    if why is not None:
        paths.fallback("gemv_q8.gluon", why)
    if paired and not use_g:    # (the Triton kernel has the ticketed epilogue only)
        paths.fallback("gemv_q8.glu_paired", why or f"no Gluon config for {n}x{k}: the ticketed Triton epilogue")
    paths.count("gemv_q8.gluon" if use_g else "gemv_q8.triton")
    nb = k // 256
    bps = triton.cdiv(nb, bb) * bb
    tiles = n // bn
    dev = xq.device
    h = torch.empty((1, f), dtype=out_dtype, device=dev)
    gq = torch.empty(f // 4, dtype=torch.int32, device=dev)
    gf = torch.empty(f // 8, dtype=torch.float32, device=dev)
    part = torch.empty(n, dtype=torch.float32, device=dev)
    cnt = ws.counters(tiles // 2) if ws is not None else torch.zeros(tiles // 2, dtype=torch.int32, device=dev)
    if use_g:
        from minfer.ops.cuda import gemv_q8_gluon as GL

        GL.launch_swiglu(rw, xq, xf, h, part, cnt, gq, gf, bn, bb, nwarps, pdl, prefetch, late=pdl_late,
                         regs=regs, paired=paired)
        return h, (gq, gf)
    from minfer.ops.cuda import gemv_q8 as Q      # (its kernel at call time: tests reload it interpreted)

    p0, p1, p2, p3 = _planes4(rw)
    pf, npf = region_args(_l2_regions((rw,), ws, l2, interpret))
    Q._gemv_q8_kernel[(tiles, 1)](p0, p1, p2, p3, p0, p1, p2, p3, xq, xf, h, h, h, part, cnt, gq, gf, tiles // 2,
                                n, n, tiles, nb, 0, bps, 1, *pf, NPF=npf, NT=32 * nwarps, GLU=True, QT=rw.qtype,
                                QTB=rw.qtype, MIXED=False, BN=bn, BB=bb, IS_SPLIT=False, HAS_BIAS=False, HAS_RESID=False,
                                ASM=(not interpret) if asm is None else asm, PREFETCH=bool(prefetch), PDL=min(int(pdl), 1),
                                PRE2=bool(prefetch) and pdl_prefetch >= 2 and bn * bb <= 64, TM=rw.tile_rows,
                                nx=h, ng=h, s_out=h, h_rn=h, rcnt=cnt, eps=0.0,
                                num_warps=nwarps, num_stages=1, **Q.launch_kw(pdl))
    return h, (gq, gf)
