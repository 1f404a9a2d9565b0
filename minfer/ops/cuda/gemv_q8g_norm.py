"""The RMSNorm prologue and the residual epilogue of the Gluon q8 GEMV (gemv_q8_gluon._tile's
NORM and RSS; Switches.norm_into_gemv, perf-log W3; its default, 4, takes NORM 4 and RQ).

NORM 1: the program sums the squares of the whole row x + y (the residual and the previous
GEMV's output) itself (_norm_rstd); NORM 2: it adds up the per-tile sums of squares the GEMV
before stored (_ss_rstd). Either way it then makes the q8 form of its own chunks of the normed
row once, in shared memory (_norm_q8_smem), which its K loop reads instead of xq / xf. RSS: the
layer's last GEMV stores x + its rounded output and each tile's sum of squares (_finish_rss).
NORM 4 with RQ: that GEMV also makes the q8 form of its tiles of s * weight without rstd
(_rss_q8), and the next GEMV reads it as any q8 row and scales its row sums by rstd.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _norm_rstd(nx, ny, s_out, eps, K, store, KP2: gl.constexpr, NW: gl.constexpr):
    """1 / sqrt(mean(s^2) + eps) of the row s = nx + ny (K values, float32 + the GEMV output's
    dtype, added in float32 as q8_rows._q8_kernel's ADD); store: this program also writes s."""
    LR: gl.constexpr = gl.BlockedLayout(size_per_thread=[KP2 // (32 * NW)], threads_per_warp=[32],
                                        warps_per_cta=[NW], order=[0])
    kk = gl.arange(0, KP2, layout=LR)
    km = kk < K
    a = gl.load(nx + kk, mask=km, other=0.0).to(gl.float32) + gl.load(ny + kk, mask=km, other=0.0).to(gl.float32)
    if store:
        gl.store(s_out + kk, a, mask=km)
    return 1.0 / gl.sqrt(gl.sum(a * a, axis=0) / K + eps)


@gluon.jit
def _ss_rstd(ssp, nss, eps, K, TP2: gl.constexpr, NW: gl.constexpr):
    """1 / sqrt(mean(s^2) + eps) from the nss per-tile sums of squares ssp (_finish_rss)."""
    return _ss_sum_rstd(_ss_load(ssp, nss, TP2, NW), eps, K)


@gluon.jit
def _ss_load(ssp, nss, TP2: gl.constexpr, NW: gl.constexpr):
    """The nss per-tile sums of squares ssp, loaded (_ss_rstd's load). RL (Switches.norm_rstd_late):
    issued after the PDL wait and summed by _ss_sum_rstd only after the K loop, so the load's round
    trip runs under the loop instead of before it (the sum over the warps is a barrier that waits
    for it: before the loop, the x loads and the first dot waited behind it)."""
    LR: gl.constexpr = gl.BlockedLayout(size_per_thread=[(TP2 + 32 * NW - 1) // (32 * NW)], threads_per_warp=[32],
                                        warps_per_cta=[NW], order=[0])
    t = gl.arange(0, TP2, layout=LR)
    return gl.load(ssp + t, mask=t < nss, other=0.0)


@gluon.jit
def _ss_sum_rstd(v, eps, K):
    """rstd from the loaded tile sums v (_ss_load): the same sum in the same layout, so the same bits
    wherever it is taken."""
    return 1.0 / gl.sqrt(gl.sum(v, axis=0) / K + eps)


@gluon.jit
def _norm_v(nx, ny, ng, rstd, off, m, HAS_Y: gl.constexpr = True, GX: gl.constexpr = False):
    """(nx [+ ny]) * rstd * ng at offsets off (masked: 0), in float32: q8_rows._q8_kernel's v. GX (the
    GLU prologue): silu(nx) * ny instead, in q8_rows._q8_kernel's SWIGLU formula (ng, rstd unused)."""
    v = gl.load(nx + off, mask=m, other=0.0).to(gl.float32)
    if GX:
        u = gl.load(ny + off, mask=m, other=0.0).to(gl.float32)
        return v / (1.0 + gl.exp(-v)) * u
    if HAS_Y:
        v += gl.load(ny + off, mask=m, other=0.0).to(gl.float32)
    return v * rstd * gl.load(ng + off, mask=m, other=0.0).to(gl.float32)


@gluon.jit
def _norm_q8_smem(nx, ny, ng, rstd, c0, c1, C: gl.constexpr, NCHP: gl.constexpr, NW: gl.constexpr,
                  HAS_Y: gl.constexpr, GX: gl.constexpr = False):
    """The q8 form of chunks [c0, c1) of the normed row ((nx [+ ny]) * rstd * ng; chunks past c1
    are zero) in shared memory, by step (C chunks an index): the low words [NCHP / C, C, 4]
    (word w: values w, w+8, w+16, w+24 as bytes), the high words (values 4 + w, ...), and d, s0,
    s1 [NCHP / C, C]; the operations of gemv_q8's _q8_chunks (d = amax / 127, q = v * 127 / amax
    rounded half away from zero, s0 / s1 = d * the sums of q over values 0..15 / 16..31). Layout
    LQ = [chunk, byte b, word w]: a word's 4 bytes in one thread, the chunk over 4 lanes. GX: the row
    is silu(nx) * ny instead (the GLU prologue; swiglu_q8's values and q8 form, bit for bit)."""
    LQ: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4, 1], threads_per_warp=[8, 1, 4],
                                        warps_per_cta=[NW, 1, 1], order=[2, 1, 0])
    LC: gl.constexpr = gl.SliceLayout(2, LQ)                         # [NCHP, 4]: per chunk, byte
    LW: gl.constexpr = gl.SliceLayout(1, LQ)                         # [NCHP, 4]: per chunk, word
    c3 = gl.expand_dims(gl.expand_dims(gl.arange(0, NCHP, layout=gl.SliceLayout(1, LC)), 1), 2)
    b3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, LC)), 0), 2)   # [1, 4, 1]
    w3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, LW)), 0), 1)   # [1, 1, 4]
    kc = c0 + c3
    m = (kc < c1) & (b3 < 4) & (w3 < 4)
    off = kc * 32 + b3 * 8 + w3
    vl = _norm_v(nx, ny, ng, rstd, off, m, HAS_Y, GX)               # values 8b + w
    vh = _norm_v(nx, ny, ng, rstd, off + 4, m, HAS_Y, GX)           # values 8b + 4 + w
    amax = gl.maximum(gl.max(gl.max(gl.abs(vl), axis=1), axis=1), gl.max(gl.max(gl.abs(vh), axis=1), axis=1))
    d = amax / 127.0
    inv = gl.expand_dims(gl.expand_dims(gl.where(amax > 0, 127.0 / amax, 0.0), 1), 1)
    tl_ = vl * inv
    th = vh * inv
    ql = (tl_ + gl.where(tl_ >= 0, 0.5, -0.5)).to(gl.int32)         # half away from zero
    qh = (th + gl.where(th >= 0, 0.5, -0.5)).to(gl.int32)
    lo = b3 < 2                                                      # values < 16
    s0 = gl.sum(gl.sum(gl.where(lo, ql + qh, 0), axis=1), axis=1).to(gl.float32) * d
    s1 = gl.sum(gl.sum(gl.where(lo, 0, ql + qh), axis=1), axis=1).to(gl.float32) * d
    wl = gl.sum((ql & 255) << (b3 * 8), axis=1)                     # [NCHP, 4]
    wh = gl.sum((qh & 255) << (b3 * 8), axis=1)
    NS: gl.constexpr = NCHP // C
    # stored whole with a layout of the buffer's rank; read by step through views whose layout
    # covers the trailing dims only (index picks the leading one): the same row-major bytes
    A3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[2, 1, 0])
    A2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    A1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    wl_s = gl.allocate_shared_memory(gl.int32, [NS, C, 4], A3, gl.reshape(wl, [NS, C, 4]))
    wh_s = gl.allocate_shared_memory(gl.int32, [NS, C, 4], A3, gl.reshape(wh, [NS, C, 4]))
    d_s = gl.allocate_shared_memory(gl.float32, [NS, C], A2, gl.reshape(d, [NS, C]))
    s0_s = gl.allocate_shared_memory(gl.float32, [NS, C], A2, gl.reshape(s0, [NS, C]))
    s1_s = gl.allocate_shared_memory(gl.float32, [NS, C], A2, gl.reshape(s1, [NS, C]))
    wl_s = wl_s._reinterpret(gl.int32, [NS, C, 4], A2)
    wh_s = wh_s._reinterpret(gl.int32, [NS, C, 4], A2)
    d_s = d_s._reinterpret(gl.float32, [NS, C], A1)
    s0_s = s0_s._reinterpret(gl.float32, [NS, C], A1)
    s1_s = s1_s._reinterpret(gl.float32, [NS, C], A1)
    gl.thread_barrier()
    return wl_s, wh_s, d_s, s0_s, s1_s


@gluon.jit
def _finish_rss(v, rows, rmask, bias, bpre, xres, out, ssp_tile, ydt, HAS_BIAS: gl.constexpr, PRE: gl.constexpr):
    """RSS's epilogue: y = v (+ bias) rounded to ydt's dtype, s = x + y in float32 stored in out,
    and the tile's sum of s^2 in ssp_tile (what the add + RMSNorm kernel would have read and
    summed: q8_rows._q8_kernel's ADD and NORM); returns s's values (RQ 2 quantizes them)."""
    if HAS_BIAS:
        if PRE:
            v += bpre
        else:
            v += gl.load(bias + rows, mask=rmask, other=0.0).to(gl.float32)
    sv = xres + v.to(ydt.dtype.element_ty).to(gl.float32)
    gl.store(out + rows, sv, mask=rmask)
    gl.store(ssp_tile, gl.sum(gl.where(rmask, sv * sv, 0.0), axis=0))
    return sv


@gluon.jit
def _rss_q8(s, ng, gq, gf, pid_n, BN: gl.constexpr, NW: gl.constexpr):
    """RQ (Switches.norm_into_gemv = 4), after _finish_rss stored this tile's rows of s: the q8
    form of s * ng over the tile's BN // 32 chunks, rstd left out. RMSNorm's rstd is one positive
    factor of the whole row, so a chunk's words are the same with or without it (q = v * 127 /
    amax) and its d, s0, s1 scale by it: the GEMV reading this row multiplies its row sums by
    rstd instead (_tile's NORM 4, from the tiles' sums of squares). Every value is quantized once,
    by the program that made it: no ticket, no tail. Reads back what this program's threads
    stored (a barrier first); layout and rounding as _q8_store_lq's."""
    gl.thread_barrier()
    CB: gl.constexpr = BN // 32
    c3, b3, w3, cw, kw = _lq_axes(CB, NW)
    idx = pid_n * BN + c3 * 32 + b3 * 8 + w3                          # [CB, 4, 8]: the tile's values
    v = gl.load(s + idx, cache_modifier=".cg") * gl.load(ng + idx).to(gl.float32)
    _q8_store_lq(v, b3, cw, kw, pid_n * CB, 0, gq, gf, False)


@gluon.jit
def _rq_weight(ng, pid_n, BN: gl.constexpr, NW: gl.constexpr):
    """RQ 2 (Switches.rq_smem): the norm weight of this tile's rows in _rss_q8's layout (LQ), float32,
    loaded early -- before the PDL wait without a K split (no kernel writes it), with the partials
    in the split's last program -- instead of after the epilogue's barrier."""
    c3, b3, w3, cw, kw = _lq_axes(BN // 32, NW)
    return gl.load(ng + pid_n * BN + c3 * 32 + b3 * 8 + w3).to(gl.float32)


@gluon.jit
def _rss_q8_regs(sv, gv, gq, gf, pid_n, BN: gl.constexpr, NW: gl.constexpr):
    """RQ 2: _rss_q8 on the tile's s values as _finish_rss made them (sv [BN], the rows' layout) and
    gv (_rq_weight): sv reaches the LQ layout through shared memory, not by a store, a barrier and a
    load from global memory; the same float32 values, so the same q8 bits."""
    CB: gl.constexpr = BN // 32
    c3, b3, w3, cw, kw = _lq_axes(CB, NW)
    LQ: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4, 1], threads_per_warp=[4, 1, 8],
                                        warps_per_cta=[NW, 1, 1], order=[2, 1, 0])
    A1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    A3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[2, 1, 0])
    sm = gl.allocate_shared_memory(gl.float32, [BN], A1, sv)
    gl.thread_barrier()
    v = sm._reinterpret(gl.float32, [CB, 4, 8], A3).load(LQ) * gv       # value c * 32 + 8b + w: row-major
    _q8_store_lq(v, b3, cw, kw, pid_n * CB, 0, gq, gf, False)


@gluon.jit
def _lq_axes(CB: gl.constexpr, NW: gl.constexpr):
    """The index axes of a q8 tile in layout LQ = [chunk, byte b, word w] (a word's 4 bytes in one
    thread, a chunk's 8 words on 8 lanes; value 8b + w of a chunk): c3 [CB, 1, 1], b3 [1, 4, 1],
    w3 [1, 1, 8], and the word view's cw [CB, 1], kw [1, 8] (_q8_store_lq's stores)."""
    LQ: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4, 1], threads_per_warp=[4, 1, 8],
                                        warps_per_cta=[NW, 1, 1], order=[2, 1, 0])
    LC: gl.constexpr = gl.SliceLayout(2, LQ)                         # [CB, 4]: per chunk, per byte b
    LW: gl.constexpr = gl.SliceLayout(1, LQ)                         # [CB, 8]: per chunk, per word
    c3 = gl.expand_dims(gl.expand_dims(gl.arange(0, CB, layout=gl.SliceLayout(1, LC)), 1), 2)
    b3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, LC)), 0), 2)
    w3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(0, LW)), 0), 1)
    cw = gl.expand_dims(gl.arange(0, CB, layout=gl.SliceLayout(1, LW)), 1)
    kw = gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(0, LW)), 0)
    return c3, b3, w3, cw, kw


@gluon.jit
def _q8_store_lq(v, b3, cw, kw, c0, nch, gq, gf, MASKED: gl.constexpr):
    """q8_rows._q8_chunks on an LQ tile v [CB, 4, 8] (_lq_axes): chunks c0 + cw's words into gq and
    (d, s0, s1, 0) into gf; MASKED: only chunks below nch. d = amax / 127, q = v * 127 / amax
    rounded half away from zero, reduced over the bytes (in a thread) first, then over the 8 lanes;
    value 8b + w goes to byte b of word w (disjoint bit fields: the sum is an OR)."""
    amax = gl.max(gl.max(gl.abs(v), axis=1), axis=1)
    d = amax / 127.0
    inv = gl.where(amax > 0, 127.0 / amax, 0.0)
    t = v * gl.expand_dims(gl.expand_dims(inv, 1), 1)
    q = (t + gl.where(t >= 0, 0.5, -0.5)).to(gl.int32)
    s0 = gl.sum(gl.sum(gl.where(b3 < 2, q, 0), axis=1), axis=1).to(gl.float32) * d    # values 0..15
    s1 = gl.sum(gl.sum(gl.where(b3 >= 2, q, 0), axis=1), axis=1).to(gl.float32) * d   # 16..31
    words = gl.sum((q & 255) << (b3 * 8), axis=1)                    # [CB, 8]
    if MASKED:
        cm = (c0 + cw < nch) & (kw < 8)
        gl.store(gq + (c0 + cw) * 8 + kw, words, mask=cm)
    else:
        gl.store(gq + (c0 + cw) * 8 + kw, words)
    # (d, s0, s1, 0) by the lanes of words 0..3
    vals = gl.where(kw == 0, gl.expand_dims(d, 1),
                    gl.where(kw == 1, gl.expand_dims(s0, 1), gl.where(kw == 2, gl.expand_dims(s1, 1), 0.0)))
    if MASKED:
        gl.store(gf + (c0 + cw) * 4 + kw, vals, mask=cm & (kw < 4))
    else:
        gl.store(gf + (c0 + cw) * 4 + kw, vals, mask=kw < 4)


@gluon.jit
def _glu_pair(res, rows, pid_n, TF, part, cnt, h_out, gq, gf, BN: gl.constexpr, NW: gl.constexpr):
    """SwiGLU in the epilogue of the stacked [gate; up] GEMV (2 * TF tiles of BN rows, no split):
    gemv_q8._glu_pair + _q8_chunks, operation for operation. Gate tile j and up tile TF + j each
    park their fp32 rows in `part`; the second to take the ticket on cnt[j] computes h =
    silu(g) * u for those BN values (g, u rounded to h's dtype first, as the two-launch path
    stored them), stores h and its q8 chunks, and sets cnt[j] back to 0 (graph replays).

    The epilogue reads both halves back from `part` in a layout of its own, LQ = [chunk c, byte
    b, word 4h + w] (value 8b + 4h + w of chunk c: the q8 word layout, gemv_q8's module doc): a
    word's 4 bytes in one thread, its 8 words on 8 lanes. The words are then a sum over a
    thread's own axis, the chunk's max and half sums a reduction over 8 lanes, and nothing
    is reshaped or converted; the tile's own row sums are read back from `part` like the
    other tile's (the same fp32 bits as `res`). Runs once per tile pair."""
    gl.store(part + rows, res)
    gl.thread_barrier()
    j = pid_n % TF
    ticket = gl.atomic_add(cnt + j, 1, sem="acq_rel", scope="gpu")
    if ticket == 1:
        CB: gl.constexpr = BN // 32
        c3, b3, w3, cw, kw = _lq_axes(CB, NW)
        idx = j * BN + c3 * 32 + b3 * 8 + w3                        # [CB, 4, 8]: h's index
        F = TF * BN
        g = gl.load(part + idx, cache_modifier=".cg").to(h_out.dtype.element_ty).to(gl.float32)
        u = gl.load(part + F + idx, cache_modifier=".cg").to(h_out.dtype.element_ty).to(gl.float32)
        v = g / (1.0 + gl.exp(-g)) * u                               # swiglu_q8's formula
        gl.store(h_out + idx, v.to(h_out.dtype.element_ty))
        _q8_store_lq(v, b3, cw, kw, j * CB, 0, gq, gf, False)
        gl.atomic_xchg(cnt + j, 0)


@gluon.jit
def _norm_tail(s, ng, h_out, gq, gf, ssp, nss, eps, K, cnt_g, NW: gl.constexpr):
    """The norm tail (Switches.norm_into_gemv = 3): called by each program that has just finished a
    row tile of the layer's last GEMV (_finish_rss stored its rows of s and the tile's sum of
    squares); the one that finishes the last of the nss tiles (a ticket on cnt_g, set back to 0
    after) makes the next layer's q/k/v input for the whole row -- h = s * rstd * ng in h_out's
    dtype and its q8 words / (d, s0, s1, 0) in gq / gf, with rstd from the tiles' sums: the
    operations of q8_rows._q8_kernel's NORM and _q8_chunks (the sum of squares added in another
    order: not the same bits) -- so no add + RMSNorm + q8 launch runs between the two GEMVs.
    Reads what other programs stored during this launch past L1 (.cg), after the acq_rel ticket.
    Layout as _glu_pair's (_lq_axes, _q8_store_lq)."""
    gl.thread_barrier()
    ticket = gl.atomic_add(cnt_g, 1, sem="acq_rel", scope="gpu")
    if ticket == nss - 1:
        RB: gl.constexpr = 32 * NW
        LR: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[NW], order=[0])
        t = gl.arange(0, RB, layout=LR)
        ss = gl.zeros([RB], gl.float32, layout=LR)
        for t0 in range(0, nss, RB):
            ss += gl.load(ssp + t0 + t, mask=t0 + t < nss, other=0.0, cache_modifier=".cg")
        rstd = 1.0 / gl.sqrt(gl.sum(ss, axis=0) / K + eps)
        CB: gl.constexpr = 8 * NW
        c3, b3, w3, cw, kw = _lq_axes(CB, NW)
        NCH = K // 32
        for c0 in range(0, NCH, CB):
            m = (c0 + c3 < NCH) & (b3 < 4) & (w3 < 8)
            idx = (c0 + c3) * 32 + b3 * 8 + w3                        # [CB, 4, 8]
            v = gl.load(s + idx, mask=m, other=0.0, cache_modifier=".cg") * rstd
            v = v * gl.load(ng + idx, mask=m, other=0.0).to(gl.float32)
            gl.store(h_out + idx, v.to(h_out.dtype.element_ty), mask=m)
            _q8_store_lq(v, b3, cw, kw, c0, NCH, gq, gf, True)
        gl.atomic_xchg(cnt_g, 0)


@gluon.jit
def _glu_local(res, pid_n, part, h_out, gq, gf, BN: gl.constexpr, NW: gl.constexpr):
    """SwiGLU in the epilogue of a program that holds both halves of its h values (Switches.gemv_swiglu
    = 2, gemv_q8_gluon._tile's GP): rows 0 .. BN/2 - 1 of its tile are gate rows, BN/2 .. BN - 1 the
    up rows of the same h indices pid_n * BN/2 + r. No ticket: the program parks its BN row sums in
    its own BN floats of `part`, and after a barrier reads them back in the q8 word layout (LQ,
    _lq_axes) and does _glu_pair's arithmetic on them (h = silu(g) * u from g, u rounded to h's
    dtype; its q8 chunks by _q8_store_lq): the same bits as the ticketed pair and as swiglu_q8."""
    rl = gl.arange(0, BN, layout=res.type.layout)
    gl.store(part + pid_n * BN + rl, res)
    gl.thread_barrier()
    CB: gl.constexpr = BN // 64
    c3, b3, w3, cw, kw = _lq_axes(CB, NW)
    loc = c3 * 32 + b3 * 8 + w3                                   # [CB, 4, 8]: the h value within the tile
    g = gl.load(part + pid_n * BN + loc, cache_modifier=".cg").to(h_out.dtype.element_ty).to(gl.float32)
    u = gl.load(part + pid_n * BN + BN // 2 + loc, cache_modifier=".cg").to(h_out.dtype.element_ty).to(gl.float32)
    v = g / (1.0 + gl.exp(-g)) * u                                # swiglu_q8's formula
    gl.store(h_out + pid_n * (BN // 2) + loc, v.to(h_out.dtype.element_ty))
    _q8_store_lq(v, b3, cw, kw, pid_n * CB, 0, gq, gf, False)


@gluon.jit
def _finish(v, rows, rmask, bias, bpre, resid, out, HAS_BIAS: gl.constexpr, HAS_RESID: gl.constexpr,
            PRE: gl.constexpr):
    """out[rows] = v (+ bias[rows]) (+ resid[rows]), added in fp32 (gemv_repack._finish, one row);
    PRE: the bias rows were loaded before the PDL wait (bpre)."""
    if HAS_BIAS:
        if PRE:
            v += bpre
        else:
            v += gl.load(bias + rows, mask=rmask, other=0.0).to(gl.float32)
    if HAS_RESID:
        v += gl.load(resid + rows, mask=rmask, other=0.0).to(gl.float32)
    gl.store(out + rows, v.to(out.dtype.element_ty), mask=rmask)
