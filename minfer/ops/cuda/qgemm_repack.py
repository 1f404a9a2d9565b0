"""Batched-decode GEMM over the repacked Q4_K / Q6_K planes: out (M, N) = x (M, K) @ W^T, 8 < M <= 256.

Why: batched decode at 16-256 rows multiplied by dense bf16 copies of every weight (the batch
engine's dense planes: +13.17 GiB on the 7B, ~14 GB read per step); the repacked planes hold
the same values in 4.6 / 6.6 bits (~4.4 GB for the 7B). The GEMV's tl.dot path (gemv_repack.py)
multiplies K=32 slices and ran at 0.4-0.94 TB/s at M=32 (docs/perf-log.md, decode GEMV).

Shape of the kernel (swap-AB): the MMA's M dimension is the weight's rows (BN = 64..256, 64
per wgmma), its N dimension the batch rows (BM = 16..256), K BK = 128, 256 or 512 values (half,
one or two super-blocks) per iteration. Per iteration a program
  - loads the tile's quant words ([BN, BK/32 chunks, 4 words]: one 16-byte load per chunk, as
    the GEMV; evict-first when no other M tile will read them) and its scales;
  - decodes them in registers to the EXACT values in fp32 (the values of gemv_repack's
    _dequant_kernel and of ggml: q dl exact, one rounding for - ml; see _decode), rounded once
    to x's dtype -- the bf16 weights cuBLAS multiplies on a dense plane made by dequantize_into.
    The decode is built from joins so that each thread holds whole chunks in K order (scales
    computed once per chunk, fp32 -> bf16 pairs packed from K neighbours);
  - multiplies the [BN, BK] tile by x^T [BK, BM] in ONE tl.dot (fp32 accumulate).
Triton's pipeliner keeps num_stages tiles of words, scales and x in flight (cp.async).
Split K (SPLIT > 1: too few row tiles to fill the GPU): fp32 partials (SPLIT, M, N); the last
program of a tile (an atomic ticket, as the GEMV) sums them in split order -- deterministic --
and runs the epilogue (+ bias, + resid), so one launch per GEMM; inline_reduce=False sums in a
second kernel. Grid axis 0 is the M tile, so the programs that read the same weight tile run
side by side and the second finds it in L2.
Configs: [BN, BM, BK, SPLIT, num_warps, num_stages] per "<type> <N>x<K> m<bucket>" in
qgemm_repack_h200.json (minfer/bench/qgemm_sweep.py writes them), else default_config.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from minfer.errors import MinferError
from minfer.ops.cuda.gemv_repack import _finish as _epilogue  # the same epilogue and split reduce as the GEMV
from minfer.ops.cuda.gemv_repack import _reduce_kernel
from minfer.ops.cuda.gemv_repack import load_configs  # noqa: F401  (the one table reader; tests call it here)
from minfer.ops.cuda.gemv_repack_layout import Q6_K, REPACKED_TYPES, Repacked

MAX_M = 256                           # largest M the kernel is made for (bigger: prefill's dequant + cuBLAS)


# ---------------------------------------------------------------- the kernel

@triton.jit
def _join8(v0, v1, v2, v3, v4, v5, v6, v7):
    """[..., 2, 2, 2] with v_p at [..., p // 4, p // 2 % 2, p % 2]: each join adds a minor
    axis, so pairing 0-4, 2-6, then 0-2 puts p's low bit fastest in the registers."""
    return tl.join(tl.join(tl.join(v0, v4), tl.join(v2, v6)), tl.join(tl.join(v1, v5), tl.join(v3, v7)))


@triton.jit
def _words(t):
    """[..., 4] -> its four [...] slices w = 0, 1, 2, 3 (register renames)."""
    a, b = tl.split(tl.reshape(t, t.shape[:-1] + (2, 2)))      # w even / odd: [..., 2] over w // 2
    w0, w2 = tl.split(a)
    w1, w3 = tl.split(b)
    return w0, w1, w2, w3


@triton.jit
def _by_w(v0, v1, v2, v3):
    """Four [..., 2, 2, 2] tensors (one per word w) -> [..., 2, 2, 2, 2, 2] with w's low bit
    fastest: the registers then hold a chunk's 32 values in K order (4p + w), so the fp32 ->
    bf16 pair conversion packs neighbours in K and no permute is needed before the MMA.
    (A broadcast over a new axis of 8, as _dequant_kernel does, let Triton spread the values
    over lanes and recompute the chunk's scales for every value: ~13 sm_90 instructions per
    value, against ~5 here.)"""
    return tl.join(tl.join(v0, v2), tl.join(v1, v3))


@triton.jit
def _fma(f, a, c, INTERP: tl.constexpr):
    """f * a + c with the product unrounded (the interpreter's fma rounds it: float64 there,
    where these products need at most 26 bits)."""
    if INTERP:
        return (f.to(tl.float64) * a.to(tl.float64) + c.to(tl.float64)).to(tl.float32)
    else:
        return tl.fma(f, a, c)


@triton.jit
def _q4_word(w, magic):
    """The 8 nibbles of the int32 words w as floats, joined as _join8 wants. One shift serves two
    nibbles (as gemv_repack's portable GEMV): nibble 2j+1 lands at bits 19..22 under 1.0's
    exponent (f = 1 + q/16), nibble 2j at 15..18 (f = 1 + q/256). The magic 1.0 is a runtime
    argument so that each and-or stays one LOP3."""
    t0 = w << 15
    t1 = w << 7
    t2 = w >> 1
    t3 = w >> 9
    return _join8(((t0 & 0x78000) | magic).to(tl.float32, bitcast=True),
                  ((t0 & 0x780000) | magic).to(tl.float32, bitcast=True),
                  ((t1 & 0x78000) | magic).to(tl.float32, bitcast=True),
                  ((t1 & 0x780000) | magic).to(tl.float32, bitcast=True),
                  ((t2 & 0x78000) | magic).to(tl.float32, bitcast=True),
                  ((t2 & 0x780000) | magic).to(tl.float32, bitcast=True),
                  ((t3 & 0x78000) | magic).to(tl.float32, bitcast=True),
                  ((t3 & 0x780000) | magic).to(tl.float32, bitcast=True))


@triton.jit
def _f6(w, h, P: tl.constexpr, magic):
    """Q6_K value P (nibble P of w, crumb P of h) as the fp32 1 + q/64: the nibble moved to bits
    17..20, the crumb to 21..22, under 1.0's exponent (two shifts, two and-ors; as gemv_repack)."""
    if P <= 4:
        t = w << (17 - 4 * P)
    else:
        t = w >> (4 * P - 17)
    u = h << (21 - 2 * P)
    return ((t & 0x1E0000) | ((u & 0x600000) | magic)).to(tl.float32, bitcast=True)


@triton.jit
def _decode(wq, hq, sa, sb, magic, QT: tl.constexpr, BN: tl.constexpr, C: tl.constexpr,
            INTERP: tl.constexpr):
    """[BN, C*32] fp32 exact values of C chunks: wq [BN, C, 4] int32 words (hq: Q6_K's high-bit
    halfwords as int32), sa/sb [BN, C] the chunk's scale words (Q4_K: sc | m << 8 and
    d | dmin << 16; Q6_K: the int8 scale pair as int16 and d). Exact as ggml's dequant
    (minfer.quants; the values of gemv_repack._dequant_kernel):
      Q4_K: see _q4_word (q dl exact, one rounding for - ml, as ggml's d1 * q - m1);
      Q6_K: f = 1 + q/64, fma(f, 64 dl, -96 dl) = (q - 32) dl exactly (18 + 6 bits)."""
    if QT == 12:
        scm = sa.to(tl.int32)
        d = (sb & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        dmin = (sb >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        dl = d * (scm & 255).to(tl.float32)                                   # exact: 11 x 6 bits
        ml = (dmin * ((scm >> 8) & 255).to(tl.float32))[:, :, None, None, None, None, None]
        # even nibbles came as 1 + q/256, odd ones as 1 + q/16: fma(f, S dl, -S dl) = q dl exactly
        # (the product needs up to 26 bits, unrounded in an fma; q dl itself fits in 21), and
        # - ml rounds once, as ggml's d1 * q - m1
        odd = (tl.arange(0, 2) == 1)[None, None, None, None, :, None, None]     # p % 2
        dl7 = dl[:, :, None, None, None, None, None]
        s_ = tl.where(odd, dl7 * 16.0, dl7 * 256.0)
        ws = _words(wq)
        f = _by_w(_q4_word(ws[0], magic), _q4_word(ws[1], magic), _q4_word(ws[2], magic), _q4_word(ws[3], magic))
        v = _fma(f, s_, -s_, INTERP) - ml                                      # [BN, C, p//4, p//2%2, p%2, w//2, w%2]
    else:
        s2 = sa.to(tl.int32)
        d = sb.to(tl.float32)
        dl0 = d * ((s2 << 24) >> 24).to(tl.float32)                         # scale 2c: p < 4
        dl1 = d * (s2 >> 8).to(tl.float32)                                  # scale 2c+1: p >= 4
        ws = _words(wq)
        hs = _words(hq)
        f = _by_w(_join8(_f6(ws[0], hs[0], 0, magic), _f6(ws[0], hs[0], 1, magic), _f6(ws[0], hs[0], 2, magic),
                         _f6(ws[0], hs[0], 3, magic), _f6(ws[0], hs[0], 4, magic), _f6(ws[0], hs[0], 5, magic),
                         _f6(ws[0], hs[0], 6, magic), _f6(ws[0], hs[0], 7, magic)),
                  _join8(_f6(ws[1], hs[1], 0, magic), _f6(ws[1], hs[1], 1, magic), _f6(ws[1], hs[1], 2, magic),
                         _f6(ws[1], hs[1], 3, magic), _f6(ws[1], hs[1], 4, magic), _f6(ws[1], hs[1], 5, magic),
                         _f6(ws[1], hs[1], 6, magic), _f6(ws[1], hs[1], 7, magic)),
                  _join8(_f6(ws[2], hs[2], 0, magic), _f6(ws[2], hs[2], 1, magic), _f6(ws[2], hs[2], 2, magic),
                         _f6(ws[2], hs[2], 3, magic), _f6(ws[2], hs[2], 4, magic), _f6(ws[2], hs[2], 5, magic),
                         _f6(ws[2], hs[2], 6, magic), _f6(ws[2], hs[2], 7, magic)),
                  _join8(_f6(ws[3], hs[3], 0, magic), _f6(ws[3], hs[3], 1, magic), _f6(ws[3], hs[3], 2, magic),
                         _f6(ws[3], hs[3], 3, magic), _f6(ws[3], hs[3], 4, magic), _f6(ws[3], hs[3], 5, magic),
                         _f6(ws[3], hs[3], 6, magic), _f6(ws[3], hs[3], 7, magic)))
        half = (tl.arange(0, 2) == 0)[None, None, :, None, None, None, None]    # p // 4 == 0
        a = tl.where(half, (dl0 * 64.0)[:, :, None, None, None, None, None],
                     (dl1 * 64.0)[:, :, None, None, None, None, None])
        c = tl.where(half, (dl0 * -96.0)[:, :, None, None, None, None, None],
                     (dl1 * -96.0)[:, :, None, None, None, None, None])
        # (1 + q/64) * 64 dl - 96 dl = (q - 32) dl: 6 x 18 bits, exact in one fma (the product
        # (64 + q) dl alone may need 26 bits, so it must not be rounded on its own)
        if INTERP:   # the interpreter's fma rounds the product: float64 is exact here
            v = (f.to(tl.float64) * a.to(tl.float64) + c.to(tl.float64)).to(tl.float32)
        else:
            v = tl.fma(f, a, c)
    # nibble p of word w is value 4p + w of its chunk: the axes are already in K's order
    return tl.reshape(v, (BN, C * 32))


@triton.jit
def _d6(p3, idx, mask, EVICT: tl.constexpr):
    """Q6_K's f16 d at element idx of its plane, read as the aligned 4-byte word holding it (a
    2-byte load cannot be copied asynchronously, so the pipeliner left it in the loop)."""
    if mask is None:
        word = tl.load(p3.to(tl.pointer_type(tl.int32)) + idx // 2, eviction_policy=EVICT)
    else:
        word = tl.load(p3.to(tl.pointer_type(tl.int32)) + idx // 2, mask=mask, other=0, eviction_policy=EVICT)
    return ((word >> ((idx & 1) * 16).to(tl.int32)) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _qgemm_kernel(p0, p1, p2, p3, x, out, part, cnt, bias, resid,
                  M, N, NB, stride_xm, stride_rm, stride_om, steps_per_split, SPLIT, magic,
                  QT: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
                  EVEN_K: tl.constexpr, IS_SPLIT: tl.constexpr, INLINE_REDUCE: tl.constexpr,
                  HAS_BIAS: tl.constexpr, HAS_RESID: tl.constexpr, EVICT: tl.constexpr,
                  DOT_F32: tl.constexpr, IEEE: tl.constexpr, INTERP: tl.constexpr):
    """Program (M tile, row tile, K split): acc [BN, BM] = W[rows, K range] @ x[mcols, K range]^T."""
    C: tl.constexpr = BK // 32                                         # chunks of 32 values per row and K step
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    rows = pid_n * BN + tl.arange(0, BN)
    rmask = rows < N
    # rows past N (and batch rows past M) read the last valid row: no mask on the hot loads;
    # they are never stored
    row2 = tl.minimum(rows, N - 1).to(tl.int64)[:, None]               # [BN, 1]
    mcol = pid_m * BM + tl.arange(0, BM)
    mmask = mcol < M
    xrow = tl.minimum(mcol, M - 1).to(tl.int64)[:, None] * stride_xm   # [BM, 1]
    ci = tl.arange(0, C)
    w4 = tl.arange(0, 4 * C)
    kv = tl.arange(0, BK)
    # K ranges in whole steps, so that c0 is a known multiple of C: the scale loads are then
    # vectors (an unknown alignment made them 2-byte loads, which the pipeliner cannot copy
    # asynchronously: every step waited for them)
    c_lo = pid_s * steps_per_split * C
    c_hi = tl.minimum(c_lo + steps_per_split * C, NB * 8)
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for c0 in range(c_lo, c_hi, C):
        kc = c0 + ci                                                   # [C] chunk index in the row
        qoff = row2 * (NB * 32) + c0 * 4 + w4[None, :]                 # [BN, 4C] words: 16-byte chunks
        xoff = xrow + (c0 * 32 + kv)[None, :]                          # [BM, BK]
        if EVEN_K:
            wq = tl.load(p0 + qoff, eviction_policy=EVICT)
            if QT == 12:
                hq = wq
                sa = tl.load(p1 + row2 * (NB * 8) + kc[None, :], eviction_policy=EVICT)
                sb = tl.load(p2.to(tl.pointer_type(tl.int32)) + row2 * NB + (kc // 8)[None, :],
                             eviction_policy=EVICT)
            else:
                hq = tl.load(p1 + qoff, eviction_policy=EVICT)
                # the int8 scales 2c, 2c+1 of chunk c as one little-endian int16
                sa = tl.load(p2.to(tl.pointer_type(tl.int16)) + row2 * (NB * 8) + kc[None, :],
                             eviction_policy=EVICT)
                sb = _d6(p3, row2 * NB + (kc // 8)[None, :], None, EVICT)
            xb = tl.load(x + xoff, eviction_policy="evict_last")   # re-read by every row tile
        else:
            # a K range that is not a whole number of K steps: the chunks past c_hi read as
            # zero words and zero scales (value 0) and zero x
            km4 = (c0 * 4 + w4 < c_hi * 4)[None, :]
            kmask = (kc < c_hi)[None, :]
            wq = tl.load(p0 + qoff, mask=km4, other=0, eviction_policy=EVICT)
            if QT == 12:
                hq = wq
                sa = tl.load(p1 + row2 * (NB * 8) + kc[None, :], mask=kmask, other=0, eviction_policy=EVICT)
                sb = tl.load(p2.to(tl.pointer_type(tl.int32)) + row2 * NB + (kc // 8)[None, :], mask=kmask,
                             other=0, eviction_policy=EVICT)
            else:
                hq = tl.load(p1 + qoff, mask=km4, other=0, eviction_policy=EVICT)
                sa = tl.load(p2.to(tl.pointer_type(tl.int16)) + row2 * (NB * 8) + kc[None, :], mask=kmask,
                             other=0, eviction_policy=EVICT)
                sb = _d6(p3, row2 * NB + (kc // 8)[None, :], kmask, EVICT)
            xb = tl.load(x + xoff, mask=(c0 * 32 + kv < c_hi * 32)[None, :], other=0.0,
                         eviction_policy="evict_last")
        wt = _decode(tl.reshape(wq, (BN, C, 4)), tl.reshape(hq, (BN, C, 4)).to(tl.int32), sa, sb, magic, QT, BN,
                     C, INTERP)
        if DOT_F32:
            # bf16 x in Triton's interpreter, whose bf16 dot is wrong and whose fp32 -> bf16 cast
            # truncates: the tile is rounded to bf16 by integer ops (round to nearest even, what
            # the GPU's cast does) and multiplied in fp32, so the values are the GPU kernel's
            bits = wt.to(tl.int32, bitcast=True)
            wr = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
            acc = tl.dot(wr, tl.trans(xb.to(tl.float32)), acc, input_precision="ieee")
        elif IEEE:
            acc = tl.dot(wt, tl.trans(xb), acc, input_precision="ieee")
        else:
            acc = tl.dot(wt.to(x.dtype.element_ty), tl.trans(xb), acc)
    if not IS_SPLIT:
        _epilogue(acc, rows, rmask, mcol, mmask, bias, resid, out, stride_rm, stride_om, HAS_BIAS, HAS_RESID)
    else:
        poff = (pid_s * M + mcol[None, :]).to(tl.int64) * N + rows[:, None]
        pm = rmask[:, None] & mmask[None, :]
        tl.store(part + poff, acc, mask=pm)
        if INLINE_REDUCE:
            # the last split of a tile to finish sums all partials in split order (deterministic);
            # a CTA barrier, then one acq_rel ticket per program, orders the partial stores before it
            tl.debug_barrier()
            tile = pid_n * tl.num_programs(0) + pid_m
            ticket = tl.atomic_add(cnt + tile, 1, sem="acq_rel", scope="gpu")
            if ticket == SPLIT - 1:
                tot = tl.zeros([BN, BM], dtype=tl.float32)
                for sp in range(SPLIT):
                    o2 = (sp * M + mcol[None, :]).to(tl.int64) * N + rows[:, None]
                    tot += tl.load(part + o2, mask=pm, other=0.0, cache_modifier=".cg")
                _epilogue(tot, rows, rmask, mcol, mmask, bias, resid, out, stride_rm, stride_om,
                          HAS_BIAS, HAS_RESID)
                tl.atomic_xchg(cnt + tile, 0)                          # ready for the next launch (graph replays)


# ---------------------------------------------------------------- configs

# "<type> <N>x<K> m<bucket>" -> [BN, BM, BK, SPLIT, num_warps, num_stages], measured on the H200
# by minfer/bench/qgemm_sweep.py; shapes not listed take default_config.
_CONFIG_FILE = os.path.join(os.path.dirname(__file__), "qgemm_repack_h200.json")
_TARGET_PROGRAMS = 132 * 2            # two programs per H200 SM before K is split
H200_CONFIGS = load_configs(_CONFIG_FILE)


def m_bucket(m: int) -> int:
    """The config table's M key: the next of 16, 32, 64, 128, 256."""
    for b in (16, 32, 64, 128):
        if m <= b:
            return b
    return 256


def split_for(qtype: int, m: int, n: int, k: int, bn: int, bm: int, bk: int,
              target: int = _TARGET_PROGRAMS) -> int:
    """K splits so that row tiles x M tiles x splits reaches ~target programs (at most 16, at
    least two K steps of BK values each)."""
    tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
    if tiles >= target:
        return 1
    return max(1, min(k // (2 * bk), triton.cdiv(target, tiles), 16))


def default_config(qtype: int, m: int, n: int, k: int) -> tuple:
    """[BN, BM, BK, SPLIT, num_warps, num_stages] for a shape the table lacks: all batch rows in
    one M tile (each M tile decodes the weights again), 128 weight rows per program (every
    program reads all of x from L2: x bytes per weight byte = 2M / (0.5625 BN) for Q4_K, so a
    wider row tile keeps that traffic below the HBM stream's at M <= 64), 8 warps from M = 32.
    From compiling for sm_90 on the CPU (no GPU run yet): 128-250 registers without spills,
    54-150 KB of shared memory (the x tiles, BM x BK bf16 per stage, are most of it); 6.5-7.6
    SASS instructions per Q4_K value in the loop, ~10.5 per Q6_K."""
    bm = m_bucket(m)
    bn, bk, warps, stages = {16: (128, 128, 4, 4), 32: (128, 256, 8, 3), 64: (128, 128, 8, 4),
                             128: (128, 128, 8, 3), 256: (128, 128, 8, 2)}[bm]
    return bn, bm, bk, split_for(qtype, m, n, k, bn, bm, bk), warps, stages


def config_for(qtype: int, m: int, n: int, k: int, interpret: bool = False) -> tuple:
    if interpret:   # few, large programs: the interpreter's cost is per operation, not per value
        return (32, min(m_bucket(m), 64), 512, 1, 4, 1)
    hit = H200_CONFIGS.get(f"{REPACKED_TYPES[qtype]} {n}x{k} m{m_bucket(m)}")
    return tuple(hit) if hit else default_config(qtype, m, n, k)


# ---------------------------------------------------------------- wrapper

def _planes4(rw: Repacked) -> tuple:
    if rw.tile_rows:
        raise MinferError("qgemm_repack: the planes are tile-major; this GEMM reads row-major planes")
    p = rw.planes
    return p if len(p) == 4 else (p[0], p[1], p[2], p[0])


def qgemm(x: torch.Tensor, rw: Repacked, bias=None, resid=None, out_dtype=None, config=None, ws=None,
          inline_reduce: bool = True, interpret: bool = False) -> torch.Tensor:
    """out (M, N) = x @ W^T [+ bias] [+ resid] for W a repacked Q4_K/Q6_K weight (gemv_repack_layout).

    x (M, K) bf16/fp16 (fp32: exact fp32 weights, IEEE dot; for tests), rows contiguous; bias (N,),
    resid (M, N) added in fp32. config = (BN, BM, BK, SPLIT, num_warps, num_stages) overrides the
    table (sweeps). A split K takes its ticket counters from `ws` (anything with .counters(n) ->
    a zeroed int32 tensor, e.g. gemv_repack.GemvWorkspace: the counters reset themselves, so
    the GEMV and this kernel can share them) or a fresh zeroed buffer."""
    m, k = x.shape
    n = rw.n
    if rw.qtype not in REPACKED_TYPES:
        raise MinferError(f"qgemm_repack: ggml type {rw.qtype} has no repacked planes (Q4_K, Q6_K only)")
    if k != rw.k or x.stride(1) != 1:
        raise MinferError(f"qgemm_repack: x of shape {tuple(x.shape)} (strides {x.stride()}), expected (M, {rw.k}) "
                          f"with contiguous rows")
    if resid is not None and (tuple(resid.shape) != (m, n) or resid.stride(1) != 1):
        raise MinferError(f"qgemm_repack: resid has shape {tuple(resid.shape)}, expected ({m}, {n}) "
                          f"with contiguous rows")
    if bias is not None and tuple(bias.shape) != (n,):
        raise MinferError(f"qgemm_repack: bias has shape {tuple(bias.shape)}, expected ({n},)")
    bn, bm, bk, split, nwarps, stages = tuple(config or config_for(rw.qtype, m, n, k, interpret))
    if bk not in (128, 256, 512):
        raise MinferError(f"qgemm_repack: config K step {bk}, expected 128, 256 or 512")
    nb = k // 256
    nc, cs = nb * 8, bk // 32                                           # chunks per row, per K step
    sps = triton.cdiv(triton.cdiv(nc, max(1, split)), cs)               # whole K steps per split
    split = triton.cdiv(nc, sps * cs)                                   # no empty splits
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    mt = triton.cdiv(m, bm)
    grid = (mt, triton.cdiv(n, bn), split)
    part = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else out
    inline = inline_reduce and split > 1
    cnt = out
    if inline:
        need = grid[0] * grid[1]
        cnt = ws.counters(need) if ws is not None else torch.zeros(need, dtype=torch.int32, device=x.device)
    p0, p1, p2, p3 = _planes4(rw)
    if rw.qtype == Q6_K and p3.data_ptr() % 4:
        p3 = p3.clone()     # d is read as aligned 4-byte words (_d6)
    f32 = x.dtype == torch.float32
    if f32:
        stages = 1          # (tests) fp32 x tiles are twice the size: no multi-stage copies of them
    _qgemm_kernel[grid](p0, p1, p2, p3, x, out, part, cnt, bias if bias is not None else out,
                        resid if resid is not None else out,
                        m, n, nb, x.stride(0), resid.stride(0) if resid is not None else 0, out.stride(0), sps, split,
                        0x3F800000,
                        QT=rw.qtype, BN=bn, BM=bm, BK=bk, EVEN_K=nc % cs == 0, IS_SPLIT=split > 1,
                        INLINE_REDUCE=inline, HAS_BIAS=bias is not None, HAS_RESID=resid is not None,
                        EVICT="evict_first" if mt == 1 else "",
                        DOT_F32=interpret and x.dtype == torch.bfloat16, IEEE=f32, INTERP=interpret,
                        num_warps=nwarps, num_stages=stages)
    if split > 1 and not inline:
        blk = 64 if interpret else 1024
        _reduce_kernel[(triton.cdiv(n, blk), m)](part, bias if bias is not None else part,
                                                 resid if resid is not None else part, out, m, n, split,
                                                 resid.stride(0) if resid is not None else 0, out.stride(0),
                                                 HAS_BIAS=bias is not None, HAS_RESID=resid is not None,
                                                 BLOCK=blk, num_warps=4)
    return out
