"""Decode GEMV with int8 activations over the repacked Q4_K / Q6_K planes (issue 12).

The bf16 GEMV (gemv_repack.py) turns every weight value into a float and does an FMA: ~4
instructions per value, so it is issue-bound at ~1-2.5 TB/s on the H200 (docs/perf-log.md,
"Decode GEMV"). Here, as in llama.cpp's mmvq (activations to a block-of-32 int8 form, Q8_1,
once per step), the activation row is quantized once when it is produced, and the weight's
4-bit (6-bit) values meet it in 4-way byte dot products (PTX dp4a): about one instruction per
value.

The activation row's int8 form ("q8": xq words and xf scales) and its producers (the fused
RMSNorm / SwiGLU kernels that write it) are in q8_rows.py; `quantize`, `add_rms_norm_q8`,
`swiglu_q8`, `quantize_rows`, `swiglu_q8_rows` and `dequantize_q8` are re-exported here.
The GEMV computes W_deq . x_hat exactly up to float32 summation order, x_hat = d * q.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from minfer.errors import MinferError
from minfer.ops import paths
from minfer.ops.cuda.gemv_repack import (Q4_K, Q6_K, GemvWorkspace, Repacked, _finish, _planes4, _tile_loads,
                                         load_configs, splits)
from minfer.ops.cuda.gemv_q8_fields import extras, kwarps, second_first, x_ahead  # noqa: F401
from minfer.ops.cuda.gemv_repack_layout import common_tile_rows
from minfer.ops.cuda.l2_prefetch import prefetch_regions, region_args
from minfer.ops.cuda.pdl import launch_kw
from minfer.ops.cuda.q8_rows import (_glu_q8_words, _q8_chunks, add_rms_norm_q8, dequantize_q8, quantize,  # noqa: F401
                                     quantize_rows, swiglu_q8, swiglu_q8_rows)
from minfer.ops.cuda.resnorm_tail import resnorm_tail

# ---------------------------------------------------------------- the GEMV


@triton.jit
def _dp4a(a, b, c, ASM: tl.constexpr):
    """c + sum over the 4 bytes of a (unsigned) times those of b (signed), per int32 lane."""
    if ASM:
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        s = c
        for i in tl.static_range(4):
            s += ((a >> (8 * i)) & 255) * ((b << (24 - 8 * i)) >> 24)
        return s


@triton.jit
def _q8_tile(p0, p1, p2, p3, xq, xf, resid, bias, out, part, cnt, pid_n, pid_s, N, NSTRIDE, NB, stride_rm,
             blocks_per_split, SPLIT, gq, gf, TF, GLU: tl.constexpr, QT: tl.constexpr, BN: tl.constexpr,
             BB: tl.constexpr, IS_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESID: tl.constexpr,
             ASM: tl.constexpr,
             PREFETCH: tl.constexpr, PDL: tl.constexpr = 0, PRE2: tl.constexpr = False, TM: tl.constexpr = 0):
    """Row tile pid_n (of this weight's N rows), K split pid_s: out[rows] = W_deq . x_hat [+ bias]
    [+ resid]. out, bias, resid, part and cnt point at this weight's first row / tile; part's
    split stride is NSTRIDE (all the segments' rows). PDL: the first weight tile is loaded
    before waiting for the previous kernel (pdl.py: weights are never written by the step);
    PRE2 (with PREFETCH): two tiles are in flight, both loaded before the wait."""
    C: tl.constexpr = BB * 8
    rows = pid_n * BN + tl.arange(0, BN)
    rmask = rows < N
    row2 = tl.minimum(rows, N - 1).to(tl.int64)[:, None]
    ci = tl.arange(0, C)
    wi = tl.arange(0, 4)
    w4 = tl.arange(0, 4 * C)
    b_lo = pid_s * blocks_per_split
    b_hi = tl.minimum(b_lo + blocks_per_split, NB)
    acc = tl.zeros([BN, C], dtype=tl.float32)
    zero = tl.zeros([BN, C, 4], dtype=tl.int32)
    nxt = _tile_loads(p0, p1, p2, p3, row2, b_lo, b_hi, NB, w4, ci, BN, C, QT, TM)
    if PRE2:
        nxt2 = _tile_loads(p0, p1, p2, p3, row2, b_lo + BB, b_hi, NB, w4, ci, BN, C, QT, TM)
    else:
        nxt2 = nxt
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    for blk in range(b_lo, b_hi, BB):
        if PREFETCH:
            wq, hq, sa, sb = nxt
            if PRE2:
                nxt = nxt2
                nxt2 = _tile_loads(p0, p1, p2, p3, row2, blk + 2 * BB, b_hi, NB, w4, ci, BN, C, QT, TM)
            else:
                nxt = _tile_loads(p0, p1, p2, p3, row2, blk + BB, b_hi, NB, w4, ci, BN, C, QT, TM)
        else:
            wq, hq, sa, sb = _tile_loads(p0, p1, p2, p3, row2, blk, b_hi, NB, w4, ci, BN, C, QT, TM)
        kc = blk * 8 + ci                                             # [C] chunk index in the row
        kmask = kc < b_hi * 8
        if GLU == 2:          # the GLU prologue: xq / xf are the gate / up rows, quantized here as swiglu_q8 does
            xlo, xhi, xd, xs0, xs1 = _glu_q8_words(xq, xf, kc, kmask)
            xlo, xhi, xd, xs0, xs1 = xlo[None, :, :], xhi[None, :, :], xd[None, :], xs0[None, :], xs1[None, :]
        else:
            xo = (kc * 8)[:, None] + wi[None, :]                      # [C, 4]
            xlo = tl.load(xq + xo, mask=kmask[:, None], other=0)[None, :, :]
            xhi = tl.load(xq + xo + 4, mask=kmask[:, None], other=0)[None, :, :]
            xd = tl.load(xf + kc * 4, mask=kmask, other=0.0)[None, :]
            xs0 = tl.load(xf + kc * 4 + 1, mask=kmask, other=0.0)[None, :]
            xs1 = tl.load(xf + kc * 4 + 2, mask=kmask, other=0.0)[None, :]
        lo = wq & 0x0F0F0F0F                                          # nibbles 0,2,4,6: values w, w+8, ...
        hi = (wq >> 4) & 0x0F0F0F0F                                   # nibbles 1,3,5,7: w+4, w+12, ...
        if QT == 12:
            s = _dp4a(hi, xhi, _dp4a(lo, xlo, zero, ASM), ASM)
            isum = tl.sum(s, axis=2).to(tl.float32)                   # [BN, C]
            scm = sa.to(tl.int32)
            d = (sb & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            dmin = (sb >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            a = d * (scm & 255).to(tl.float32)
            ml = dmin * ((scm >> 8) & 255).to(tl.float32)
            acc += a * (xd * isum) - ml * (xs0 + xs1)
        else:
            # the 2 high bits (crumb p of hq is value 4p + w's) next to their nibbles, at bits 4..5
            # of each byte: bytes of h spread to [h0, h0, h1, h1], then crumbs 0,2,4,6 (1,3,5,7)
            h = hq.to(tl.int32) & 0xFFFF
            x2 = (h & 255) * 257 + ((h >> 8) & 255) * 0x1010000
            lo = lo | ((x2 << 4) & 0x00300030) | (x2 & 0x30003000)
            hi = hi | ((x2 << 2) & 0x00300030) | ((x2 >> 2) & 0x30003000)
            # bytes 0-1 of each word are values < 16 (first scale), bytes 2-3 the second
            s0 = _dp4a(hi, xhi & 0xFFFF, _dp4a(lo, xlo & 0xFFFF, zero, ASM), ASM)
            s1 = _dp4a(hi, xhi & -65536, _dp4a(lo, xlo & -65536, zero, ASM), ASM)
            i0 = tl.sum(s0, axis=2).to(tl.float32)
            i1 = tl.sum(s1, axis=2).to(tl.float32)
            s2 = sa.to(tl.int32)
            d = sb.to(tl.float32)
            a0 = d * ((s2 << 24) >> 24).to(tl.float32)
            a1 = d * (s2 >> 8).to(tl.float32)
            # value = a (q6 - 32): sum = a (d_x sum q6 q_x - 32 s)
            acc += a0 * (xd * i0 - 32.0 * xs0) + a1 * (xd * i1 - 32.0 * xs1)
    res = tl.sum(acc, axis=1)[:, None]                                # [BN, 1]
    mcol = tl.arange(0, 1)
    mmask = mcol < 1
    done = False            # (returned: whether this program stored its tile's final rows)
    if GLU == 1:
        _glu_pair(res, rows, pid_n, TF, part, cnt, out, gq, gf, BN)
    elif not IS_SPLIT:
        _finish(res, rows, rmask, mcol, mmask, bias, resid, out, stride_rm, N, HAS_BIAS, HAS_RESID)
        done = True
    else:
        poff = (pid_s * NSTRIDE + rows[:, None]).to(tl.int64) + mcol[None, :]
        pm = rmask[:, None] & mmask[None, :]
        tl.store(part + poff, res, mask=pm)
        # the last split of this tile to finish sums the partials in split order (gemv_repack.py)
        tl.debug_barrier()
        ticket = tl.atomic_add(cnt + pid_n, 1, sem="acq_rel", scope="gpu")
        done = ticket == SPLIT - 1
        if done:
            tot = tl.zeros(res.shape, dtype=tl.float32)
            for sp in range(SPLIT):
                tot += tl.load(part + (sp * NSTRIDE + rows[:, None]).to(tl.int64) + mcol[None, :], mask=pm,
                               other=0.0, cache_modifier=".cg")
            _finish(tot, rows, rmask, mcol, mmask, bias, resid, out, stride_rm, N, HAS_BIAS, HAS_RESID)
            tl.atomic_xchg(cnt + pid_n, 0)
    return done


@triton.jit
def _glu_pair(res, rows, pid_n, TF, part, cnt, h_out, gq, gf, BN: tl.constexpr):
    """SwiGLU in the epilogue of the stacked [gate; up] GEMV (2 * TF row tiles of BN rows, no K
    split): gate tile j and up tile TF + j each park their fp32 rows in `part`; the second of
    the two to finish (an atomic ticket, as the split-K reduce) computes h = silu(g) * u for
    those BN values and stores h and its q8 chunks. g and u are rounded to h's dtype first, as
    the GEMV's output was before swiglu_q8 read it: the same bits as the two launches."""
    tl.store(part + rows[:, None], res)
    tl.debug_barrier()
    j = pid_n % TF
    ticket = tl.atomic_add(cnt + j, 1, sem="acq_rel", scope="gpu")
    if ticket == 1:
        F = TF * BN
        is_gate = pid_n < TF
        other = tl.where(is_gate, rows + F, rows - F)
        o = tl.load(part + other[:, None], cache_modifier=".cg")
        g = tl.where(is_gate, res, o).to(h_out.dtype.element_ty).to(tl.float32)
        u = tl.where(is_gate, o, res).to(h_out.dtype.element_ty).to(tl.float32)
        v = g / (1.0 + tl.exp(-g)) * u                                 # [BN, 1], swiglu_q8's formula
        idx = j * BN + tl.arange(0, BN)
        tl.store(h_out + idx[:, None], v.to(h_out.dtype.element_ty))
        c = j * (BN // 32) + tl.arange(0, BN // 32)
        _q8_chunks(tl.reshape(v, (BN // 32, 32)), c, c < TF * (BN // 32), gq, gf)
        tl.atomic_xchg(cnt + j, 0)


@triton.jit
def _gemv_q8_kernel(p0, p1, p2, p3, r0, r1, r2, r3, xq, xf, resid, bias, out, part, cnt, gq, gf, TF,
                    N, NA, TA, NB, stride_rm, blocks_per_split, SPLIT,
                    a0, n0, a1, n1, a2, n2, a3, n3, a4, n4, a5, n5, a6, n6, a7, n7, nx, ng, s_out, h_rn, rcnt, eps,
                    GLU: tl.constexpr,
                    QT: tl.constexpr, QTB: tl.constexpr, MIXED: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr,
                    IS_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESID: tl.constexpr,
                    ASM: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr, PRE2: tl.constexpr,
                    NPF: tl.constexpr = 0, NT: tl.constexpr = 128, TM: tl.constexpr = 0, RN: tl.constexpr = False,
                    BD: tl.constexpr = 16):
    """out (1, N) = W_deq . x_hat [+ bias] [+ resid]; program = (row tile, K split). MIXED: rows
    [0, NA) are weight p (type QT, TA row tiles), rows [NA, N) weight r (type QTB) -- q/k in
    Q4_K and a Q6_K v in one launch. NPF: later weights' byte ranges (a_i, n_i) fetched into L2
    first, each program its share (l2_prefetch.py; before the PDL wait: weights are never written). RN (one
    weight, no bias or resid; Switches.gemv_q8_resnorm): the program storing the last row tile makes s_out =
    nx + out and h_rn = rms_norm(s_out) * ng (resnorm_tail.py; its ticket rcnt)."""
    prefetch_regions(a0, n0, a1, n1, a2, n2, a3, n3, a4, n4, a5, n5, a6, n6, a7, n7, NPF, NT)
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    if MIXED:
        if pid_n < TA:
            _q8_tile(p0, p1, p2, p3, xq, xf, resid, bias, out, part, cnt, pid_n, pid_s, NA, N, NB, stride_rm,
                     blocks_per_split, SPLIT, gq, gf, TF, False, QT, BN, BB, IS_SPLIT, HAS_BIAS, HAS_RESID, ASM,
                     PREFETCH, PDL, PRE2, TM)
        else:
            _q8_tile(r0, r1, r2, r3, xq, xf, resid + NA, bias + NA, out + NA, part + NA, cnt + TA, pid_n - TA,
                     pid_s, N - NA, N, NB, stride_rm, blocks_per_split, SPLIT, gq, gf, TF, False, QTB, BN, BB,
                     IS_SPLIT, HAS_BIAS, HAS_RESID, ASM, PREFETCH, PDL, PRE2, TM)
    else:
        done = _q8_tile(p0, p1, p2, p3, xq, xf, resid, bias, out, part, cnt, pid_n, pid_s, N, N, NB, stride_rm,
                        blocks_per_split, SPLIT, gq, gf, TF, GLU, QT, BN, BB, IS_SPLIT, HAS_BIAS, HAS_RESID, ASM,
                        PREFETCH, PDL, PRE2, TM)
        if RN:
            if done:
                resnorm_tail(nx, out, ng, s_out, h_rn, eps, N, rcnt, tl.num_programs(0), BD)


_TARGET_PROGRAMS = 132 * 4
RN_MAX = 8192          # the residual norm tail's row (one program's BD-wide block)


def default_config(qtype: int, n: int, k: int) -> tuple:
    """(BN, BB, SPLIT, num_warps, prefetch): the H200 sweep's usual winner, 32-row tiles of two
    blocks, 4 warps, prefetch, split K to ~4 programs per SM."""
    bn, bb = 32, 2
    nb = k // 256
    tiles = triton.cdiv(n, bn)
    split = 1 if tiles >= _TARGET_PROGRAMS else min(nb, triton.cdiv(_TARGET_PROGRAMS, tiles), 32)
    return bn, bb, split, 4, True


# "<type> <N>x<K>" -> (BN, BB, SPLIT, warps, prefetch), from the device sweep
CONFIGS = load_configs(os.path.join(os.path.dirname(__file__), "gemv_q8_h200.json"))


def config_for(qtype: int, n: int, k: int, interpret: bool = False) -> tuple:
    if interpret:
        return (32, 2, 2, 4, True)
    hit = CONFIGS.get(f"{'Q4_K' if qtype == Q4_K else 'Q6_K'} {n}x{k}")
    return tuple(hit) if hit else default_config(qtype, n, k)


def _split_scratch(nb: int, split: int, bb: int, rows: int, tiles: int, ws, out: torch.Tensor) -> tuple:
    """(blocks_per_split, split, part, cnt) of a launch (splits); with more than one split the
    (split, rows) float32 partial sums and the row tiles' tickets (the workspace's zeroed
    counters), else `out` for both (unused)."""
    bps, split = splits(nb, split, bb)
    if split == 1:
        return bps, split, out, out
    part = torch.empty((split, rows), dtype=torch.float32, device=out.device)
    cnt = ws.counters(tiles) if ws is not None else torch.zeros(tiles, dtype=torch.int32, device=out.device)
    return bps, split, part, cnt


def gemv_q8(q8, rw, bias=None, resid=None, out_dtype=torch.bfloat16, config=None,
            ws: GemvWorkspace | None = None, asm: bool | None = None, interpret: bool = False,
            pdl: int = 0, pdl_prefetch: int = 1, l2: tuple | None = None, gluon: bool = False, pdl_late: bool = False,
            gluon_table: str = "", preload: bool = True, prenorm=None, rope=None, rstd_late: bool = False,
            l2_heads: int = 0, glu=None, resnorm=None, split_gather: int = 0) -> torch.Tensor:
    """out (1, N) = W . x_hat [+ bias] [+ resid] for the repacked weight W and a q8 row (module
    doc). rw: a Repacked, or a pair of them of one K (their rows stacked: out's first rows are
    the first weight's; one launch, each program on one weight's rows, e.g. q/k + a Q6_K v).
    pdl: programmatic launch mode (pdl.py; a GEMV always signals after its wait); pdl_prefetch
    (1 or 2): weight tiles per program in flight, all read before the wait (2 only for tiles of
    <= 64 rows x blocks; the callers ask for 2 only with PDL on). l2: (budget, small, big_next)
    bytes of later weights this launch fetches into L2 (l2_prefetch.py: ws.l2 learns the order),
    or None. gluon: the Gluon kernel (gemv_q8_gluon.py) for the shapes of its config table (those
    it won in the sweep) or with an explicit config (BN, BB, SPLIT, warps[, prefetch]); not on
    the interpreter, not with l2 ranges (Triton's kernel only); counted per launch as
    `gemv_q8.gluon` or `gemv_q8.triton`. pdl_late: on the Gluon kernel, the next kernel is
    signalled when each program ends, not after its wait (gemv_q8_gluon._pdl_mode; the Triton
    kernel always signals after its wait). gluon_table: another Gluon config table file
    (Switches.gemv_q8g_table). preload: on the Gluon kernel, the bias rows are loaded before the
    PDL wait (Switches.pdl_preload). prenorm (a q8_rows.PreNorm; q8 None): x_hat is the q8 form of
    the deferred rms_norm(x + y) * weight, made by the Gluon kernel's programs (its NORM, which
    also stores x + y into prenorm.s; counted `gemv_q8.norm_prologue`); where the Gluon kernel
    does not take the launch, prenorm's own kernel runs first (a counted fallback). A prenorm with
    q8u (Switches.norm_into_gemv = 4): x_hat is that q8 row of s * weight and the kernel scales its
    row sums by rstd from prenorm.ssp (counted `gemv_q8.norm_scale`), summed after the K loop with
    rstd_late (Switches.norm_rstd_late). rope (a q/k/v group: a
    gemv_q8_gluon_rope.Rope): q rotated in out, rope(k) and v into the caches (module gemv_q8_gluon_rope;
    counted `gemv_q8.rope`, or its fallback: this GEMV, then the rope_kv kernel). l2_heads
    (Switches.l2_heads): the Gluon launch fetches that many head blocks of every row tile of the next
    GEMV into L2 before its wait, where that GEMV is tile-major and 4x larger (_l2_heads). glu: (gate, up),
    one contiguous row of K each, instead of q8 (None): x_hat is the q8 form of silu(gate) * up, made by the
    kernel's programs as swiglu_q8 makes it (the GLU prologue, Switches.gemv_glu_prologue; one weight; either
    kernel, but not a Gluon config with warps along K or stream-K: glu_route says where). resnorm: (resid float32
    (1, N), weight (N,), eps, s float32 (1, N), h (1, N)) -- where the Triton kernel takes a one-weight launch
    without bias or resid (N <= RN_MAX), its last row tile's program makes s = resid + out and h = rms_norm(s) *
    weight (Switches.gemv_q8_resnorm; counted `gemv_q8.resnorm`) and out.rn = (s, h); else out alone. split_gather:
    the Gluon kernel's split tiles sum their partials in one load round (Switches.split_gather)."""
    segs = tuple(rw) if isinstance(rw, (tuple, list)) else (rw,)
    if glu is not None:
        q8 = glu
        if len(segs) != 1 or prenorm is not None or rope is not None or not glu_rows_ok(glu, segs[0].k):
            raise MinferError(f"gemv_q8: the GLU prologue takes one weight and (gate, up) rows of (1, {segs[0].k})")
    rscale = None
    if prenorm is not None:
        if prenorm.q8 is not None:
            q8, prenorm = prenorm.q8, None
        elif prenorm.q8u is not None:
            q8, rscale = prenorm.q8u, (prenorm.ssp, prenorm.ssp.numel(), prenorm.eps)
        else:
            q8 = (prenorm.s, prenorm.s)        # (not read: only the device and the K check below)
            if prenorm.x.shape != (1, segs[0].k):
                raise MinferError(f"gemv_q8: the deferred norm's row has shape {tuple(prenorm.x.shape)}, "
                                  f"the weight expects (1, {segs[0].k})")
    xq, xf = q8
    if len(segs) not in (1, 2) or len({r.k for r in segs}) != 1:
        raise MinferError(f"gemv_q8: expected one weight or two of one K, got {len(segs)}")
    n, k = sum(r.n for r in segs), segs[0].k
    for r in segs:
        if r.qtype not in (Q4_K, Q6_K):
            raise MinferError(f"gemv_q8: type {r.qtype} has no int8 path (Q4_K and Q6_K only)")
    if prenorm is None and glu is None and xq.numel() * 4 != k:
        raise MinferError(f"gemv_q8: activations have {xq.numel() * 4} values, the weight expects {k}")
    if resid is not None and (tuple(resid.shape) != (1, n) or resid.stride(1) != 1):
        raise MinferError(f"gemv_q8: resid has shape {tuple(resid.shape)}, expected (1, {n})")
    use_g, cfg, why = _choose(segs, n, k, config, gluon and not l2, interpret, gluon_table, xq.device)
    if why is not None:
        paths.fallback("gemv_q8.gluon", why)
    wk = kwarps(cfg)
    glu_why = _glu_cfg_refused(cfg, k) if glu is not None and use_g else None
    if glu_why:
        raise MinferError(f"gemv_q8: the GLU prologue cannot take {n}x{k}: the Gluon config {tuple(cfg)} {glu_why} "
                          "(glu_route)")
    if rscale is not None:
        if use_g and cfg[2] >= 0:
            paths.count("gemv_q8.norm_scale")
        else:
            paths.fallback("gemv_q8.norm_scale", why or "the Triton kernel or stream-K takes this launch: no rstd scale")
            xq, xf = prenorm.materialize()
            rscale = None
        prenorm = None
    if prenorm is not None:
        if use_g and not wk:
            paths.count("gemv_q8.norm_prologue")
        else:
            paths.fallback("gemv_q8.norm_prologue", (
                f"the Gluon config {tuple(cfg)} for {n}x{k} splits its warps along K, which has no norm prologue: "
                "the norm kernel runs first") if use_g else why or (
                "the Triton kernel takes this launch (the interpreter, a shape not in the Gluon kernel's table, or "
                "the Gluon kernel off) and has no norm prologue"))
            xq, xf = prenorm.materialize()
            prenorm = None
    bn, bb, split, nwarps = cfg[:4]                     # an explicit Gluon 4-tuple may land on Triton too
    prefetch, regs, late = extras(cfg)
    if rope is not None:
        from minfer.ops.cuda import gemv_q8_gluon_rope as GR

        rope_why = (why or "the Triton kernel takes this launch (the interpreter, a shape outside the Gluon table, "
                    "or it off)") if not use_g else ("a norm prologue (norm_into_gemv 1-2)" if prenorm is not None
                                                    else GR.refused(segs, cfg, split, rope, out_dtype))
        if rope_why:
            paths.fallback("gemv_q8.rope", rope_why)
        else:
            paths.count("gemv_q8.rope")
    pdl_late = pdl_late or late
    if wk and (not use_g or split < 0):
        raise MinferError(f"gemv_q8: config {tuple(cfg)} asks for warps along K (its eighth field), which only the "
                          f"Gluon kernel's K-split launch runs ({why or 'not with stream-K'})")
    if split < 0 and (not use_g or len(segs) != 1 or prenorm is not None):
        raise MinferError(f"gemv_q8: config {tuple(cfg)} asks for stream-K (SPLIT < 0), which only the Gluon "
                          "kernel runs, on one weight without a norm prologue")
    paths.count("gemv_q8.gluon" if use_g else "gemv_q8.triton")
    nb = k // 256
    out = torch.empty((1, n), dtype=out_dtype, device=xq.device)
    if split < 0:               # stream-K over -split programs (gemv_q8_gluon_sk.py)
        from minfer.ops.cuda import gemv_q8_gluon_sk as SK

        if _l2_heads(segs, ws, l2_heads, l2) is not None:
            paths.fallback("gemv_q8.l2_heads", "stream-K takes the launch before a tile-major GEMV: nothing fetched")
        paths.count("gemv_q8.gluon.stream_k")
        part, cnt = SK.sk_scratch(n, bn, -split, ws, xq.device)
        SK.launch_sk(segs[0], xq, xf, resid, bias, out, part, cnt, -split, bn, bb, nwarps, pdl, prefetch,
                     late=pdl_late, preload=preload, regs=regs)
        return _rope_after(out, rope, pdl)
    na = segs[0].n
    ta = triton.cdiv(na, bn)
    tiles = ta + (triton.cdiv(n - na, bn) if len(segs) == 2 else 0)
    bps, split, part, cnt = _split_scratch(nb, split, bb, n, tiles, ws, out)
    grid = (tiles, split)
    hp = _l2_heads(segs, ws, l2_heads, l2)
    if hp is not None and not (use_g and (rope is None or rope_why)):
        paths.fallback("gemv_q8.l2_heads", "the launch before a tile-major GEMV is not the plain Gluon kernel's "
                       "(the q/k/v rope epilogue, stream-K or the Triton kernel): nothing fetched into L2")
        hp = None
    if hp is not None:
        paths.count("gemv_q8.l2_heads")
    if use_g and rope is not None and not rope_why:
        GR.launch(segs, xq, xf, bias, out, n, na, ta, tiles, nb, bps, bn, bb, nwarps, pdl, rope, prefetch,
                  late=pdl_late, preload=preload, regs=regs, kwarps=wk, second_first=second_first(cfg),
                  x_ahead=x_ahead(cfg), rscale=rscale, rstd_late=rstd_late)
        return out
    if use_g:
        from minfer.ops.cuda import gemv_q8_gluon as GL

        GL.launch(segs, xq, xf, resid, bias, out, part, cnt, n, na, ta, nb, bps, split, bn, bb, nwarps, pdl, grid,
                  prefetch, late=pdl_late, preload=preload, regs=regs, kwarps=wk, second_first=second_first(cfg),
                  x_ahead=x_ahead(cfg), per_sm=GL.per_sm(cfg), l2_heads=hp,
                  norm=None if prenorm is None or prenorm.ssp is not None else
                  (prenorm.x, prenorm.y, prenorm.weight, prenorm.eps, prenorm.s),
                  norm_ss=None if prenorm is None or prenorm.ssp is None else
                  (prenorm.x, prenorm.ssp, prenorm.ssp.numel(), prenorm.weight, prenorm.eps), rscale=rscale,
                  rstd_late=rstd_late, glu=glu, gather=split_gather)
        return _rope_after(out, rope, pdl)
    p0, p1, p2, p3 = _planes4(segs[0])
    r0, r1, r2, r3 = _planes4(segs[-1])
    pf, npf = region_args(_l2_regions(segs, ws, l2, interpret))
    rn = dict(nx=out, ng=out, s_out=out, h_rn=out, rcnt=out, eps=0.0)
    if resnorm is not None and len(segs) == 1 and bias is None and resid is None and n <= RN_MAX:
        paths.count("gemv_q8.resnorm")
        # the tail's ticket after the row tiles' (zeros between launches, also without a split)
        rcnt = ws.counters(tiles + 1)[tiles:] if ws is not None else torch.zeros(1, dtype=torch.int32, device=out.device)
        rn = dict(nx=resnorm[0], ng=resnorm[1], s_out=resnorm[3], h_rn=resnorm[4], rcnt=rcnt, eps=float(resnorm[2]))
        out.rn = (resnorm[3], resnorm[4])
    _gemv_q8_kernel[grid](p0, p1, p2, p3, r0, r1, r2, r3, xq, xf, resid if resid is not None else out,
                          bias if bias is not None else out, out, part, cnt, xq, xf, 1, n, na, ta, nb,
                          resid.stride(0) if resid is not None else 0, bps, split, *pf, NPF=npf, NT=32 * nwarps,
                          GLU=2 if glu is not None else 0,
                          QT=segs[0].qtype, QTB=segs[-1].qtype, MIXED=len(segs) == 2, BN=bn, BB=bb,
                          IS_SPLIT=split > 1, HAS_BIAS=bias is not None, HAS_RESID=resid is not None,
                          ASM=(not interpret) if asm is None else asm, PREFETCH=bool(prefetch), PDL=min(int(pdl), 1),
                          PRE2=bool(prefetch) and pdl_prefetch >= 2 and bn * bb <= 64, TM=common_tile_rows(segs),
                          RN=hasattr(out, "rn"), BD=triton.next_power_of_2(n), **rn,
                          num_warps=nwarps, num_stages=1, **launch_kw(pdl))
    return _rope_after(out, rope, pdl)


def glu_route(rw: Repacked, gluon: bool, gluon_table: str, device, interpret: bool = False) -> tuple:
    """(on_gluon, why) for this weight's launch as gemv_q8 chooses it: whether it runs on the Gluon kernel
    (Switches.gemv_glu_prologue 1 leaves those downs their swiglu launch), and why gemv_q8(glu=...) (and
    gemv_q8_residual's) cannot take it (a Gluon config whose prologue-less form the GLU cannot ride: warps
    along K, stream-K, too many q8 chunks a program), or None."""
    use_g, cfg, _ = _choose((rw,), rw.n, rw.k, None, gluon, interpret, gluon_table, device)
    why = _glu_cfg_refused(cfg, rw.k) if use_g else None
    return use_g, (f"the Gluon config {tuple(cfg)} for {rw.n}x{rw.k} {why}" if why else None)


def glu_rows_ok(glu, k: int) -> bool:
    """Whether (gate, up) are the GLU prologue's rows for K: one contiguous (1, K) row each."""
    return all(t.shape == (1, k) and t.is_contiguous() for t in glu)


# The Gluon GLU prologue makes a program's whole K range at once (gemv_q8g_norm._norm_q8_smem): up to 32 q8
# chunks the values fit beside the step in flight (sm_90 builds, ptxas: the 7B's Q4_K down at 128 chunks spilled
# 152 bytes at its 72-register cap, its Q6_K down took 128 registers against 96; at 32: no spill, 72 / 80).
GLU_MAX_CHUNKS = 32


def _glu_cfg_refused(cfg, k: int) -> str | None:
    """What in a Gluon config for K leaves no room for the GLU prologue (its NORM 1 path), or None."""
    if kwarps(cfg):
        return "splits its warps along K (no prologue there)"
    if cfg[2] < 0:
        return "is stream-K (no prologue there)"
    bps = splits(k // 256, cfg[2], cfg[1])[0]
    if bps * 8 > GLU_MAX_CHUNKS:
        return (f"gives a program {bps * 8} q8 chunks of K, more than the prologue's {GLU_MAX_CHUNKS} (their values "
                "would not fit its registers)")
    return None


def _rope_after(out, rope, pdl):
    if rope is not None:                                # (the fallback counted above)
        from minfer.ops.cuda.gemv_q8_gluon_rope import rope_after

        rope_after(out, rope, pdl)
    return out


def _choose(segs, n: int, k: int, config, gluon: bool, interpret: bool, gluon_table: str, device,
            refuse=None) -> tuple:
    """(use_gluon, config, why): the kernel of a q8 GEMV launch (gemv_q8 and gemv_q8_swiglu).
    The Gluon kernel when asked (gluon, not on the interpreter) and its table (or `config`) has
    the shape, unless this GPU, the tile (gemv_q8_gluon.supported) or `refuse(config)` says why
    not: `why` is then the fallback's reason for the caller to count. Otherwise the Triton
    kernel with `config` or its own table's config (a shape not in the Gluon table is not a
    fallback: why is None)."""
    if gluon and not interpret:
        from minfer.ops.cuda import gemv_q8_gluon as GL

        cfg = tuple(config) if config else GL.config_for(segs[0].qtype, n, k, gluon_table)
        if cfg is not None:
            why = (GL.device_unsupported(device) or GL.supported(segs, cfg[0], cfg[1])
                   or (refuse(cfg) if refuse else None))
            if why is None:
                return True, cfg, None
            return False, tuple(config) if config else config_for(segs[0].qtype, n, k, interpret), why
    return False, tuple(config) if config else config_for(segs[0].qtype, n, k, interpret), None


def _l2_regions(segs, ws, l2, interpret: bool) -> list:
    """The byte ranges this launch prefetches into L2 (l2_prefetch.L2Plan; counted per launch as
    `gemv_q8.l2_prefetch`), [] when off, while the plan learns the step's order, or on the
    interpreter (no such instruction there)."""
    if not l2 or ws is None or interpret:
        return []
    pos = ws.l2.note(segs)
    if pos is None:
        return []
    regs = ws.l2.regions(pos, *l2)
    if regs:
        paths.count("gemv_q8.l2_prefetch")
    return regs


def _l2_heads(segs, ws, h: int, l2):
    """What this launch's programs fetch into L2 (l2_prefetch.L2Plan.heads: the next GEMV's first |h|
    K blocks of every row tile, where that GEMV is tile-major and 4x this one's bytes) as the Gluon
    launch takes it, (HPF, 13 scalar arguments); None when off (h 0, or the Triton kernel's l2 ranges,
    which learn the same plan), while the plan learns the step's order, or for any other launch. The
    caller counts `gemv_q8.l2_heads` where its launch takes it. Every q8 GEMV launch notes itself, so
    the plan learns the whole cycle."""
    if h == 0 or ws is None or l2:
        return None
    r = ws.l2.heads(ws.l2.note(segs), abs(h))
    # (h < 0, Switches.l2_heads_late: issued after the dot products, the kernel's HPF 8 + planes)
    return None if r is None else (r[0] + (8 if h < 0 else 0), r[1])


from minfer.ops.cuda.gemv_q8_residual import gemv_q8_residual  # noqa: E402,F401  (moved there; the name kept here)
from minfer.ops.cuda.gemv_q8_swiglu import gemv_q8_swiglu  # noqa: E402,F401  (moved there; the name kept here)
