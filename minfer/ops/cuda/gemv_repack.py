"""Decode GEMV over Q4_K / Q6_K weights repacked once at load (issue 12), and their dequant.

The raw ggml blocks interleave nibbles, 6-bit scales and f16 factors in 144/210-byte blocks,
so a GEMV over them does byte loads and bit surgery per value (dequant.decode: ~576 GB/s on
the H200). gemv_repack_layout.py rewrites each weight once into planes made for this kernel
(drawn there): a chunk of 32 values of one sub-block is one 16-byte load, its scales a few
bytes beside it. Only Q4_K and Q6_K are repacked (`is_repacked_type`); every other type keeps
the raw GEMV, and the caller counts the two paths apart.

Decode of a value without an int->float convert (I2F runs at a quarter rate on the H200):
- ASM (GPU): two values per and-or: a word's nibble pair (j, j+4) or-ed into two fp16 1024 +
  64q (Q6_K 1024 + 16q), converted by the half-to-float add (full rate). Inline PTX.
- portable (interpreter, and ASM=False): one value per shift + and-or into an fp32 1 + q/16
  (Q6_K 1 + q/64); the magic 0x3F800000 comes as a runtime argument (one LOP3).
Either way f = OFF + step*q, so per chunk S = sum f*x and xs = sum x give sum q*x, and a chunk
costs 32 FMAs plus one scale step: out += A*S - B*xs (A, B from d, sc, dmin, m).
M = 1: CUDA cores. 2 <= M <= 64: the same decode, the [BN, 4*C] tile per nibble position
goes through tl.dot against x^T.
Split K: partials (SPLIT, M, N) fp32; the program that finishes a row tile last (an atomic
ticket) sums them in split order (deterministic) and runs the epilogue, so a GEMV is one
launch; inline_reduce=False uses a second kernel instead.
Fusions (constexpr): RMSNorm of x while loading it (each program computes its rows' rstd; x
is tiny), silu(gate) * up as the input (the down projection), bias and residual in the epilogue.
"""

from __future__ import annotations

import json
import os

import torch
import triton
import triton.language as tl

from minfer.errors import MinferError
from minfer.ops.cuda.gemv_repack_layout import (  # noqa: F401  (the layout's API, re-exported)
    PLANE_NAMES, Q4_K, Q6_K, REPACKED_BLOCK_BYTES, REPACKED_TYPES, Repacked, check_repacked, dequantize_planes,
    is_repacked_type, planes_of, reference_gemv, repack, repack_model, repack_weight)

# ---------------------------------------------------------------- value decode

# word w -> 8 fp32 values 1024 + 64 * nibble p (outputs in p order): per pair (j, j+4) one
# shift and one lop3 ((a & b) | c = 0xEA) put both nibbles at bits 6..9 of the two fp16 halves
_ASM_Q4 = tl.constexpr("""{
.reg .b32 t<4>;
.reg .b16 h<8>;
shl.b32 t0, $8, 6;
shl.b32 t1, $8, 2;
shr.u32 t2, $8, 2;
shr.u32 t3, $8, 6;
lop3.b32 t0, t0, 0x03C003C0, 0x64006400, 0xEA;
lop3.b32 t1, t1, 0x03C003C0, 0x64006400, 0xEA;
lop3.b32 t2, t2, 0x03C003C0, 0x64006400, 0xEA;
lop3.b32 t3, t3, 0x03C003C0, 0x64006400, 0xEA;
mov.b32 {h0, h4}, t0;
mov.b32 {h1, h5}, t1;
mov.b32 {h2, h6}, t2;
mov.b32 {h3, h7}, t3;
cvt.f32.f16 $0, h0;
cvt.f32.f16 $1, h1;
cvt.f32.f16 $2, h2;
cvt.f32.f16 $3, h3;
cvt.f32.f16 $4, h4;
cvt.f32.f16 $5, h5;
cvt.f32.f16 $6, h6;
cvt.f32.f16 $7, h7;
}""")

# ql word $8, qh halfword $9 -> 8 fp32 values 1024 + 16 * q6 (q6 = nibble | crumb << 4):
# prmt spreads the halfword's bytes to bits 0..7 and 16..23, so crumbs j and j+4 sit 16 apart
# like nibbles j and j+4; per pair the nibbles go to bits 4..7, the crumbs to bits 8..9
_ASM_Q6 = tl.constexpr("""{
.reg .b32 q, x, t<4>, u<4>;
.reg .b16 h<8>;
prmt.b32 q, $9, 0, 0x4140;
shl.b32 t0, $8, 4;
shr.u32 t2, $8, 4;
shr.u32 t3, $8, 8;
shl.b32 u0, q, 8;
shl.b32 u1, q, 6;
shl.b32 u2, q, 4;
shl.b32 u3, q, 2;
lop3.b32 u0, u0, 0x03000300, 0x64006400, 0xEA;
lop3.b32 u1, u1, 0x03000300, 0x64006400, 0xEA;
lop3.b32 u2, u2, 0x03000300, 0x64006400, 0xEA;
lop3.b32 u3, u3, 0x03000300, 0x64006400, 0xEA;
lop3.b32 t0, t0, 0x00F000F0, u0, 0xEA;
lop3.b32 t1, $8, 0x00F000F0, u1, 0xEA;
lop3.b32 t2, t2, 0x00F000F0, u2, 0xEA;
lop3.b32 t3, t3, 0x00F000F0, u3, 0xEA;
mov.b32 {h0, h4}, t0;
mov.b32 {h1, h5}, t1;
mov.b32 {h2, h6}, t2;
mov.b32 {h3, h7}, t3;
cvt.f32.f16 $0, h0;
cvt.f32.f16 $1, h1;
cvt.f32.f16 $2, h2;
cvt.f32.f16 $3, h3;
cvt.f32.f16 $4, h4;
cvt.f32.f16 $5, h5;
cvt.f32.f16 $6, h6;
cvt.f32.f16 $7, h7;
}""")


@triton.jit
def _f4(w, P: tl.constexpr, magic):
    """Nibble P of int32 words as the fp32 1 + q/16 (q at bits 19..22 under 1.0's exponent)."""
    if P <= 4:
        t = w << (19 - 4 * P)
    else:
        t = w >> (4 * P - 19)
    return ((t & 0x780000) | magic).to(tl.float32, bitcast=True)


@triton.jit
def _f6(w, h, P: tl.constexpr, magic):
    """Q6_K value P (nibble P of w, crumb P of h) as the fp32 1 + q/64 (q at bits 17..22)."""
    if P <= 4:
        t = w << (17 - 4 * P)
    else:
        t = w >> (4 * P - 17)
    u = h << (21 - 2 * P)
    return ((t & 0x1E0000) | (u & 0x600000) | magic).to(tl.float32, bitcast=True)


@triton.jit
def _decode8(wq, hq, magic, QT: tl.constexpr, ASM: tl.constexpr):
    """The 8 values of each word as fp32 f = OFF + step*q: ASM 1024 + 64q (Q6_K 1024 + 16q),
    portable 1 + q/16 (Q6_K 1 + q/64). A tuple indexed by nibble position."""
    if ASM:
        if QT == 12:
            return tl.inline_asm_elementwise(_ASM_Q4, "=f,=f,=f,=f,=f,=f,=f,=f,r", [wq],
                                             dtype=(tl.float32,) * 8, is_pure=True, pack=1)
        else:
            return tl.inline_asm_elementwise(_ASM_Q6, "=f,=f,=f,=f,=f,=f,=f,=f,r,r", [wq, hq],
                                             dtype=(tl.float32,) * 8, is_pure=True, pack=1)
    elif QT == 12:
        return (_f4(wq, 0, magic), _f4(wq, 1, magic), _f4(wq, 2, magic), _f4(wq, 3, magic),
                _f4(wq, 4, magic), _f4(wq, 5, magic), _f4(wq, 6, magic), _f4(wq, 7, magic))
    else:
        return (_f6(wq, hq, 0, magic), _f6(wq, hq, 1, magic), _f6(wq, hq, 2, magic), _f6(wq, hq, 3, magic),
                _f6(wq, hq, 4, magic), _f6(wq, hq, 5, magic), _f6(wq, hq, 6, magic), _f6(wq, hq, 7, magic))


@triton.jit
def _tile_loads(p0, p1, p2, p3, row2, blk, b_hi, NB, w4, ci, BN: tl.constexpr, C: tl.constexpr,
                QT: tl.constexpr, TM: tl.constexpr = 0):
    """The raw words of one iteration's tile (blocks blk.. of BN rows; nothing past b_hi):
    quants [BN, C, 4] (and Q6_K's high bits), and the scale words [BN, C] (Q4_K: sc|m<<8 and
    d|dmin<<16; Q6_K: the scale pair and d). Streamed once: evict-first. TM: tile-major planes
    in TM-row tiles (gemv_repack_layout.to_tiles): block b of row r is the planes' per-block
    entry ((r // TM) * NB + b) * TM + r % TM."""
    kc = blk * 8 + ci
    kmask = (kc < b_hi * 8)[None, :]
    if TM:
        rt = (row2 // TM) * NB
        ri = row2 % TM
        qoff = (rt + blk + (w4 // 32)[None, :]) * (TM * 32) + ri * 32 + (w4 % 32)[None, :]
        ec = (rt + (kc // 8)[None, :]) * TM + ri                       # [BN, C]: the chunks' entries
        soff = ec * 8 + (kc % 8)[None, :]
        doff = ec
    else:
        qoff = row2 * (NB * 32) + blk * 32 + w4[None, :]              # [BN, 4C]: 16-byte chunks
        soff = row2 * (NB * 8) + kc[None, :]
        doff = row2 * NB + (kc // 8)[None, :]
    km4 = (blk * 32 + w4 < b_hi * 32)[None, :]
    wq = tl.reshape(tl.load(p0 + qoff, mask=km4, other=0, eviction_policy="evict_first"), (BN, C, 4))
    if QT == 12:
        hq = wq
        sa = tl.load(p1 + soff, mask=kmask, other=0, eviction_policy="evict_first")
        sb = tl.load(p2.to(tl.pointer_type(tl.int32)) + doff, mask=kmask, other=0, eviction_policy="evict_first")
    else:
        hq = tl.reshape(tl.load(p1 + qoff, mask=km4, other=0, eviction_policy="evict_first"), (BN, C, 4))
        # the int8 scales 2c, 2c+1 of chunk c as one little-endian int16
        sa = tl.load(p2.to(tl.pointer_type(tl.int16)) + soff, mask=kmask, other=0, eviction_policy="evict_first")
        sb = tl.load(p3 + doff, mask=kmask, other=0.0, eviction_policy="evict_first")
    return wq, hq, sa, sb


@triton.jit
def _chunk_scales(sa, sb, QT: tl.constexpr, ASM: tl.constexpr):
    """Per (row, chunk) [BN, C]: (a0, m0, a1, m1), the chunk's values being w = a * (f - OFF) - m
    (Q6_K: values 0..15 use a0, 16..31 a1, m = 0; f and OFF as in _decode8)."""
    if QT == 12:
        scm = sa.to(tl.int32)
        d = (sb & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        dmin = (sb >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        ml = dmin * ((scm >> 8) & 255).to(tl.float32)
        # dl q - ml with q = (f - 1024) / 64 (ASM) or 16 (f - 1)
        a = d * (scm & 255).to(tl.float32) * (0.015625 if ASM else 16.0)
        return a, ml, a, ml
    else:
        s2 = sa.to(tl.int32)
        d = sb.to(tl.float32)
        # dl (q - 32) with q - 32 = (f - 1536) / 16 (ASM) or 64 (f - 1.5)
        st = 0.0625 if ASM else 64.0
        a0 = d * ((s2 << 24) >> 24).to(tl.float32) * st
        a1 = d * (s2 >> 8).to(tl.float32) * st
        return a0, tl.zeros_like(a0), a1, tl.zeros_like(a0)


@triton.jit
def _load_x(x, up, nw, xrow, k, kmask, rstd, NORM: tl.constexpr, SWIGLU: tl.constexpr):
    """Activations at offsets xrow + k as fp32: x, or silu(x) * up; times rstd * nw[k] if NORM."""
    v = tl.load(x + xrow + k, mask=kmask, other=0.0).to(tl.float32)
    if SWIGLU:
        u = tl.load(up + xrow + k, mask=kmask, other=0.0).to(tl.float32)
        v = v / (1.0 + tl.exp(-v)) * u
    if NORM:
        v = v * rstd * tl.load(nw + k, mask=kmask, other=0.0).to(tl.float32)
    return v


@triton.jit
def _finish(v, rows, rmask, mcol, mmask, bias, resid, out, stride_rm, stride_om,
            HAS_BIAS: tl.constexpr, HAS_RESID: tl.constexpr):
    """Epilogue on a [BN, MC] fp32 tile: + bias[n] + resid[m, n], stored to out[m, n]."""
    if HAS_BIAS:
        v += tl.load(bias + rows, mask=rmask, other=0.0).to(tl.float32)[:, None]
    m2 = rmask[:, None] & mmask[None, :]
    if HAS_RESID:
        v += tl.load(resid + mcol[None, :].to(tl.int64) * stride_rm + rows[:, None], mask=m2, other=0.0).to(tl.float32)
    tl.store(out + mcol[None, :].to(tl.int64) * stride_om + rows[:, None], v.to(out.dtype.element_ty), mask=m2)


@triton.jit
def _gemv_kernel(p0, p1, p2, p3, x, up, nw, resid, bias, out, part, cnt,
                 M, N, NB, eps, magic, stride_xm, stride_rm, stride_om, blocks_per_split, SPLIT,
                 QT: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr, MP: tl.constexpr,
                 IS_SPLIT: tl.constexpr, USE_DOT: tl.constexpr, NORM: tl.constexpr, SWIGLU: tl.constexpr,
                 HAS_BIAS: tl.constexpr, HAS_RESID: tl.constexpr, INLINE_REDUCE: tl.constexpr,
                 IEEE: tl.constexpr, ASM: tl.constexpr, PREFETCH: tl.constexpr, NORM_BLK: tl.constexpr,
                 TM: tl.constexpr = 0):
    """out (M, N) = xin (M, K) @ W^T [+ bias] [+ resid]; program = (row tile, K split, M tile).

    Per iteration a [BN rows, C = 8*BB chunks, 4 words] tile: BB blocks of 256 values per row,
    loaded as [BN, 4C] words (consecutive threads on consecutive 16-byte chunks of a row)."""
    C: tl.constexpr = BB * 8
    # f = OFF + q * step (see _decode8); Q6_K's -32 folded in: (q - 32) * step = f - OFF
    OFF: tl.constexpr = (1024.0 if QT == 12 else 1536.0) if ASM else (1.0 if QT == 12 else 1.5)
    K = NB * 256
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_n * BN + tl.arange(0, BN)
    rmask = rows < N
    # rows past N read row N-1 (valid memory, no mask on the hot loads) and are never stored
    row2 = tl.minimum(rows, N - 1).to(tl.int64)[:, None]              # [BN, 1]
    ci = tl.arange(0, C)
    wi = tl.arange(0, 4)
    w4 = tl.arange(0, 4 * C)
    b_lo = pid_s * blocks_per_split
    b_hi = tl.minimum(b_lo + blocks_per_split, NB)
    if USE_DOT:
        mcol = pid_m * MP + tl.arange(0, MP)
        mmask = mcol < M
        xrow = tl.minimum(mcol, M - 1).to(tl.int64) * stride_xm       # [MP]
        acc = tl.zeros([BN, MP], dtype=tl.float32)
        rstd = tl.zeros([MP], dtype=tl.float32)
        if NORM:
            ss = tl.zeros([MP, NORM_BLK], dtype=tl.float32)
            for k0 in range(0, K, NORM_BLK):
                kn = k0 + tl.arange(0, NORM_BLK)
                v = _load_x(x, up, nw, xrow[:, None], kn[None, :], (kn < K)[None, :], 1.0, False, SWIGLU)
                ss += v * v
            rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=1) / K + eps)
    else:
        mcol = pid_m + tl.arange(0, 1)
        mmask = mcol < M
        xrow = pid_m.to(tl.int64) * stride_xm
        acc = tl.zeros([BN, C], dtype=tl.float32)
        rstd = 0.0
        if NORM:
            ss = tl.zeros([NORM_BLK], dtype=tl.float32)
            for k0 in range(0, K, NORM_BLK):
                kn = k0 + tl.arange(0, NORM_BLK)
                v = _load_x(x, up, nw, xrow, kn, kn < K, 1.0, False, SWIGLU)
                ss += v * v
            rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
    # register double buffer: the next tile's loads are in flight while this one is computed
    # (PREFETCH; run 2: +0-10% on Q4_K, -15% on Q6_K, whose tiles already hold 224+ registers)
    nxt = _tile_loads(p0, p1, p2, p3, row2, b_lo, b_hi, NB, w4, ci, BN, C, QT, TM)
    for blk in range(b_lo, b_hi, BB):
        if PREFETCH:
            wq, hq, sa, sb = nxt
            nxt = _tile_loads(p0, p1, p2, p3, row2, blk + BB, b_hi, NB, w4, ci, BN, C, QT, TM)
        else:
            wq, hq, sa, sb = _tile_loads(p0, p1, p2, p3, row2, blk, b_hi, NB, w4, ci, BN, C, QT, TM)
        if QT == 14:
            hq = hq.to(tl.int32)
        kc = blk * 8 + ci                                             # [C] chunk index in the row
        kmask = kc < b_hi * 8
        a0, c0, a1, c1 = _chunk_scales(sa, sb, QT, ASM)
        kx = (kc * 32)[:, None] + wi[None, :]                         # [C, 4]: value 4p + w at kx + 4p
        if USE_DOT:
            fs = _decode8(wq, hq, magic, QT, ASM)
            for p in tl.static_range(8):
                if p < 4:
                    wv = a0[:, :, None] * (fs[p] - OFF) - c0[:, :, None]
                else:
                    wv = a1[:, :, None] * (fs[p] - OFF) - c1[:, :, None]
                w2 = tl.reshape(wv, (BN, C * 4)).to(x.dtype.element_ty)
                kk = tl.reshape(kx + 4 * p, (C * 4,))
                km = tl.reshape(kmask[:, None] & (wi < 4)[None, :], (C * 4,))
                xt = _load_x(x, up, nw, xrow[None, :], kk[:, None], km[:, None] & mmask[None, :],
                             rstd[None, :], NORM, SWIGLU).to(x.dtype.element_ty)   # [4C, MP]
                if IEEE:
                    acc += tl.dot(w2, xt, input_precision="ieee")
                else:
                    acc += tl.dot(w2, xt)
        else:
            # xs sums kept in the weight tile's layout ([1, C, 4]): one load of x per value
            s0 = tl.zeros([BN, C, 4], dtype=tl.float32)
            s1 = tl.zeros([BN, C, 4], dtype=tl.float32)
            x0 = tl.zeros([1, C, 4], dtype=tl.float32)
            x1 = tl.zeros([1, C, 4], dtype=tl.float32)
            xo = tl.zeros([1, C, 4], dtype=tl.float32)
            if QT == 12 and not ASM:
                # nibbles 2j+1 and 2j from one shift: at bits 19..22 (1 + q/16) and 15..18
                # (1 + q/256, times 16 x: the same q*x/16 on top of 16 x)
                for j in tl.static_range(4):
                    if j < 2:
                        t = wq << (15 - 8 * j)
                    else:
                        t = wq >> (8 * j - 15)
                    fh = ((t & 0x780000) | magic).to(tl.float32, bitcast=True)
                    fl = ((t & 0x78000) | magic).to(tl.float32, bitcast=True)
                    xh = _load_x(x, up, nw, xrow, kx + 4 * (2 * j + 1), kmask[:, None], rstd, NORM, SWIGLU)[None, :, :]
                    xl = _load_x(x, up, nw, xrow, kx + 4 * (2 * j), kmask[:, None], rstd, NORM, SWIGLU)[None, :, :]
                    xl16 = xl * 16.0
                    s0 += fh * xh                                 # two FMA chains, not mul+fma+add
                    s0 += fl * xl16
                    x0 += xh + xl
                    xo += xh + xl16
            else:
                fs = _decode8(wq, hq, magic, QT, ASM)
                for p in tl.static_range(8):
                    xv = _load_x(x, up, nw, xrow, kx + 4 * p, kmask[:, None], rstd, NORM, SWIGLU)[None, :, :]
                    if p < 4 or QT == 12:
                        s0 += fs[p] * xv
                        x0 += xv
                    else:
                        s1 += fs[p] * xv
                        x1 += xv
                xo = x0 * OFF
            # sum over the chunk of w*x = a * (S - OFF * xs) - m * xs
            if QT == 12:
                acc += a0 * (tl.sum(s0, axis=2) - tl.sum(xo, axis=2)) - c0 * tl.sum(x0, axis=2)
            else:
                acc += a0 * (tl.sum(s0, axis=2) - tl.sum(xo, axis=2))
                acc += a1 * (tl.sum(s1, axis=2) - OFF * tl.sum(x1, axis=2))
    if USE_DOT:
        res = acc                                                     # [BN, MP]
    else:
        res = tl.sum(acc, axis=1)[:, None]                            # [BN, 1]
    if not IS_SPLIT:
        _finish(res, rows, rmask, mcol, mmask, bias, resid, out, stride_rm, stride_om, HAS_BIAS, HAS_RESID)
    else:
        poff = (pid_s * M + mcol[None, :]).to(tl.int64) * N + rows[:, None]
        pm = rmask[:, None] & mmask[None, :]
        tl.store(part + poff, res, mask=pm)
        if INLINE_REDUCE:
            # the last split of this tile to finish sums all partials in split order (deterministic);
            # a CTA barrier, then one acq_rel ticket per program, orders the partial stores before it
            tl.debug_barrier()
            tile = pid_m * tl.num_programs(0) + pid_n
            ticket = tl.atomic_add(cnt + tile, 1, sem="acq_rel", scope="gpu")
            if ticket == SPLIT - 1:
                tot = tl.zeros(res.shape, dtype=tl.float32)
                for sp in range(SPLIT):
                    o2 = (sp * M + mcol[None, :]).to(tl.int64) * N + rows[:, None]
                    tot += tl.load(part + o2, mask=pm, other=0.0, cache_modifier=".cg")
                _finish(tot, rows, rmask, mcol, mmask, bias, resid, out, stride_rm, stride_om, HAS_BIAS, HAS_RESID)
                tl.atomic_xchg(cnt + tile, 0)                         # ready for the next launch (graph replays)


@triton.jit
def _reduce_kernel(part, bias, resid, out, M, N, SPLIT, stride_rm, stride_om,
                   HAS_BIAS: tl.constexpr, HAS_RESID: tl.constexpr, BLOCK: tl.constexpr):
    """out[m, n] = sum over splits of part (SPLIT, M, N) [+ bias] [+ resid] (inline_reduce off)."""
    m = tl.program_id(1)
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    nm = n < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for sp in range(SPLIT):
        acc += tl.load(part + (sp * M + m).to(tl.int64) * N + n, mask=nm, other=0.0)
    mc = m + tl.arange(0, 1)
    _finish(acc[:, None], n, nm, mc, mc < M, bias, resid, out, stride_rm, stride_om, HAS_BIAS, HAS_RESID)


@triton.jit
def _dequant_kernel(p0, p1, p2, p3, out, N, NB, stride_o, QT: tl.constexpr, BR: tl.constexpr, BB: tl.constexpr,
                    TM: tl.constexpr = 0):
    """out[n, k] = the exact value (fp32 math in ggml's order, cast to out's dtype); BR rows x BB
    blocks. TM: tile-major planes (_tile_loads)."""
    C: tl.constexpr = BB * 8
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    rmask = rows < N
    row2 = tl.minimum(rows, N - 1).to(tl.int64)[:, None]
    kc = tl.program_id(1) * C + tl.arange(0, C)
    kmask = kc < NB * 8
    w4 = tl.arange(0, 4 * C)
    blk = (kc // 8)[None, :]
    if TM:
        rt = (row2 // TM) * NB
        ri = row2 % TM
        qoff = (rt + tl.program_id(1) * BB + (w4 // 32)[None, :]) * (TM * 32) + ri * 32 + (w4 % 32)[None, :]
        ent = (rt + blk) * TM + ri                                     # [BR, C]: the chunks' block entries
        soff = ent * 8 + (kc % 8)[None, :]
    else:
        qoff = row2 * (NB * 32) + tl.program_id(1) * (C * 4) + w4[None, :]
        ent = row2 * NB + blk
        soff = row2 * (NB * 8) + kc[None, :]
    km4 = (tl.program_id(1) * (C * 4) + w4 < NB * 32)[None, :]
    wq = tl.reshape(tl.load(p0 + qoff, mask=km4, other=0, eviction_policy="evict_first"), (BR, C, 4))
    km2 = kmask[None, :]
    if QT == 12:
        scm = tl.load(p1 + soff, mask=km2, other=0).to(tl.int32)
        d = tl.load(p2 + 2 * ent, mask=km2, other=0.0).to(tl.float32)
        dmin = tl.load(p2 + 2 * ent + 1, mask=km2, other=0.0).to(tl.float32)
        dl = (d * (scm & 255).to(tl.float32))[:, :, None]             # exact: 11 x 6 bits
        ml = (dmin * ((scm >> 8) & 255).to(tl.float32))[:, :, None]
    else:
        hq = tl.reshape(tl.load(p1 + qoff, mask=km4, other=0, eviction_policy="evict_first"), (BR, C, 4)).to(tl.int32)
        s2 = tl.load(p2.to(tl.pointer_type(tl.int16)) + soff, mask=km2, other=0).to(tl.int32)
        d = tl.load(p3 + ent, mask=km2, other=0.0).to(tl.float32)
        dl0 = (d * ((s2 << 24) >> 24).to(tl.float32))[:, :, None]
        dl1 = (d * (s2 >> 8).to(tl.float32))[:, :, None]
    # [BR, C, 8, 4]: nibble p of word w is value 4p + w, so the broadcast over p followed by
    # a reshape gives each thread its chunk's 32 values in order (16-byte stores)
    sh = (tl.arange(0, 8) * 4)[None, None, :, None]
    if QT == 12:
        q = (wq[:, :, None, :] >> sh) & 15
        # exact int -> float: q under the exponent of 2^23, minus 2^23; dl*q is exact, so
        # an fma(dl, q, -ml) rounds once like ggml's multiply-then-subtract
        v = ((q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0) * dl[:, :, :, None] - ml[:, :, :, None]
    else:
        q = ((wq[:, :, None, :] >> sh) & 15) | (((hq[:, :, None, :] >> (sh // 2)) & 3) << 4)
        qf = (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388640.0   # 2^23 + 32: q - 32, exact
        half = (tl.arange(0, 8) < 4)[None, None, :, None]
        v = qf * tl.where(half, dl0[:, :, :, None], dl1[:, :, :, None])
    v2 = tl.reshape(v, (BR, C * 32))
    k2 = tl.program_id(1) * (C * 32) + tl.arange(0, C * 32)
    tl.store(out + row2 * stride_o + k2[None, :], v2.to(out.dtype.element_ty),
             mask=rmask[:, None] & (k2 < NB * 256)[None, :])


# ---------------------------------------------------------------- configs and wrappers

# H200 configs from minfer.bench.gemv_sweep, kept as data: "<type> <N>x<K> m<bucket>" ->
# [BN, BB, SPLIT, num_warps, asm, prefetch]; shapes not listed use default_config.
_CONFIG_FILE = os.path.join(os.path.dirname(__file__), "gemv_repack_h200.json")


def load_configs(path: str = _CONFIG_FILE) -> dict:
    try:
        with open(path) as f:
            return {k: tuple(v) for k, v in json.load(f).get("configs", {}).items()}
    except FileNotFoundError:
        return {}


H200_CONFIGS = load_configs()
_TARGET_PROGRAMS = 132 * 4        # a few programs per H200 SM, so that loads from several are in flight


def m_bucket(m: int) -> int:
    """1 (CUDA cores) or the tl.dot column tile MP (16, 32, 64) for m rows."""
    return 1 if m == 1 else 16 if m <= 16 else 32 if m <= 32 else 64


def default_config(qtype, m, n, k):
    """(BN, BB, SPLIT, num_warps, asm, prefetch) for shapes the table lacks: the H200 runs'
    winners' shape (BN 128 / 64 rows, one block per iteration, 4 warps; portable decode and
    prefetch for Q4_K, inline PTX without prefetch for Q6_K), split K to ~4 programs per SM."""
    nb = k // 256
    q4 = qtype == Q4_K
    bn, bb, w = (128 if q4 else 64, 1, 4) if m == 1 else (64, 1, 4)
    tiles = triton.cdiv(n, bn) * triton.cdiv(m, m_bucket(m))
    split = 1 if tiles >= _TARGET_PROGRAMS else min(triton.cdiv(nb, bb), triton.cdiv(_TARGET_PROGRAMS, tiles), 32)
    return bn, bb, split, w, not (q4 and m == 1), q4


def config_for(qtype: int, m: int, n: int, k: int, interpret: bool = False) -> tuple:
    """(BN, BB, SPLIT, num_warps, asm, prefetch) for this shape: the H200 table, else the default rule."""
    if interpret:   # few, large programs: the interpreter's cost is per operation, not per value
        return (64, 2, 1, 4, False, True)
    hit = H200_CONFIGS.get(f"{REPACKED_TYPES[qtype]} {n}x{k} m{m_bucket(m)}")
    return tuple(hit) if hit else default_config(qtype, m, n, k)


class GemvWorkspace:
    """Split-K ticket counters (int32; zero between launches: the last program of a tile resets
    its own), owned by the caller so CUDA-graph replays find them in place."""

    def __init__(self, device, n_counters: int = 1 << 14):
        from minfer.ops.cuda.l2_prefetch import L2Plan

        self.cnt = torch.zeros(n_counters, dtype=torch.int32, device=device)
        self.l2 = L2Plan()          # the one-row decode's launch order and L2 prefetch ranges

    def counters(self, need: int) -> torch.Tensor:
        if self.cnt.numel() < need:
            self.cnt = torch.zeros(need, dtype=torch.int32, device=self.cnt.device)
        return self.cnt


def _planes4(rw: Repacked) -> tuple:
    """The four plane arguments (Q4_K's third repeats the first), either layout (the kernels' TM)."""
    p = rw.planes
    return p if len(p) == 4 else (p[0], p[1], p[2], p[0])


def splits(nb: int, split: int, bb: int) -> tuple:
    """(blocks_per_split, split): the K blocks a split takes (whole iterations of BB blocks) for a
    config's SPLIT over nb blocks, and the splits that leaves (no empty split; the grid's second
    dimension). gemv_q8 and its Gluon kernel split the same way."""
    bps = triton.cdiv(triton.cdiv(nb, max(1, split)), bb) * bb
    return bps, triton.cdiv(nb, bps)


def gemv(x: torch.Tensor, rw: Repacked, bias=None, resid=None, norm_weight=None, eps: float = 1e-6, up=None,
         out_dtype=None, config=None, ws: GemvWorkspace | None = None, inline_reduce: bool = True,
         asm: bool | None = None, interpret: bool = False) -> torch.Tensor:
    """out (M, N) = xin @ W^T [+ bias] [+ resid] with W the repacked weight, in one launch.

    x (M, K) float, rows contiguous. xin = x, or silu(x) * up when `up` (M, K) is given (the
    down projection's SwiGLU); then rms_norm(xin) * norm_weight when norm_weight (K,) is given
    (reference.rms_norm's formula, fp32). bias (N,) and resid (M, N) are added in fp32.
    config = (BN, BB, SPLIT, num_warps[, asm, prefetch]) overrides the table (sweeps). A split
    K uses `ws`'s counters (a fresh zeroed buffer when None); inline_reduce=False reduces in a
    second kernel. asm: force the inline-PTX decode on/off (default: the config's)."""
    m, k = x.shape
    n = rw.n
    if k != rw.k or x.stride(1) != 1:
        raise MinferError(f"gemv_repack: x of shape {tuple(x.shape)} (strides {x.stride()}), expected (M, {rw.k}) "
                          f"with contiguous rows")
    if up is not None and (up.shape != x.shape or up.stride() != x.stride()):
        raise MinferError(f"gemv_repack: up has shape {tuple(up.shape)} strides {up.stride()}, expected x's "
                          f"{tuple(x.shape)} {x.stride()}")
    if resid is not None and (tuple(resid.shape) != (m, n) or resid.stride(1) != 1):
        raise MinferError(f"gemv_repack: resid has shape {tuple(resid.shape)}, expected ({m}, {n}) with contiguous rows")
    cfg = tuple(config or config_for(rw.qtype, m, n, k, interpret))
    if len(cfg) == 4:                                                   # (BN, BB, SPLIT, warps): decode defaults
        cfg = cfg + config_for(rw.qtype, m, n, k, interpret)[4:]
    bn, bb, split, nwarps, cfg_asm, prefetch = cfg
    if interpret:
        cfg_asm = False                                                 # the interpreter cannot run inline PTX
    nb = k // 256
    use_dot = m > 1
    mp = m_bucket(m) if use_dot else 1
    bps, split = splits(nb, split, bb)
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    part = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else out
    grid = (triton.cdiv(n, bn), split, triton.cdiv(m, mp) if use_dot else m)
    inline = inline_reduce and split > 1
    cnt = out
    if inline:
        need = grid[0] * grid[2]
        cnt = ws.counters(need) if ws is not None else torch.zeros(need, dtype=torch.int32, device=x.device)
    p0, p1, p2, p3 = _planes4(rw)
    _gemv_kernel[grid](p0, p1, p2, p3, x, up if up is not None else x,
                       norm_weight if norm_weight is not None else x,
                       resid if resid is not None else out, bias if bias is not None else out, out, part, cnt,
                       m, n, nb, eps, 0x3F800000, x.stride(0), resid.stride(0) if resid is not None else 0,
                       out.stride(0), bps, split,
                       QT=rw.qtype, BN=bn, BB=bb, MP=mp, IS_SPLIT=split > 1, USE_DOT=use_dot,
                       NORM=norm_weight is not None, SWIGLU=up is not None, HAS_BIAS=bias is not None,
                       HAS_RESID=resid is not None, INLINE_REDUCE=inline, IEEE=x.dtype == torch.float32,
                       ASM=cfg_asm if asm is None else asm, PREFETCH=prefetch,
                       NORM_BLK=64 if interpret else (256 if use_dot else 1024), TM=rw.tile_rows, num_warps=nwarps,
                       num_stages=1 if use_dot and x.dtype == torch.float32 else 3)
    if split > 1 and not inline:
        blk = 64 if interpret else 1024
        _reduce_kernel[(triton.cdiv(n, blk), m)](part, bias if bias is not None else part,
                                                 resid if resid is not None else part, out, m, n, split,
                                                 resid.stride(0) if resid is not None else 0, out.stride(0),
                                                 HAS_BIAS=bias is not None, HAS_RESID=resid is not None,
                                                 BLOCK=blk, num_warps=4)
    return out


def dequantize_into(rw: Repacked, out: torch.Tensor, interpret: bool = False, tile=None, num_warps: int = 4):
    """out (N, >= K) float <- the exact values of the repacked weight (the prefill's dequantize
    + cuBLAS reads the planes; bit-exact against minfer.quants in fp32). tile = (rows, blocks)."""
    br, bb = tile or ((4, 1) if interpret else (8, 1))
    nb = rw.k // 256
    if out.shape[0] < rw.n or out.shape[1] < rw.k or out.stride(1) != 1:
        raise MinferError(f"gemv_repack: dequantize_into out has shape {tuple(out.shape)}, expected ({rw.n}, >= {rw.k})")
    p0, p1, p2, p3 = _planes4(rw)
    grid = (triton.cdiv(rw.n, br), triton.cdiv(nb, bb))
    _dequant_kernel[grid](p0, p1, p2, p3, out, rw.n, nb, out.stride(0), QT=rw.qtype, BR=br, BB=bb, TM=rw.tile_rows,
                          num_warps=num_warps)
    return out

