"""Stream-K for the Gluon one-row q8 GEMV (gemv_q8_gluon.py; issue 12): a config whose SPLIT is
negative deals the tiles' K steps evenly over -SPLIT programs, a program's run crossing tile
boundaries, so that a one-wave grid of k programs an SM gives every SM the same work (a K split
leaves some SMs one program more). Each program runs gemv_q8_gluon._tile once per tile it touches
(its SK branch); the partials of a tile are summed in K order by the last of its programs to
finish. Measured slower than the K split on the 7B's downs (+12..+21 us a step, docs/perf-log.md
AC1), kept as a tested config form in no shipped table; gemv_q8.gemv_q8 launches it for SPLIT < 0
(counted gemv_q8.gluon.stream_k)."""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from minfer.ops.cuda.gemv_q8_gluon import _opts, _pdl_mode, _prefetch2_error, _tile, kernel_planes


@gluon.jit
def _gemv_q8g_sk_kernel(p0, p1, p2, p3, xq, xf, resid, bias, out, part, cnt, N, NB, S, P, U,
                        QT: gl.constexpr, BN: gl.constexpr, BB: gl.constexpr, NW: gl.constexpr,
                        HAS_BIAS: gl.constexpr, HAS_RESID: gl.constexpr, PDL: gl.constexpr, PF: gl.constexpr = True,
                        PRE: gl.constexpr = False, TM: gl.constexpr = 0):
    """out (1, N) = W_deq . x_hat [+ bias] [+ resid], stream-K: the U = tiles x S steps (S steps of
    BB blocks a row tile, tile-major) dealt out to the P programs in contiguous runs of floor(U / P)
    or one more (program p: steps [p U / P, (p + 1) U / P)), so every program -- and every SM, with
    P a multiple of the SMs in one wave -- does the same work; a run may cross into the next tile
    (_tile once per tile it touches). Step u belongs to program ((u + 1) P - 1) / U. Program p's
    partial of tile t goes to slot p + t (unique: a later program starts at or after an earlier
    one's last tile), so tile t's programs pf..pl hold slots pf + t..pl + t, summed in that order
    by the last of them to finish (_tile's SK)."""
    pid = gl.program_id(0)
    u0 = pid * U // P
    u1 = (pid + 1) * U // P
    for t in range(u0 // S, (u1 - 1) // S + 1):
        lo = gl.maximum(u0, t * S) - t * S
        hi = gl.minimum(u1, t * S + S) - t * S
        pf = ((t * S + 1) * P - 1) // U
        pl = ((t * S + S) * P - 1) // U
        _tile(p0, p1, p2, p3, xq, xf, resid, bias, out, part, cnt, t, 0, N, N, NB, 0, 1, xq, xf, 1,
              out, out, out, out, 0.0, 0, out, out, QT, BN, BB, NW, False, HAS_BIAS, HAS_RESID, PDL, PF, False, PRE,
              SK=True, sk_lo=lo * BB, sk_hi=gl.minimum(hi * BB, NB), sk_slot=pid + t, sk_first=pf + t,
              sk_n=pl - pf + 1, TM=TM)



def sk_scratch(n: int, bn: int, programs: int, ws, device) -> tuple:
    """(part, cnt) of a stream-K launch: a float32 slot of BN values for each (program, tile) pair
    that can occur (programs + tiles - 1, _gemv_q8g_sk_kernel) and the tiles' tickets (the
    workspace's self-resetting counters)."""
    tiles = -(-n // bn)
    part = torch.empty((programs + tiles) * bn, dtype=torch.float32, device=device)
    cnt = ws.counters(tiles) if ws is not None else torch.zeros(tiles, dtype=torch.int32, device=device)
    return part, cnt


def launch_sk(rw, xq, xf, resid, bias, out, part, cnt, programs: int, bn, bb, nwarps, pdl, prefetch: bool = True,
              late: bool = False, preload: bool = True, regs: int = 0):
    """One weight's GEMV, stream-K over `programs` programs (_gemv_q8g_sk_kernel; a table config
    whose SPLIT is -programs). part / cnt: sk_scratch's."""
    n, nb = rw.n, rw.k // 256
    s = -(-nb // bb)
    u = -(-n // bn) * s
    if not 1 <= programs <= u:
        from minfer.errors import MinferError

        raise MinferError(f"gemv_q8 stream-K: {programs} programs for {u} steps of {n}x{rw.k} (1 to {u})")
    if int(prefetch) == 2:
        _prefetch2_error(n, nb, "stream-K runs over many steps")
    p = kernel_planes(rw)
    _gemv_q8g_sk_kernel[(programs,)](p[0], p[1], p[2], p[3], xq, xf, resid if resid is not None else out,
                                     bias if bias is not None else out, out, part, cnt, n, nb, s, programs, u,
                                     QT=rw.qtype, BN=bn, BB=bb, NW=nwarps, HAS_BIAS=bias is not None,
                                     HAS_RESID=resid is not None, PDL=_pdl_mode(pdl, late), PF=bool(prefetch),
                                     PRE=bool(preload), TM=rw.tile_rows, num_warps=nwarps, **_opts(pdl, regs))
