"""The one-row int8 decode GEMV (gemv_q8.py) in Gluon, with every tensor in the layout its
loads give it (issue 12).

Why: the Triton kernel (gemv_q8._q8_tile) spends 288 SASS instructions per K step and thread
(sm_90, BN 32 x 2 blocks, 4 warps): its scale loads and dp4a sums get layouts other than the
accumulator's, converted through shared memory every step (perf-log T1).

Here one BlockedLayout L3 = [rows, chunks, 4 words] (a thread: one 16-byte chunk of a row, lanes
16 chunks x 2 rows, warps on rows) and its slices carry everything: the words (16-byte loads),
the scales and the accumulator ([BN, C] = slice 2 of L3, one scale per thread and chunk), the
activation words ([C, 4] = slice 0: one 16-byte load per chunk, shared by the thread's rows). No
value moves between threads until the final row sums. Same planes, same q8 activations, same
arithmetic per (row, chunk) as gemv_q8 (module doc there); the split-K partials are summed by the
last program of a tile in split order (deterministic), as there. sm_90 SASS: 211 instructions a
step for Q4_K (72 registers) against Triton's 288 (95).

SwiGLU epilogue (`launch_swiglu`, gemv_q8.gemv_q8_swiglu with gluon=True): the stacked [gate; up]
GEMV without K split; the second of a gate/up tile pair to finish (an atomic ticket) computes
h = silu(g) * u and its q8 chunks, swiglu_q8's operations (one launch instead of two).

GLU prologue (`launch(..., glu=(gate, up))`, Switches.gemv_glu_prologue): the norm prologue's shared-memory q8
row made from silu(gate) * up instead (_tile's GX), so the down needs no SwiGLU launch before it; K ranges of
at most gemv_q8.GLU_MAX_CHUNKS chunks a program (registers).

RMSNorm prologue (`launch(..., norm=...)`, gemv_q8.gemv_q8's prenorm, Switches.norm_into_gemv,
off): the q/k/v GEMV makes its q8 row itself from the residual x and the previous GEMV's output
y -- every program sums the squares of the whole row, quantizes its own chunks of
rms_norm(x + y) * weight into shared memory, and program (0, 0) stores x + y -- instead of the
add + RMSNorm + q8 kernel before it. Measured slower on the H200 (perf-log W3: each program
reads the whole row; the first version, packing words in registers each step, spilled to 213
registers).

Configs (BN, BB, SPLIT, warps[, prefetch[, register cap[, late[, warps along K[, second first[,
tiles[, x ahead]]]]]]]): a step is BB blocks of BN rows. SPLIT < 0: stream-K over -SPLIT programs
(gemv_q8_gluon_sk.py). Prefetch: the next step's words load while this one is multiplied; 2: both
steps of a two-step split before the PDL wait; 3+: that many shared-memory stages of words in flight
(gemv_q8g_stages.py); off: one step's registers. A register cap (maxnreg)
lets more programs share an SM; late signals the next kernel when the programs end (PDL mode 3;
perf-log X1, AB4). Warps along K: the warps split a step's chunks (WK). Second first: a two-weight
launch's second weight takes the lowest program ids (SF). Tiles: the engine stores the shape's
planes tile-major in BN-row tiles (plane_layout.py; TM reads either layout). X ahead: the q8 row's
next step loads with its weights (XP). The table holds the shapes where this kernel beat the
Triton one (`python -m minfer.bench.gemv_q8_sweep --gluon [--wide]`, re-tuned in the step with
tools/skip_oracle.py); other shapes, and GPUs other than sm_90, keep the Triton kernel.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from minfer.ops.cuda import timeline
from minfer.ops.cuda.gemv_q8g_loads import (_dp4a, _l2_heads, _loads, _mixed_tile, _pdl, _pdl_signal, _pdl_wait,
                                            _opts, _pf, _prefetch2_error, _q6_words, _split_gather, _xloads,
                                            split_const)
from minfer.ops.cuda.gemv_q8g_norm import (_finish, _finish_rss, _glu_local, _glu_pair, _norm_q8_smem, _norm_rstd,
                                           _norm_tail, _rq_weight, _rss_q8, _rss_q8_regs, _ss_load, _ss_rstd,
                                           _ss_sum_rstd)
from minfer.ops.cuda.gemv_q8g_stages import _issue, _ring, _scale_loads, _take
from minfer.ops.cuda.gemv_q8g_rope import _rope_finish, _rope_rows
from minfer.ops.cuda.gemv_q8g_pad import _occupancy_pad, _pad_kept, _pads, per_sm  # noqa: F401 (per_sm: gemv_q8)
from minfer.ops.cuda.timeline import stamp
from minfer.ops.cuda.gemv_repack_layout import Q4_K, Q6_K, common_tile_rows
from minfer.ops.cuda.gemv_q8g_table import _TABLE, CONFIGS, RULE, _table, shape_rule  # noqa: F401 (callers read GL._TABLE)


@gluon.jit
def _tile(p0, p1, p2, p3, xq, xf, resid, bias, out, part, cnt, pid_n, pid_s, N, NSTRIDE, NB,
          blocks_per_split, SPLIT, gq, gf, TF, nx, ny, ng, s_out, eps, nss, ydt, ssp, QT: gl.constexpr,
          BN: gl.constexpr, BB: gl.constexpr, NW: gl.constexpr, IS_SPLIT: gl.constexpr, HAS_BIAS: gl.constexpr,
          HAS_RESID: gl.constexpr, PDL: gl.constexpr, PF: gl.constexpr, GLU: gl.constexpr = False,
          PRE: gl.constexpr = False, NORM: gl.constexpr = 0, KP2: gl.constexpr = 1,
          NCHP: gl.constexpr = 1, RSS: gl.constexpr = False, tlb=0, TL: gl.constexpr = False, th=0,
          TAIL: gl.constexpr = False, SK: gl.constexpr = False, sk_lo=0, sk_hi=0, sk_slot=0, sk_first=0,
          sk_n=1, WK: gl.constexpr = False, TM: gl.constexpr = 0, XP: gl.constexpr = False,
          RQ: gl.constexpr = 0, RP: gl.constexpr = 0, HD: gl.constexpr = 128, row0=0, rp=0, rt=0, kc=0, vc=0,
          nq=0, nk=0, kvs=0, GP: gl.constexpr = False, RL: gl.constexpr = False, hpf=0, HPF: gl.constexpr = 0,
          GX: gl.constexpr = False):
    """Row tile pid_n, K split pid_s: out[rows] = W_deq . x_hat [+ bias] [+ resid]; GLU (no split,
    no bias/resid): the SwiGLU pair epilogue instead (_glu_pair; out is h, TF tiles per half).
    PRE: the bias rows (no kernel writes them) are loaded before the PDL wait with the first
    step's words, not after the K loop (Switches.pdl_preload).

    NORM (Switches.norm_into_gemv): x_hat is not read from xq / xf but made here from the
    residual row nx (float32) plus the previous GEMV's output ny: the program sums the squares
    of the whole row s = nx + ny (KP2: K rounded up to a power of two), turns its own chunks of
    s * rstd * ng into q8 words and scales once (_norm_q8_smem: the operations of
    q8_rows._q8_kernel + _q8_chunks; NCHP: the split's chunks rounded up to a power of two) in
    shared memory, and its K loop reads them there; program (0, 0) also stores s (s_out, the next
    residual). One launch instead of the add + RMSNorm + q8 kernel and the GEMV. (Packing each
    step's words in registers instead took 213 registers a thread, 2 programs an SM: 4x slower.)
    GX (with NORM == 1; the GLU prologue, Switches.gemv_glu_prologue): nx / ny are the gate / up rows
    and the program's chunks of silu(nx) * ny go into shared memory as swiglu_q8 would quantize them
    (no norm, nothing stored): the down projection without the SwiGLU launch before it.
    NORM == 2: nx is the residual s itself, already summed by the GEMV before (RSS below), and ny
    its nss per-tile sums of squares: the program adds those up (KP2: nss rounded up to a power
    of two) instead of reading the whole row; nothing is stored.

    RSS (the GEMV before such a NORM == 2 launch): resid is the residual x (float32); the epilogue
    rounds each row sum to ydt's dtype (as the GEMV output the add + norm kernel read), stores s =
    x + that in float32 into out, and the sum of the tile's s^2 into ssp[pid_n].

    NORM == 4 (Switches.norm_into_gemv = 4): x_hat is xq / xf as usual, the q8 form of s * ng
    without rstd (made by the GEMV before, RQ); the program takes rstd from ny's nss per-tile
    sums of squares (as NORM 2) and multiplies its row sums by it: rstd is one factor of every
    chunk's d, s0 and s1, so W . x_hat scales by it (gemv_q8g_norm._rss_q8). RL (Switches.norm_rstd_late):
    the tile sums are loaded after the wait but summed after the K loop (gemv_q8g_norm._ss_load).

    RQ (with RSS, one weight, BN a multiple of 32): the epilogue also stores that q8 form of its
    tile's rows of s * ng into gq / gf (gemv_q8g_norm._rss_q8); RQ 2 (Switches.rq_smem): from the
    values in registers through shared memory, ng loaded early (_rss_q8_regs, _rq_weight).

    TAIL (with RSS, one weight: Switches.norm_into_gemv = 3): the program that finishes the last
    row tile also makes the next layer's normed row h (th) by ng and eps and its q8 form (gq, gf)
    for all N values (gemv_q8g_norm._norm_tail; its ticket is cnt[nss], nss the tiles).

    SK (stream-K, gemv_q8_gluon_sk._gemv_q8g_sk_kernel): blocks [sk_lo, sk_hi) of tile pid_n, whatever pid_s and
    blocks_per_split say; the row sums go to partial slot sk_slot (BN values a slot), and the
    tile's sk_n-th program to finish adds slots sk_first.. sk_first + sk_n - 1 in order (K order:
    deterministic) and finishes the tile (bias, residual) as the split path does.

    WK (warps along K, a config's eighth field): the warps split a step's chunks instead of its
    rows (L3's warps on the chunk axis; C >= 16 warps, launch checks), so a program covers few rows
    over a long K without a K split across programs: the row sums are reduced over the warps in
    the CTA (gl.sum's shared-memory step) instead of through partials, a ticket and a second
    load round in global memory; x's chunks are not repeated across the warps.

    RP (1 neox, 2 normal; Switches.qkv_rope): the q/k/v rope epilogue of gemv_q8g_rope (the tile's
    rows are rotation pairs of one head of HD rows; row0: the segment's first row in the stacked
    q/k/v; q rotated to out, k rotated and v to the caches kc / vc at row *rp, kvs apart)."""
    C: gl.constexpr = BB * 8
    TC: gl.constexpr = 16 if C >= 16 else C
    L3: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 4], threads_per_warp=[32 // TC, TC, 1],
                                        warps_per_cta=[1, NW, 1] if WK else [NW, 1, 1], order=[2, 1, 0])
    L2: gl.constexpr = gl.SliceLayout(2, L3)                          # [BN, C]
    LX: gl.constexpr = gl.SliceLayout(0, L3)                          # [C, 4]
    if RP:
        rows = _rope_rows(pid_n, BN, HD, RP == 1, gl.SliceLayout(1, L2))
    elif GP:
        # (GLU, Switches.gemv_swiglu 2) the first half of the tile gate rows, the second the up rows
        # of the same h values: N / 2 + the same index (_glu_local)
        rl = gl.arange(0, BN, layout=gl.SliceLayout(1, L2))
        rows = pid_n * (BN // 2) + gl.where(rl < BN // 2, rl, N // 2 + rl - BN // 2)
    else:
        rows = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, L2))
    r2 = gl.expand_dims(gl.minimum(rows, N - 1), 1)                   # [BN, 1]; rows past N read row N-1
    r3 = gl.expand_dims(r2, 2)                                        # [BN, 1, 1]
    ci = gl.arange(0, C, layout=gl.SliceLayout(0, L2))
    c2 = gl.expand_dims(ci, 0)                                        # [1, C]
    c3 = gl.expand_dims(c2, 2)                                        # [1, C, 1]
    w3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, LX)), 0), 0)   # [1, 1, 4]
    xc = gl.expand_dims(gl.arange(0, C, layout=gl.SliceLayout(1, LX)), 1)                    # [C, 1]
    xw = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, LX)), 0)                    # [1, 4]
    if SK:
        b_lo = sk_lo
        b_hi = sk_hi
    else:
        b_lo = pid_s * blocks_per_split
        b_hi = gl.minimum(b_lo + blocks_per_split, NB)
    acc = gl.zeros([BN, C], gl.float32, layout=L2)
    if PF >= 3:
        # (gemv_q8g_stages) the words of the first PF - 1 steps copied into the shared-memory ring, the scales
        # of the first step into registers, before the wait
        ws, hs = _ring(BN, C, PF, QT)
        for s in gl.static_range(PF - 1):
            _issue(ws, hs, p0, p1, r3, c3, w3, b_lo + s * BB, b_hi, s, NB, QT, TM)
        nsc = _scale_loads(p1, p2, p3, r2, gl.minimum(b_lo * 8 + c2, NB * 8 - 1), NB, QT, TM)
    else:
        nxt = _loads(p0, p1, p2, p3, r3, r2, gl.minimum(b_lo * 8 + c3, NB * 8 - 1),
                     gl.minimum(b_lo * 8 + c2, NB * 8 - 1), w3, NB, QT, TM)
    if PF == 2:
        # a split of at most two steps (launch checks): the second step's words in flight before
        # the wait too (clamped to this split's last chunk: a one-step split re-reads its own)
        nxt2 = _loads(p0, p1, p2, p3, r3, r2, gl.minimum((b_lo + BB) * 8 + c3, b_hi * 8 - 1),
                      gl.minimum((b_lo + BB) * 8 + c2, b_hi * 8 - 1), w3, NB, QT, TM)
    rmask = rows < N
    bpre = gl.zeros([BN], gl.float32, layout=gl.SliceLayout(1, L2))
    if HAS_BIAS and PRE:
        bpre = gl.load(bias + rows, mask=rmask, other=0.0).to(gl.float32)
    if RQ == 2 and not IS_SPLIT:
        gv = _rq_weight(ng, pid_n, BN, NW)                            # no kernel writes it
    if HPF:
        if HPF < 8:
            _l2_heads(hpf, HPF, NW)  # the next GEMV's head blocks into L2, behind this step's own loads
    if PDL >= 3:
        _pdl_wait(ci)           # late: the next kernel launches when this one's programs end (below; 4: its dots)
    elif PDL:
        _pdl(ci)
    if TL:
        stamp(tlb, 3, NW)       # past the wait (timeline.py)
    xres = gl.zeros([BN], gl.float32, layout=gl.SliceLayout(1, L2))
    if RSS:
        xres = gl.load(resid + rows, mask=rmask, other=0.0).to(gl.float32)     # written kernels ago
    if NORM == 1 and GX:
        wl_s, wh_s, d_s, s0_s, s1_s = _norm_q8_smem(nx, ny, ng, 1.0, b_lo * 8, b_hi * 8, C, NCHP, NW, True, True)
    elif NORM == 1:
        rstd = _norm_rstd(nx, ny, s_out, eps, NB * 256, (pid_n == 0) & (pid_s == 0), KP2, NW)
        wl_s, wh_s, d_s, s0_s, s1_s = _norm_q8_smem(nx, ny, ng, rstd, b_lo * 8, b_hi * 8, C, NCHP, NW, True)
    elif NORM == 4 and RL:
        ssv = _ss_load(ny, nss, KP2, NW)                              # summed after the K loop (RL)
    elif NORM >= 2:
        rstd = _ss_rstd(ny, nss, eps, NB * 256, KP2, NW)            # the GEMV before's tile sums: after the wait
        if NORM == 2:
            wl_s, wh_s, d_s, s0_s, s1_s = _norm_q8_smem(nx, ny, ng, rstd, b_lo * 8, b_hi * 8, C, NCHP, NW, False)
    if XP:
        xn = _xloads(xq, xf, b_lo, b_hi, xc, xw, ci)                   # written by the kernel before: after the wait
    for blk in range(b_lo, b_hi, BB):
        if PF >= 3:
            st = (blk - b_lo) // BB
            _issue(ws, hs, p0, p1, r3, c3, w3, blk + (PF - 1) * BB, b_hi, (st + PF - 1) % PF, NB, QT, TM)
            wq, hq = _take(ws, hs, st % PF, PF, L3, QT)
            sa, sb = nsc
            nsc = _scale_loads(p1, p2, p3, r2, gl.minimum(gl.minimum(blk + BB, b_hi - 1) * 8 + c2, NB * 8 - 1), NB,
                               QT, TM)
        elif PF == 2:
            wq, hq, sa, sb = nxt                                      # both loaded before the wait
            nxt = nxt2
        elif PF:
            # the next step's words in flight while this one is multiplied
            wq, hq, sa, sb = nxt
            nb_ = blk + BB
            if nb_ >= b_hi:
                nb_ = blk                                             # (past the last: re-read this one, unused)
            nxt = _loads(p0, p1, p2, p3, r3, r2, gl.minimum(nb_ * 8 + c3, NB * 8 - 1),
                         gl.minimum(nb_ * 8 + c2, NB * 8 - 1), w3, NB, QT, TM)
        else:
            # one step's registers only (for splits of one or two steps: every load of the first
            # is in flight before the PDL wait, and nothing is read twice)
            if blk > b_lo:
                nxt = _loads(p0, p1, p2, p3, r3, r2, gl.minimum(blk * 8 + c3, NB * 8 - 1),
                             gl.minimum(blk * 8 + c2, NB * 8 - 1), w3, NB, QT, TM)
            wq, hq, sa, sb = nxt
        if NORM % 4 > 0:
            # (NORM 1 or 2) this step's words and scales from the program's q8 row in shared memory
            st = (blk - b_lo) // BB
            xlo = gl.expand_dims(wl_s.index(st).load(LX), 0)          # [1, C, 4]
            xhi = gl.expand_dims(wh_s.index(st).load(LX), 0)
            xd = gl.expand_dims(d_s.index(st).load(gl.SliceLayout(0, L2)), 0)
            xs0 = gl.expand_dims(s0_s.index(st).load(gl.SliceLayout(0, L2)), 0)
            xs1 = gl.expand_dims(s1_s.index(st).load(gl.SliceLayout(0, L2)), 0)
        elif XP:
            xlo, xhi, xd, xs0, xs1 = xn
            xn = _xloads(xq, xf, blk + BB, b_hi, xc, xw, ci)             # (past the split: all masked)
        else:
            xlo, xhi, xd, xs0, xs1 = _xloads(xq, xf, blk, b_hi, xc, xw, ci)
        if QT == 12:
            lo = wq & 0x0F0F0F0F                                      # nibbles 0,2,4,6: values w, w+8, ...
            hi = (wq >> 4) & 0x0F0F0F0F                               # nibbles 1,3,5,7: w+4, w+12, ...
            isum = gl.sum(_dp4a(hi, xhi, _dp4a(lo, xlo, 0)), axis=2).to(gl.float32)     # [BN, C], in-thread
            scm = sa.to(gl.int32)
            d = (sb & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
            dmin = (sb >> 16).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
            a = d * (scm & 255).to(gl.float32)
            ml = dmin * ((scm >> 8) & 255).to(gl.float32)
            acc += a * (xd * isum) - ml * (xs0 + xs1)
        else:
            # the 2 high bits next to their nibbles (gemv_q8._q8_tile's Q6_K branch, in 11 instructions)
            lo, hi = _q6_words(wq, hq.to(gl.int32))
            i0 = gl.sum(_dp4a(hi, xhi & 0xFFFF, _dp4a(lo, xlo & 0xFFFF, 0)), axis=2).to(gl.float32)
            i1 = gl.sum(_dp4a(hi, xhi & -65536, _dp4a(lo, xlo & -65536, 0)), axis=2).to(gl.float32)
            s2 = sa.to(gl.int32)
            d = sb.to(gl.float32)
            a0 = d * ((s2 << 24) >> 24).to(gl.float32)
            a1 = d * (s2 >> 8).to(gl.float32)
            acc += a0 * (xd * i0 - 32.0 * xs0) + a1 * (xd * i1 - 32.0 * xs1)
    res = gl.sum(acc, axis=1)                                         # [BN]
    if HPF:
        if HPF >= 8:
            _l2_heads(hpf, HPF - 8, NW)  # (8 + planes: after the dot products, past o's own loads)
    if PDL == 4:
        _pdl_signal(ci)         # after the dot products, before the epilogue's loads and stores
    if NORM == 4 and RL:
        res = res * _ss_sum_rstd(ssv, eps, NB * 256)
    elif NORM == 4:
        res = res * rstd
    if GLU and GP:
        _glu_local(res, pid_n, part, out, gq, gf, BN, NW)
    elif GLU:
        _glu_pair(res, rows, pid_n, TF, part, cnt, out, gq, gf, BN, NW)
    elif SK:
        rl = gl.arange(0, BN, layout=gl.SliceLayout(1, L2))
        gl.store(part + sk_slot * BN + rl, res)
        gl.thread_barrier()
        ticket = gl.atomic_add(cnt + pid_n, 1, sem="acq_rel", scope="gpu")
        if ticket == sk_n - 1:
            tot = gl.zeros([BN], gl.float32, layout=gl.SliceLayout(1, L2))
            for sl in range(sk_first, sk_first + sk_n):
                tot += gl.load(part + sl * BN + rl, cache_modifier=".cg")
            _finish(tot, rows, rmask, bias, bpre, resid, out, HAS_BIAS, HAS_RESID, PRE)
            gl.atomic_xchg(cnt + pid_n, 0)
    elif IS_SPLIT:
        gl.store(part + pid_s * NSTRIDE + rows, res, mask=rmask)
        # the last split of this tile to finish sums the partials in split order (gemv_q8)
        gl.thread_barrier()
        ticket = gl.atomic_add(cnt + pid_n, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT - 1:
            if RQ == 2:
                gv = _rq_weight(ng, pid_n, BN, NW)                    # with the partials' loads
            if IS_SPLIT > 1:    # (Switches.split_gather: IS_SPLIT the split count's power of two) one load round
                tot = _split_gather(part, pid_n, N, SPLIT, NSTRIDE, IS_SPLIT, BN, NW, gl.SliceLayout(1, L2))
            else:
                tot = gl.zeros([BN], gl.float32, layout=gl.SliceLayout(1, L2))
                for sp in range(SPLIT):
                    tot += gl.load(part + sp * NSTRIDE + rows, mask=rmask, other=0.0, cache_modifier=".cg")
            if RSS:
                sv = _finish_rss(tot, rows, rmask, bias, bpre, xres, out, ssp + pid_n, ydt, HAS_BIAS, PRE)
                if RQ == 2:
                    _rss_q8_regs(sv, gv, gq, gf, pid_n, BN, NW)
                elif RQ:
                    _rss_q8(out, ng, gq, gf, pid_n, BN, NW)
            else:
                _finish(tot, rows, rmask, bias, bpre, resid, out, HAS_BIAS, HAS_RESID, PRE)
            gl.atomic_xchg(cnt + pid_n, 0)
            if TAIL:
                _norm_tail(out, ng, th, gq, gf, ssp, nss, eps, N, cnt + nss, NW)
    elif RSS:
        sv = _finish_rss(res, rows, rmask, bias, bpre, xres, out, ssp + pid_n, ydt, HAS_BIAS, PRE)
        if RQ == 2:
            _rss_q8_regs(sv, gv, gq, gf, pid_n, BN, NW)
        elif RQ:
            _rss_q8(out, ng, gq, gf, pid_n, BN, NW)
        if TAIL:
            _norm_tail(out, ng, th, gq, gf, ssp, nss, eps, N, cnt + nss, NW)
    elif RP:
        _rope_finish(res, rows, rmask, bias, bpre, out, pid_n, row0, rp, rt, kc, vc, nq, nk, kvs, HAS_BIAS, PRE, BN,
                     HD, RP == 1, NW)
    else:
        _finish(res, rows, rmask, bias, bpre, resid, out, HAS_BIAS, HAS_RESID, PRE)
    if PDL == 3:
        _pdl_signal(ci)


@gluon.jit
def _gemv_q8g_kernel(p0, p1, p2, p3, r0, r1, r2, r3, xq, xf, resid, bias, out, part, cnt,
                     N, NA, TA, NB, blocks_per_split, SPLIT, nx, ny, ng, s_out, eps, nss, ydt, ssp, tlb, th, tq, tf,
                     hpt, ha0, hr0, hh0, ha1, hr1, hh1, ha2, hr2, hh2, ha3, hr3, hh3,
                     QT: gl.constexpr, QTB: gl.constexpr, MIXED: gl.constexpr, BN: gl.constexpr, BB: gl.constexpr,
                     NW: gl.constexpr, IS_SPLIT: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RESID: gl.constexpr,
                     PDL: gl.constexpr, PF: gl.constexpr = True, PRE: gl.constexpr = False,
                     NORM: gl.constexpr = 0, KP2: gl.constexpr = 1, NCHP: gl.constexpr = 1,
                     RSS: gl.constexpr = False, TL: gl.constexpr = False, TAIL: gl.constexpr = False,
                     WK: gl.constexpr = False, SF: gl.constexpr = False, TM: gl.constexpr = 0,
                     XP: gl.constexpr = False, RQ: gl.constexpr = 0, PAD0: gl.constexpr = 0,
                     PAD1: gl.constexpr = 0, PAD2: gl.constexpr = 0, RL: gl.constexpr = False,
                     HPF: gl.constexpr = 0, GX: gl.constexpr = False):
    """out (1, N) = W_deq . x_hat [+ bias] [+ resid]; program = (row tile, K split). MIXED: rows
    [0, NA) weight p (type QT, TA tiles), rows [NA, N) weight r (type QTB), as gemv_q8's kernel.
    NORM: x_hat made from the residual row nx + ny, its RMSNorm by ng, in the programs (_tile); with GX
    (one weight) from the gate / up rows nx / ny instead (the GLU prologue).
    TL: the program's start, release from the PDL wait, end and SM into tlb (timeline.py; a
    measuring aid). SF (MIXED): the second weight's tiles take the lowest program ids, so its
    slower rows start in the first wave and the first weight's fill any second one. PAD0..PAD2: an
    occupancy cap's shared memory (_occupancy_pad). HPF: planes of the next GEMV whose tiles' head
    blocks the programs fetch into L2 before the wait (8 + planes: after the dot products) (hpt: its tiles; ha_i, hr_i, hh_i: each plane's
    address, tile bytes, head bytes; l2_prefetch.L2Plan.heads; Switches.l2_heads)."""
    if TL:
        stamp(tlb, 0, NW)
    if PAD0:
        pads = _occupancy_pad(PAD0, PAD1, PAD2, NW)
    hp = (hpt, ha0, hr0, hh0, ha1, hr1, hh1, ha2, hr2, hh2, ha3, hr3, hh3)
    pid_n = gl.program_id(0)
    pid_s = gl.program_id(1)
    if MIXED:
        first, ia, ib = _mixed_tile(pid_n, TA, SF)
        if first:
            _tile(p0, p1, p2, p3, xq, xf, resid, bias, out, part, cnt, ia, pid_s, NA, N, NB,
                  blocks_per_split, SPLIT, xq, xf, 1, nx, ny, ng, s_out, eps, nss, ydt, ssp, QT, BN, BB, NW,
                  IS_SPLIT, HAS_BIAS, HAS_RESID, PDL, PF, False, PRE, NORM, KP2, NCHP, RSS, tlb, TL, WK=WK, TM=TM,
                  XP=XP, RL=RL, hpf=hp, HPF=HPF)
        else:
            _tile(r0, r1, r2, r3, xq, xf, resid + NA, bias + NA, out + NA, part + NA, cnt + TA, ib, pid_s,
                  N - NA, N, NB, blocks_per_split, SPLIT, xq, xf, 1, nx, ny, ng, s_out, eps, nss, ydt, ssp + TA,
                  QTB, BN, BB, NW, IS_SPLIT, HAS_BIAS, HAS_RESID, PDL, PF, False, PRE, NORM, KP2, NCHP, RSS, tlb, TL,
                  WK=WK, TM=TM, XP=XP, RL=RL, hpf=hp, HPF=HPF)
    else:
        # (gq, gf: the norm tail's q8 outputs; the SwiGLU pair's in the glu kernel)
        _tile(p0, p1, p2, p3, xq, xf, resid, bias, out, part, cnt, pid_n, pid_s, N, N, NB,
              blocks_per_split, SPLIT, tq, tf, 1, nx, ny, ng, s_out, eps, nss, ydt, ssp, QT, BN, BB, NW, IS_SPLIT,
              HAS_BIAS, HAS_RESID, PDL, PF, False, PRE, NORM, KP2, NCHP, RSS, tlb, TL, th, TAIL, WK=WK, TM=TM, XP=XP,
              RQ=RQ, RL=RL, hpf=hp, HPF=HPF, GX=GX)
    if PAD0:
        _pad_kept(pads, out, pid_n, NW)
    if TL:
        stamp(tlb, 1, NW)


@gluon.jit
def _gemv_q8g_glu_kernel(p0, p1, p2, p3, xq, xf, h, part, cnt, gq, gf, TF, N, NB, blocks, tlb,
                         QT: gl.constexpr, BN: gl.constexpr, BB: gl.constexpr, NW: gl.constexpr,
                         PDL: gl.constexpr, PF: gl.constexpr = True, TM: gl.constexpr = 0, TL: gl.constexpr = False,
                         GP: gl.constexpr = False):
    """(h (1, N/2), its q8 form gq / gf) = SwiGLU of the stacked [gate; up] rows W_deq . x_hat
    (N rows, 2 * TF tiles of BN, gemv_q8.gemv_q8_swiglu's kernel): one program per row tile,
    the whole K (`blocks` blocks), the pair epilogue _glu_pair; GP: tiles of both halves, _glu_local.
    TL: timeline stamps (as the plain kernel's)."""
    if TL:
        stamp(tlb, 0, NW)
    _tile(p0, p1, p2, p3, xq, xf, h, h, h, part, cnt, gl.program_id(0), 0, N, N, NB, blocks, 1, gq, gf, TF,
          xf, xf, xf, xf, 0.0, 0, xf, xf, QT, BN, BB, NW, False, False, False, PDL, PF, True, TM=TM, tlb=tlb, TL=TL,
          GP=GP)
    if TL:
        stamp(tlb, 1, NW)


def config_for(qtype: int, n: int, k: int, table: str = "") -> tuple | None:
    """The swept config of this shape, or None: the Triton kernel. table: a table file instead of
    the shipped one (Switches.gemv_q8g_table; its shapes only); empty: the shipped one; RULE: the
    shipped one and, for a shape it lacks, the shape rule's config (gemv_q8g_table.shape_rule: the 7B
    config of the shape's role; Switches.gemv_q8g_rule, gemv_q8g_table.table_arg)."""
    hit = (_table(table) if table and table != RULE else CONFIGS).get(f"{'Q4_K' if qtype == Q4_K else 'Q6_K'} {n}x{k}")
    if hit:
        return tuple(hit)
    return shape_rule(qtype == Q4_K, n, k) if table == RULE else None


def kernel_planes(rw) -> tuple:
    """The four plane arguments in the types the kernel loads: Q4_K (qs, scm, dm as int32 d|dmin,
    qs); Q6_K (ql, qh, sc as int16 pairs, d). Either layout (rw.tile_rows: the launch's TM)."""
    p = rw.planes
    if rw.qtype == Q4_K:
        return p[0], p[1], p[2].view(torch.int32), p[0]
    return p[0], p[1], p[2].view(torch.int16), p[3]


_capability: dict = {}


def device_unsupported(device) -> str | None:
    """Why this kernel is not used on this GPU (None: it is): its table was measured on sm_90
    (H100/H200) only; other GPUs keep the Triton kernel (counted as a fallback)."""
    dev = torch.device(device)
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    cap = _capability.get(idx)
    if cap is None:
        cap = _capability[idx] = tuple(torch.cuda.get_device_capability(idx))
    if cap != (9, 0):
        return f"the GPU is sm_{cap[0]}{cap[1]}; the Gluon GEMV's table was measured on sm_90 (H100/H200)"
    return None


def supported(segs, bn: int, bb: int) -> str | None:
    """Why this kernel cannot take the launch (None: it can)."""
    for r in segs:
        if r.qtype not in (Q4_K, Q6_K):
            return f"type {r.qtype}"
        if any(p.numel() >= 2**31 for p in r.planes):
            return "a plane of 2^31 elements or more (int32 offsets)"
    if bb not in (1, 2, 4, 8, 16) or bn % 8 or bn > 256:
        return f"tile {bn} rows x {bb} blocks"
    return None


def _pdl_mode(pdl, late) -> int:
    """The kernel's PDL constexpr: 0 off; 1 wait, then signal the next kernel (pdl.py's mode 1);
    3 (late, Switches.pdl_late) wait, and signal only when the program ends, so a heavy next
    kernel does not take SM slots while this one's later programs still need them; 4 (late == 2,
    Switches.o_signal 2) signal after the program's dot products, before its epilogue."""
    return (4 if late == 2 else 3 if late else 1) if pdl else 0


def launch(segs, xq, xf, resid, bias, out, part, cnt, n, na, ta, nb, bps, split, bn, bb, nwarps, pdl, grid,
           prefetch: bool = True, late: bool = False, preload: bool = True, norm=None, norm_ss=None, rss=None,
           regs: int = 0, tail=None, kwarps: bool = False, second_first: bool = False, x_ahead: bool = False,
           rscale=None, rss_q8=None, per_sm: int = 0, rstd_late: bool = False, rq_smem: bool = False,
           l2_heads=None, glu=None, gather: int = 0):
    """norm: (x float32 (1, K), y (1, K), weight (K,), eps, s_out float32 (1, K)) -- x_hat is then
    the q8 form of rms_norm(x + y) * weight, made by the programs (_tile's NORM 1), and s_out
    receives x + y; norm_ss: (s float32 (1, K), ssp float32 (nss,), nss, weight, eps) -- the same
    from the residual s and its per-tile sums of squares (NORM 2); xq / xf are then not read.
    rss: (ssp float32 (tiles,), ydt: a tensor of the activation dtype) -- resid is the residual x,
    out (float32) receives x + the row sums rounded to that dtype, ssp each tile's sum of squares
    of it (RSS). regs: a register cap (Triton's maxnreg; 0: the compiler's choice), the table's sixth
    field: fewer registers a thread, more programs an SM (a grid of one wave instead of 1.1).
    tail (with rss, one weight): (weight (N,), eps, h (1, N), hq (N/4,) int32, hf (N/8,) float32) --
    the program finishing the last row tile makes h = rms_norm(out) * weight and its q8 form
    (_tile's TAIL); cnt must then hold ta + 1 zeroed counters (cnt[ta]: the tail's ticket).
    kwarps: the warps split each step's chunks (_tile's WK; the config's eighth field), for a
    step of at least 16 chunks a warp, without a norm prologue. second_first (two weights; the
    config's ninth field): the second weight's row tiles take the lowest program ids (_gemv_q8g_kernel's SF).
    rscale: (ssp float32 (nss,), nss, eps) -- xq / xf are the q8 form of s * weight without rstd, and
    the row sums are scaled by rstd from those tile sums (NORM 4); rss_q8 (with rss, one weight, BN
    a multiple of 32 dividing N): (weight (N,), hq (N/4,) int32, hf (N/8,) float32) receive that q8
    form of out * weight (RQ). l2_heads: (planes, 13 ints) of the next GEMV's tile heads the programs
    fetch into L2 before their wait (l2_prefetch.L2Plan.heads). per_sm: at most this many programs an SM (the config's twelfth field,
    shared memory reserved for it: _occupancy_pad). rstd_late (with rscale): the tile sums summed after
    the K loop (_tile's RL, Switches.norm_rstd_late); rq_smem (with rss_q8): RQ 2 (Switches.rq_smem).
    glu: (gate (1, K), up (1, K)), one weight -- x_hat is the q8 form of silu(gate) * up, made by the
    programs as swiglu_q8 makes it (_tile's NORM 1 with GX: the GLU prologue); xq / xf are not read. gather:
    the split tile's partial sums in one load round (_split_gather, Switches.split_gather)."""
    p = kernel_planes(segs[0])
    r = kernel_planes(segs[-1])
    if int(prefetch) == 2 and bps > 2 * bb:
        _prefetch2_error(n, nb, f"{bps}-block splits of {bb}-block steps")
    if rss_q8 is not None and (rss is None or len(segs) != 1 or tail is not None or bn % 32 or n % bn):
        raise ValueError("the q8 epilogue needs the RSS epilogue of one weight, no tail, and tiles of a multiple "
                         "of 32 rows that divide N")
    if glu is not None and (len(segs) != 1 or norm is not None or norm_ss is not None or rscale is not None
                            or tail is not None):
        raise ValueError("the GLU prologue takes one weight and no norm prologue, rstd scale or norm tail")
    if kwarps and (bb * 8 < 16 * nwarps or norm is not None or norm_ss is not None or glu is not None):
        from minfer.errors import MinferError

        raise MinferError(f"gemv_q8 Gluon config for {n}x{nb * 256}: warps along K need a step of at least 16 "
                          f"chunks a warp ({bb} blocks = {bb * 8} chunks for {nwarps} warps) and no norm or GLU "
                          "prologue")
    mode, nx, ny, ng, eps, s_out, nss, kp2 = 0, out, out, out, 0.0, out, 0, 1
    if glu is not None:
        (nx, ny), mode = glu, 1
    elif norm is not None:
        (nx, ny, ng, eps, s_out), mode = norm, 1
        kp2 = max(32 * nwarps, 1 << (nb * 256 - 1).bit_length())
    elif norm_ss is not None:
        (nx, ny, nss, ng, eps), mode = norm_ss, 2
        kp2 = max(32 * nwarps, 1 << max(0, nss - 1).bit_length())
    elif rscale is not None:
        (ny, nss, eps), mode = rscale, 4
        kp2 = max(32 * nwarps, 1 << max(0, nss - 1).bit_length())
    ssp, ydt = rss if rss is not None else (out, out)
    th = tq = tf = out
    if tail is not None:
        if rss is None or len(segs) != 1 or norm is not None or norm_ss is not None:
            raise ValueError("the norm tail needs the RSS epilogue of one weight and no norm prologue")
        ng, eps, th, tq, tf = tail
        nss = ta
    if rss_q8 is not None:
        ng, tq, tf = rss_q8
    rec = timeline.RECORDER
    tlb = rec.buffer(f"{n}x{nb * 256}", grid, out.device) if rec is not None else out
    _gemv_q8g_kernel[grid](p[0], p[1], p[2], p[3], r[0], r[1], r[2], r[3], xq, xf,
                           resid if resid is not None else out, bias if bias is not None else out, out, part, cnt,
                           n, na, ta, nb, bps, split, nx, ny, ng, s_out, float(eps), nss, ydt, ssp, tlb, th, tq, tf,
                           *(l2_heads[1] if l2_heads is not None else (0,) * 13),
                           HPF=l2_heads[0] if l2_heads is not None else 0,
                           QT=segs[0].qtype, QTB=segs[-1].qtype, MIXED=len(segs) == 2, BN=bn, BB=bb, NW=nwarps,
                           IS_SPLIT=split_const(split, int(gather), regs),
                           HAS_BIAS=bias is not None,
                           HAS_RESID=resid is not None and rss is None,
                           PDL=_pdl_mode(pdl, late), PF=_pf(prefetch), PRE=bool(preload), NORM=mode, KP2=kp2,
                           NCHP=max(bb * 8, 1 << (bps * 8 - 1).bit_length()) if mode in (1, 2) else 1,
                           RSS=rss is not None, RQ=(2 if rq_smem else 1) if rss_q8 is not None else 0,
                           RL=bool(rstd_late) and mode == 4,
                           TL=rec is not None, TAIL=tail is not None, WK=bool(kwarps),
                           SF=bool(second_first) and len(segs) == 2, TM=common_tile_rows(segs),
                           XP=bool(x_ahead) and mode in (0, 4), GX=glu is not None, **dict(zip(("PAD0", "PAD1", "PAD2"),
                                                                           _pads(per_sm, f"{n}x{nb * 256}"))),
                           num_warps=nwarps, **_opts(pdl, regs))


def launch_swiglu(rw, xq, xf, h, part, cnt, gq, gf, bn, bb, nwarps, pdl, prefetch: bool = True,
                  late: bool = False, regs: int = 0, paired: bool = False):
    """The [gate; up] GEMV with the SwiGLU epilogue (_gemv_q8g_glu_kernel) over rw's 2F stacked
    rows in BN-row tiles: h (1, F), its q8 words gq (F/4,) int32 and (d, s0, s1, 0) gf (F/8,)
    float32; part (2F,) float32 scratch; cnt (F/BN,) int32 zeros, left zero. The caller checks
    the pairing (gemv_q8.gemv_q8_swiglu: F % BN == 0, BN % 32 == 0) and `supported`. paired
    (Switches.gemv_swiglu 2): F / BN programs, each of BN gate and BN up rows at twice the warps
    (the same rows a thread), the epilogue in the program (_glu_local: no ticket, cnt unused)."""
    n = rw.n
    nb = rw.k // 256
    if paired:
        bn, nwarps = 2 * bn, 2 * nwarps
    tiles = n // bn
    if int(prefetch) == 2 and nb > 2 * bb:
        _prefetch2_error(n, nb, f"the SwiGLU pair's whole K in {bb}-block steps")
    p = kernel_planes(rw)
    rec = timeline.RECORDER
    tlb = rec.buffer(f"{n}x{nb * 256}", (tiles, 1), h.device) if rec is not None else h
    _gemv_q8g_glu_kernel[(tiles,)](p[0], p[1], p[2], p[3], xq, xf, h, part, cnt, gq, gf, tiles // 2, n, nb,
                                   -(-nb // bb) * bb, tlb, QT=rw.qtype, BN=bn, BB=bb, NW=nwarps, TL=rec is not None,
                                   PDL=_pdl_mode(pdl, late), GP=bool(paired),
                                   PF=_pf(prefetch), TM=rw.tile_rows, num_warps=nwarps, **_opts(pdl, regs))
