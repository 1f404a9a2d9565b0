"""Rope and the KV cache append in the q/k/v GEMV's epilogue (gemv_q8_gluon._tile's RP;
Switches.qkv_rope; issue 12): the Gluon q8 GEMV over a layer's stacked q/k/v rows stores q rotated,
and k rotated and v straight into the caches' row at the step's position, so the decode step has no
rope_kv launch between the q/k/v GEMV and the attention.

A rotation pairs value j of a head with value j + Dh/2 (neox) or 2j with 2j + 1 (normal): rows that
a BN-row tile of consecutive rows does not hold together. So with RP a program's BN rows are not
consecutive: tile t covers pair indices jj = u * BN/2 + m (m < BN/2) of head h, where h and u are
t's head and its place in the head (HD / BN tiles a head), lanes m holding row a = pair jj's first
value and lanes BN/2 + m its second (_rope_rows). The planes stay row-major: a program's loads are
per row as before, only which rows. The epilogue (_rope_finish) adds the bias, rounds to the output
dtype (as the GEMV output the rope_kv kernel read), swaps the halves through shared memory, and does
norm_rope_act._rope_kv_kernel's arithmetic: the angle in float64 turns (rope_angles), cos/sin in
float32, a * c - b * s and a * s + b * c as norm_rope_act.rope_rotate rounds them, then the cache dtype; v rows
are stored unrotated.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _rope_rows(pid_n, BN: gl.constexpr, HD: gl.constexpr, NEOX: gl.constexpr, layout: gl.constexpr):
    """Tile pid_n's BN rows (a permutation of the head's HD rows over its HD / BN tiles): lane l < BN/2
    the first value of pair jj = u BN/2 + l, lane BN/2 + l its second."""
    HB: gl.constexpr = BN // 2
    lane = gl.arange(0, BN, layout=layout)
    base = pid_n * BN
    jj = ((base % HD) // BN) * HB + lane % HB
    half = lane // HB
    if NEOX:
        idx = half * (HD // 2) + jj
    else:
        idx = 2 * jj + half
    return (base // HD) * HD + idx


@gluon.jit
def _rope_finish(v, rows, rmask, bias, bpre, out, pid_n, row0, rp, rt, kc, vc, nq, nk, kvs, HAS_BIAS: gl.constexpr,
                 PRE: gl.constexpr, BN: gl.constexpr, HD: gl.constexpr, NEOX: gl.constexpr, NW: gl.constexpr):
    """Tile pid_n's row sums v (rows from _rope_rows; + bias) rotated and stored: q rows (the stacked
    rows' first nq, row0 + the tile's head row) at out + their row, k rows rotated and v rows as
    they are into kc / vc + pos * kvs + their row in k / v (pos = *rp; rt: the (HD/2,) float64
    turns table, norm_rope_act._turns)."""
    HB: gl.constexpr = BN // 2
    if HAS_BIAS:
        if PRE:
            v += bpre
        else:
            v += gl.load(bias + rows, mask=rmask, other=0.0).to(gl.float32)
    dt = out.dtype.element_ty
    sm = gl.allocate_shared_memory(gl.float32, [BN], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    sm.store(v.to(dt).to(gl.float32))             # the GEMV output's rounding, as rope_kv read it
    gl.thread_barrier()
    LH: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[NW], order=[0])
    a = sm.slice(0, HB).load(LH)
    b = sm.slice(HB, HB).load(LH)
    m = gl.arange(0, HB, layout=LH)
    base = pid_n * BN
    head = (base // HD) * HD                      # the head's first row in this segment
    jj = ((base % HD) // BN) * HB + m
    if NEOX:
        ia = jj
        ib = jj + HD // 2
    else:
        ia = 2 * jj
        ib = 2 * jj + 1
    g0 = row0 + head                              # ... in the stacked q/k/v rows
    p = gl.load(rp)
    if g0 < nq + nk:
        t = p.to(gl.float64) * gl.load(rt + jj)
        ang = (t - gl.floor(t)).to(gl.float32) * 6.283185307179586
        c = gl.cos(ang)
        s = gl.sin(ang)
        ra = gl.fma(a, c, -(b * s)).to(dt)        # norm_rope_act.rope_rotate's roundings (Gluon calls no
        rb = gl.fma(a, s, b * c).to(dt)           # triton.jit helper): the same bits as the rope_kv kernel
        if g0 < nq:
            dst = out + head
        else:
            dst = kc + p * kvs + (g0 - nq)
    else:
        ra = a.to(dt)
        rb = b.to(dt)
        dst = vc + p * kvs + (g0 - nq - nk)
    gl.store(dst + ia, ra)
    gl.store(dst + ib, rb)
