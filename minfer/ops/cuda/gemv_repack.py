"""Decode GEMV over Q4_K / Q6_K weights repacked once at load (issue 12).

The raw ggml blocks interleave nibbles, 6-bit scales and f16 factors in 144/210-byte blocks,
so a GEMV over them does byte loads and bit surgery per value (dequant.decode; ~576 GB/s on
the H200). Here each weight is rewritten once into planes made for the GEMV, keeping every bit
(the planes REPLACE the raw blocks on the GPU; `dequantize_into` gives the prefill its bf16):

  Q4_K (per 256-value block, 148 B instead of 144):
    qs  int32 (N, NB*32)  chunk c = values 32c..32c+31 of the row (one Q4_K sub-block, one
                          scale): 4 words w = 0..3, nibble p = 0..7 of word w holds value
                          32c + 4p + w. A thread loads one chunk as ONE 16-byte load.
    scm int16 (N, NB*8)   sub-block scale | min << 8 (the 6-bit sc and m of get_scale_min_k4,
                          unpacked: 4 bytes more per block than the 12 packed ones)
    dm  f16   (N, NB*2)   d, dmin
  Q6_K (210 B, as raw):
    ql  int32 (N, NB*32)  the low 4 bits, laid out as Q4_K's qs
    qh  int16 (N, NB*32)  chunk c: halfword w, bits 2p..2p+1 = high 2 bits of value 32c+4p+w
    sc  int8  (N, NB*16)  the 16 scales (scale 2c for p < 4, 2c+1 for p >= 4)
    d   f16   (N, NB)

      row n:  | chunk 0 (16 B) | chunk 1 | ... | chunk 8*NB-1 |     (qs / ql)
      chunk:  word0 word1 word2 word3         word w, nibble p -> value 4p + w
              x[4p..4p+3] pairs with nibble p of words 0..3

Exactness: d*sc (f16 x 6-bit, 17 bits) and dmin*m are exact in fp32, so d/dmin stay f16 and
sc/m stay integers (an fp16 d*sc would not be exact); `check_repacked` proves the planes
dequantize bit for bit to minfer.quants' float32 values (= gguf's).

The GEMV (M = 1, CUDA cores): a value becomes a float with one mask-or: the nibble is
shifted under the exponent of 1.0, f = 1 + q/16 (Q6_K: 1 + q/64), no int->float convert
(I2F runs at a quarter rate). Per chunk S = sum f*x and xs = sum x give
sum q*x = 16 (S - xs), so a chunk costs 32 FMAs and one scale step. Small M (2..64): the
same decode, the chunk tile goes through tl.dot against x^T (one dot per nibble position).
Split K: the splits' fp32 partials land in part (SPLIT, M, N); the program that finishes
last (an atomic ticket per tile) sums them in split order (deterministic) and runs the
epilogue, so a GEMV is one launch; INLINE_REDUCE=False uses a separate reduce kernel.

Fusions (optional, constexpr): RMSNorm of x while loading it (norm weight + eps; each program
computes its rows' rstd, x is tiny), silu(gate) * up as the input (the down projection),
bias and a residual added in the epilogue.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from minfer.errors import MinferError

Q4_K, Q6_K = 12, 14                      # ggml type ids (ggml.h enum ggml_type)
REPACKED_TYPES = {Q4_K: "Q4_K", Q6_K: "Q6_K"}
PLANE_NAMES = {Q4_K: ("qs", "scm", "dm"), Q6_K: ("ql", "qh", "sc", "d")}
BLOCK_BYTES = {Q4_K: 144, Q6_K: 210}     # raw bytes per 256 values (ggml-common.h)
REPACKED_BLOCK_BYTES = {Q4_K: 148, Q6_K: 210}


def is_repacked_type(qtype: int) -> bool:
    """True for the types this module repacks (Q4_K, Q6_K); every other type keeps the raw GEMV."""
    return qtype in REPACKED_TYPES


@dataclass
class Repacked:
    """A weight's repacked planes (see the module doc), on the weight's device."""
    qtype: int
    n: int
    k: int
    planes: tuple

    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.planes)


# ---------------------------------------------------------------- repack (torch, any device)

def _pack_words(q: torch.Tensor, bits: int) -> torch.Tensor:
    """q (..., 8 chunks, 32) small ints -> (..., 8, 4) int64: entry [c, w] = OR_p q[c, 4p + w] << bits*p."""
    q = q.to(torch.int64).unflatten(-1, (8, 4))                      # [..., c, p, w]
    sh = (torch.arange(8, device=q.device, dtype=torch.int64) * bits).view(8, 1)
    return (q << sh).sum(-2)


def _wrap(v: torch.Tensor, bits: int, dtype) -> torch.Tensor:
    """Unsigned `bits`-bit values (int64) -> the signed `dtype` with the same bit pattern."""
    return (v - ((v >> (bits - 1)) & 1) * (1 << bits)).to(dtype)


def _repack_rows(raw: torch.Tensor, qtype: int) -> tuple:
    """raw uint8 (R, NB*ts) -> planes for R rows."""
    r = raw.shape[0]
    b = raw.view(r, -1, BLOCK_BYTES[qtype])
    nb = b.shape[1]
    if qtype == Q4_K:
        # ggml-common.h block_q4_K: d f16 | dmin f16 | scales[12] | qs[128];
        # value 64j + 32s + l = nibble s of qs[32j + l]: sub-block 2j + s (ggml-quants.c)
        dm = b[:, :, 0:4].contiguous().view(torch.float16).reshape(r, nb * 2)
        s = b[:, :, 4:16].to(torch.int32)
        a, bb, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
        # get_scale_min_k4 (ggml-quants.c): sub-blocks 0-3 in the low 6 bits of bytes 0-3 / 4-7,
        # 4-7 from the nibbles of bytes 8-11 and the top 2 bits of bytes 0-3 / 4-7
        sc = torch.cat([a & 63, (c & 15) | ((a >> 6) << 4)], -1)
        mn = torch.cat([bb & 63, (c >> 4) | ((bb >> 6) << 4)], -1)
        scm = (sc | (mn << 8)).to(torch.int16).reshape(r, nb * 8)
        qs = b[:, :, 16:144].view(r, nb, 4, 1, 32)
        q = torch.cat([qs & 15, qs >> 4], 3).reshape(r, nb, 8, 32)      # [sub-block 2j+s, l]
        words = _wrap(_pack_words(q, 4), 32, torch.int32).reshape(r, nb * 32)
        return words, scm, dm
    # ggml-common.h block_q6_K: ql[128] | qh[64] | scales int8[16] | d f16;
    # value 128h + 32g + l: low 4 bits = nibble g//2 of ql[64h + 32(g%2) + l],
    # high 2 bits = bits 2g.. of qh[32h + l]  (ggml-quants.c dequantize_row_q6_K)
    ql = b[:, :, 0:128].view(r, nb, 2, 2, 32)                           # [h, g%2, l]
    # nibble g//2 of the byte: stacking it before the g%2 axis orders chunks as 4h + g
    low = torch.stack([ql & 15, ql >> 4], 3).reshape(r, nb, 8, 32)       # [4h + g, l]
    qh = b[:, :, 128:192].view(r, nb, 2, 1, 32)
    sh = torch.arange(4, device=raw.device, dtype=torch.uint8).view(1, 1, 1, 4, 1) * 2
    high = ((qh >> sh) & 3).reshape(r, nb, 8, 32)
    words = _wrap(_pack_words(low, 4), 32, torch.int32).reshape(r, nb * 32)
    halves = _wrap(_pack_words(high, 2), 16, torch.int16).reshape(r, nb * 32)
    sc = b[:, :, 192:208].contiguous().view(torch.int8).reshape(r, nb * 16)
    d = b[:, :, 208:210].contiguous().view(torch.float16).reshape(r, nb)
    return words, halves, sc, d


def repack(raw: torch.Tensor, qtype: int, n: int, k: int, rows_per_step: int = 4096) -> Repacked:
    """Raw blocks uint8 (n, k/256 * block bytes) -> Repacked, on raw's device (row chunks keep
    the int64 temporaries small: ~64 bytes per value of a chunk)."""
    if qtype not in REPACKED_TYPES:
        raise MinferError(f"gemv_repack: ggml type {qtype} is not repacked (only {sorted(REPACKED_TYPES.values())})")
    if k % 256 or tuple(raw.shape) != (n, k // 256 * BLOCK_BYTES[qtype]) or raw.dtype != torch.uint8:
        raise MinferError(f"gemv_repack: raw {REPACKED_TYPES[qtype]} blocks of shape {tuple(raw.shape)} "
                          f"{raw.dtype}, expected uint8 ({n}, {k // 256 * BLOCK_BYTES[qtype]}) with k % 256 == 0")
    parts = [_repack_rows(raw[r0:r0 + rows_per_step], qtype) for r0 in range(0, n, rows_per_step)]
    planes = tuple(torch.cat([p[i] for p in parts]) if len(parts) > 1 else parts[0][i].contiguous()
                   for i in range(len(parts[0])))
    return Repacked(qtype, n, k, planes)


# ---------------------------------------------------------------- CPU decode of the planes + validator

def dequantize_planes(rw: Repacked) -> np.ndarray:
    """float32 (n, k) from the planes alone, in ggml's operation order ((d*sc)*q - dmin*m)."""
    p = [t.cpu().numpy() for t in rw.planes]
    n, nb = rw.n, rw.k // 256
    sh = np.arange(8, dtype=np.int64).reshape(1, 1, 8, 1)
    if rw.qtype == Q4_K:
        words, scm, dm = p
        w = words.view(np.uint32).astype(np.int64).reshape(n, nb * 8, 1, 4)
        q = ((w >> (4 * sh)) & 15).reshape(n, nb * 8, 32)                # value 4p + w of each chunk
        scm = scm.view(np.uint16).reshape(n, nb * 8, 1)
        dm = dm.astype(np.float32).reshape(n, nb, 1, 2)
        d, dmin = dm[..., 0], dm[..., 1]                                 # (n, nb, 1)
        dl = (d * (scm & 255).astype(np.float32).reshape(n, nb, 8)).reshape(n, nb * 8, 1)
        ml = (dmin * (scm >> 8).astype(np.float32).reshape(n, nb, 8)).reshape(n, nb * 8, 1)
        out = q.astype(np.float32) * dl
        out -= ml
        return out.reshape(n, rw.k)
    words, halves, sc, d = p
    w = words.view(np.uint32).astype(np.int64).reshape(n, nb * 8, 1, 4)
    h = halves.view(np.uint16).astype(np.int64).reshape(n, nb * 8, 1, 4)
    q = (((w >> (4 * sh)) & 15) | (((h >> (2 * sh)) & 3) << 4)).reshape(n, nb * 16, 16) - 32
    dl = (d.astype(np.float32).reshape(n, nb, 1) * sc.astype(np.float32).reshape(n, nb, 16)).reshape(n, nb * 16, 1)
    return (q.astype(np.float32) * dl).reshape(n, rw.k)


def check_repacked(raw, planes, qtype: int, name: str = "weight") -> None:
    """Byte-exact validator: the planes (a Repacked or its tuple) must dequantize to exactly
    the float32 bits minfer.quants gives for the raw blocks. MinferError naming the first bad
    row/column otherwise."""
    from minfer.quants import dequantize

    raw_np = raw.cpu().numpy() if isinstance(raw, torch.Tensor) else np.asarray(raw)
    n = raw_np.shape[0]
    k = raw_np.shape[1] // BLOCK_BYTES[qtype] * 256
    rw = planes if isinstance(planes, Repacked) else Repacked(qtype, n, k, tuple(planes))
    want_shapes = _plane_shapes(qtype, n, k)
    got_shapes = [tuple(t.shape) for t in rw.planes]
    if got_shapes != want_shapes:
        raise MinferError(f"{name}: repacked {REPACKED_TYPES[qtype]} planes have shapes {got_shapes}, expected {want_shapes}")
    ref = dequantize(raw_np.reshape(-1), qtype, (n, k)).astype(np.float32)
    got = dequantize_planes(rw)
    bad = np.nonzero(ref.view(np.uint32) != got.view(np.uint32))
    if bad[0].size:
        r, c = int(bad[0][0]), int(bad[1][0])
        raise MinferError(f"{name}: repacked {REPACKED_TYPES[qtype]} value [{r}, {c}] is {got[r, c]!r}, the raw "
                          f"blocks give {ref[r, c]!r} ({bad[0].size} values differ)")


def _plane_shapes(qtype, n, k):
    nb = k // 256
    if qtype == Q4_K:
        return [(n, nb * 32), (n, nb * 8), (n, nb * 2)]
    return [(n, nb * 32), (n, nb * 32), (n, nb * 16), (n, nb)]


# ---------------------------------------------------------------- Triton: decode helpers

@triton.jit
def _f4(w, P: tl.constexpr):
    """Nibble P of each int32 word as the float 1 + q/16: q moved to bits 19..22, under the
    exponent of 1.0 (0x3F800000). One shift and one and-or per value, no int->float convert."""
    if P <= 4:
        t = w << (19 - 4 * P)
    else:
        t = w >> (4 * P - 19)
    return ((t & 0x780000) | 0x3F800000).to(tl.float32, bitcast=True)


@triton.jit
def _f6(w, h, P: tl.constexpr):
    """Q6_K value P (low nibble P of w, crumb P of h) as the float 1 + q/64 (q at bits 17..22)."""
    if P <= 4:
        t = w << (17 - 4 * P)
    else:
        t = w >> (4 * P - 17)
    u = h << (21 - 2 * P)
    return ((t & 0x1E0000) | (u & 0x600000) | 0x3F800000).to(tl.float32, bitcast=True)


@triton.jit
def _chunk_scales(p1, p2, p3, row64, kc, blk, kmask, NB, QT: tl.constexpr):
    """Per (row, chunk): (A0, B0, A1, B1) with the chunk's sum of w*x = A*S - B*xs, S = sum f*x
    over its values, xs = sum x (Q4_K: one pair; Q6_K: values 0..15 and 16..31 separately)."""
    if QT == 12:
        scm = tl.load(p1 + row64 * (NB * 8) + kc, mask=kmask, other=0, eviction_policy="evict_first").to(tl.int32)
        d = tl.load(p2 + row64 * (NB * 2) + 2 * blk, mask=kmask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        dmin = tl.load(p2 + row64 * (NB * 2) + 2 * blk + 1, mask=kmask, other=0.0,
                       eviction_policy="evict_first").to(tl.float32)
        # sum (dl*q - ml) x with q = 16 (f - 1):  16 dl S - (16 dl + ml) xs
        a = (d * 16.0) * (scm & 255).to(tl.float32)
        b = a + dmin * ((scm >> 8) & 255).to(tl.float32)
        return a, b, a, b
    else:
        # the int8 scales 2c, 2c+1 of chunk c as one little-endian int16
        s2 = tl.load(p2.to(tl.pointer_type(tl.int16)) + row64 * (NB * 8) + kc, mask=kmask, other=0,
                     eviction_policy="evict_first").to(tl.int32)
        d = tl.load(p3 + row64 * NB + blk, mask=kmask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        # dl (q - 32) with q = 64 (f - 1):  64 dl S - 96 dl xs
        s_lo = ((s2 << 24) >> 24).to(tl.float32)
        s_hi = (s2 >> 8).to(tl.float32)
        a0 = d * s_lo * 64.0
        a1 = d * s_hi * 64.0
        return a0, a0 * 1.5, a1, a1 * 1.5


@triton.jit
def _load_x(x, up, nw, xrow, k, kmask, rstd, NORM: tl.constexpr, SWIGLU: tl.constexpr):
    """Activations at offsets xrow + k (float32): x, or silu(x) * up, times rstd * nw[k] if NORM."""
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
                 M, N, NB, eps, stride_xm, stride_rm, stride_om, blocks_per_split,
                 QT: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr, MP: tl.constexpr,
                 SPLIT: tl.constexpr, USE_DOT: tl.constexpr, NORM: tl.constexpr, SWIGLU: tl.constexpr,
                 HAS_BIAS: tl.constexpr, HAS_RESID: tl.constexpr, INLINE_REDUCE: tl.constexpr,
                 IEEE: tl.constexpr, NORM_BLK: tl.constexpr):
    """out (M, N) = xin (M, K) @ W^T [+ bias] [+ resid]; program (row tile, K split, M tile).

    Tile per iteration: [BN rows, C = 8*BB chunks, 4 words] (BB blocks of 256 values per row)."""
    C: tl.constexpr = BB * 8
    K = NB * 256
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_n * BN + tl.arange(0, BN)
    rmask = rows < N
    # rows past N read row N-1 (valid memory, no mask on the hot loads) and are never stored
    row2 = tl.minimum(rows, N - 1).to(tl.int64)[:, None]              # [BN, 1]
    row3 = row2[:, :, None]                                           # [BN, 1, 1]
    ci = tl.arange(0, C)
    wi = tl.arange(0, 4)
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
    for blk in range(b_lo, b_hi, BB):
        kc = blk * 8 + ci                                             # [C] chunk index in the row
        kmask = kc < b_hi * 8
        qoff = row3 * (NB * 32) + (kc * 4)[None, :, None] + wi[None, None, :]
        wq = tl.load(p0 + qoff, mask=kmask[None, :, None], other=0, eviction_policy="evict_first")
        hq = wq
        if QT == 14:
            hq = tl.load(p1 + qoff, mask=kmask[None, :, None], other=0, eviction_policy="evict_first").to(tl.int32)
        a0, c0, a1, c1 = _chunk_scales(p1, p2, p3, row2, kc[None, :], (kc // 8)[None, :], kmask[None, :], NB, QT)
        kx = (kc * 32)[:, None] + wi[None, :]                         # [C, 4] value 4p + w is kx + 4p
        if USE_DOT:
            for p in tl.static_range(8):
                if QT == 12:
                    f = _f4(wq, p)
                else:
                    f = _f6(wq, hq, p)
                if p < 4:
                    wv = f * a0[:, :, None] - c0[:, :, None]
                else:
                    wv = f * a1[:, :, None] - c1[:, :, None]
                w2 = tl.reshape(wv, (BN, C * 4)).to(x.dtype.element_ty)
                kk = tl.reshape(kx + 4 * p, (C * 4,))
                km = tl.reshape(kmask[:, None] & (wi < 4)[None, :], (C * 4,))
                xt = _load_x(x, up, nw, xrow[None, :], kk[:, None], km[:, None] & mmask[None, :],
                             rstd[None, :], NORM, SWIGLU).to(x.dtype.element_ty)   # [C*4, MP]
                if IEEE:
                    acc += tl.dot(w2, xt, input_precision="ieee")
                else:
                    acc += tl.dot(w2, xt)
        else:
            s0 = tl.zeros([BN, C, 4], dtype=tl.float32)
            s1 = tl.zeros([BN, C, 4], dtype=tl.float32)
            x0 = tl.zeros([C, 4], dtype=tl.float32)
            x1 = tl.zeros([C, 4], dtype=tl.float32)
            for p in tl.static_range(8):
                xv = _load_x(x, up, nw, xrow, kx + 4 * p, kmask[:, None], rstd, NORM, SWIGLU)   # [C, 4]
                if QT == 12:
                    f = _f4(wq, p)
                else:
                    f = _f6(wq, hq, p)
                if p < 4 or QT == 12:
                    s0 += f * xv[None, :, :]
                    x0 += xv
                else:
                    s1 += f * xv[None, :, :]
                    x1 += xv
            acc += a0 * tl.sum(s0, axis=2) - c0 * tl.sum(x0, axis=1)[None, :]
            if QT == 14:
                acc += a1 * tl.sum(s1, axis=2) - c1 * tl.sum(x1, axis=1)[None, :]
    if USE_DOT:
        res = acc                                                     # [BN, MP]
    else:
        res = tl.sum(acc, axis=1)[:, None]                            # [BN, 1]
    if SPLIT == 1:
        _finish(res, rows, rmask, mcol, mmask, bias, resid, out, stride_rm, stride_om, HAS_BIAS, HAS_RESID)
    else:
        poff = (pid_s * M + mcol[None, :]).to(tl.int64) * N + rows[:, None]
        pm = rmask[:, None] & mmask[None, :]
        tl.store(part + poff, res, mask=pm)
        if INLINE_REDUCE:
            # the last split of this tile to finish sums all partials in split order (deterministic);
            # barrier + one acq_rel ticket per program orders the partial stores before it
            tl.debug_barrier()
            tile = pid_m * tl.num_programs(0) + pid_n
            ticket = tl.atomic_add(cnt + tile, 1, sem="acq_rel", scope="gpu")
            if ticket == SPLIT - 1:
                tot = tl.zeros(res.shape, dtype=tl.float32)
                for sp in tl.static_range(SPLIT):
                    o2 = (sp * M + mcol[None, :]).to(tl.int64) * N + rows[:, None]
                    tot += tl.load(part + o2, mask=pm, other=0.0, cache_modifier=".cg")
                _finish(tot, rows, rmask, mcol, mmask, bias, resid, out, stride_rm, stride_om, HAS_BIAS, HAS_RESID)
                tl.atomic_xchg(cnt + tile, 0)                         # ready for the next launch (graph replays)


@triton.jit
def _reduce_kernel(part, bias, resid, out, M, N, SPLIT, stride_rm, stride_om,
                   HAS_BIAS: tl.constexpr, HAS_RESID: tl.constexpr, BLOCK: tl.constexpr):
    """out[m, n] = sum over splits of part (SPLIT, M, N) [+ bias] [+ resid] (INLINE_REDUCE off)."""
    m = tl.program_id(1)
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    nm = n < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for sp in range(SPLIT):
        acc += tl.load(part + (sp * M + m).to(tl.int64) * N + n, mask=nm, other=0.0)
    _finish(acc[:, None], n, nm, m + tl.arange(0, 1), (m + tl.arange(0, 1)) < M, bias, resid, out,
            stride_rm, stride_om, HAS_BIAS, HAS_RESID)


@triton.jit
def _dequant_kernel(p0, p1, p2, p3, out, N, NB, stride_o, QT: tl.constexpr, BR: tl.constexpr, BB: tl.constexpr):
    """out[n, k] = the exact value (fp32 math, ggml's order; cast to out's dtype) for BR rows x BB blocks."""
    C: tl.constexpr = BB * 8
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    rmask = rows < N
    row2 = tl.minimum(rows, N - 1).to(tl.int64)[:, None]
    row3 = row2[:, :, None]
    kc = tl.program_id(1) * C + tl.arange(0, C)
    kmask = kc < NB * 8
    wi = tl.arange(0, 4)
    qoff = row3 * (NB * 32) + (kc * 4)[None, :, None] + wi[None, None, :]
    m3 = kmask[None, :, None]
    wq = tl.load(p0 + qoff, mask=m3, other=0, eviction_policy="evict_first")
    blk = (kc // 8)[None, :]
    km2 = kmask[None, :]
    if QT == 12:
        scm = tl.load(p1 + row2 * (NB * 8) + kc[None, :], mask=km2, other=0).to(tl.int32)
        d = tl.load(p2 + row2 * (NB * 2) + 2 * blk, mask=km2, other=0.0).to(tl.float32)
        dmin = tl.load(p2 + row2 * (NB * 2) + 2 * blk + 1, mask=km2, other=0.0).to(tl.float32)
        dl = (d * (scm & 255).to(tl.float32))[:, :, None]             # exact: 11 x 6 bits
        ml = (dmin * ((scm >> 8) & 255).to(tl.float32))[:, :, None]
    else:
        hq = tl.load(p1 + qoff, mask=m3, other=0, eviction_policy="evict_first").to(tl.int32)
        s2 = tl.load(p2.to(tl.pointer_type(tl.int16)) + row2 * (NB * 8) + kc[None, :], mask=km2, other=0).to(tl.int32)
        d = tl.load(p3 + row2 * NB + blk, mask=km2, other=0.0).to(tl.float32)
        dl0 = (d * ((s2 << 24) >> 24).to(tl.float32))[:, :, None]
        dl1 = (d * (s2 >> 8).to(tl.float32))[:, :, None]
    obase = out + row3 * stride_o + (kc * 32)[None, :, None] + wi[None, None, :]
    om = rmask[:, None, None] & m3
    for p in tl.static_range(8):
        if QT == 12:
            q = (wq >> (4 * p)) & 15
            # exact int -> float: q under the exponent of 2^23, minus 2^23
            v = ((q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0) * dl - ml
        else:
            q = ((wq >> (4 * p)) & 15) | (((hq >> (2 * p)) & 3) << 4)
            qf = (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388640.0   # 2^23 + 32: q - 32
            if p < 4:
                v = qf * dl0
            else:
                v = qf * dl1
        tl.store(obase + 4 * p, v.to(out.dtype.element_ty), mask=om)


# ---------------------------------------------------------------- configs and wrappers

# H200 configs from minfer.bench.gemv_sweep, kept as data: "<type> <N>x<K> m<bucket>" ->
# [BN, BB, SPLIT, num_warps]; shapes not listed use _default_config.
_CONFIG_FILE = os.path.join(os.path.dirname(__file__), "gemv_repack_h200.json")
_configs_cache: dict = {}


def _configs() -> dict:
    if "h200" not in _configs_cache:
        try:
            with open(_CONFIG_FILE) as f:
                _configs_cache["h200"] = {k: tuple(v) for k, v in json.load(f).get("configs", {}).items()}
        except FileNotFoundError:
            _configs_cache["h200"] = {}
    return _configs_cache["h200"]


def m_bucket(m: int) -> int:
    """1 (CUDA cores) or the tl.dot column tile MP (16, 32, 64) for m rows."""
    return 1 if m == 1 else 16 if m <= 16 else 32 if m <= 32 else 64


_TARGET_PROGRAMS = 132 * 4        # a few programs per H200 SM, so loads from several are in flight


def _default_config(qtype, m, n, k):
    nb = k // 256
    bn, bb, w = (32, 2, 4) if m == 1 else (64, 1, 4)
    tiles = triton.cdiv(n, bn) * (1 if m == 1 else triton.cdiv(m, m_bucket(m)))
    split = 1 if tiles >= _TARGET_PROGRAMS else min(triton.cdiv(nb, bb), triton.cdiv(_TARGET_PROGRAMS, tiles), 16)
    return bn, bb, split, w


def config_for(qtype: int, m: int, n: int, k: int, interpret: bool = False) -> tuple:
    """(BN, BB, SPLIT, num_warps) for this shape: the H200 table, else the default rule."""
    if interpret:
        return (16, 1, 1, 4)
    key = f"{REPACKED_TYPES[qtype]} {n}x{k} m{m_bucket(m)}"
    return _configs().get(key) or _default_config(qtype, m, n, k)


class GemvWorkspace:
    """Split-K ticket counters (int32, zero between launches: the last program resets its
    own), owned by the caller so CUDA-graph replays find them; grown before capture."""

    def __init__(self, device, n_counters: int = 1 << 14):
        self.cnt = torch.zeros(n_counters, dtype=torch.int32, device=device)

    def counters(self, need: int) -> torch.Tensor:
        if self.cnt.numel() < need:
            self.cnt = torch.zeros(need, dtype=torch.int32, device=self.cnt.device)
        return self.cnt


def _planes4(rw: Repacked) -> tuple:
    p = rw.planes
    return p if len(p) == 4 else (p[0], p[1], p[2], p[0])


def gemv(x: torch.Tensor, rw: Repacked, bias=None, resid=None, norm_weight=None, eps: float = 1e-6, up=None,
         out_dtype=None, config=None, ws: GemvWorkspace | None = None, inline_reduce: bool = True,
         interpret: bool = False) -> torch.Tensor:
    """out (M, N) = xin @ W^T [+ bias] [+ resid], W = the repacked weight, in one launch.

    x (M, K) float, last dim contiguous. xin = x, or silu(x) * up when `up` (M, K) is given
    (the down projection's SwiGLU), then rms_norm(xin) * norm_weight when norm_weight (K,) is
    given (reference.rms_norm's formula, fp32). bias (N,), resid (M, N) are added in fp32.
    config = (BN, BB, SPLIT, num_warps) overrides the table (sweeps). Split K > 1 uses `ws`'s
    counters (a fresh zeroed buffer when None); inline_reduce=False reduces in a second kernel.
    """
    m, k = x.shape
    n = rw.n
    if k != rw.k or x.stride(1) != 1:
        raise MinferError(f"gemv_repack: x of shape {tuple(x.shape)} (stride {x.stride()}), expected (M, {rw.k}) "
                          f"with contiguous rows")
    if up is not None and (up.shape != x.shape or up.stride() != x.stride()):
        raise MinferError(f"gemv_repack: up has shape {tuple(up.shape)} stride {up.stride()}, expected x's "
                          f"{tuple(x.shape)} {x.stride()}")
    bn, bb, split, nw_ = config or config_for(rw.qtype, m, n, k, interpret)
    nb = k // 256
    use_dot = m > 1
    mp = m_bucket(m) if use_dot else 1
    bps = triton.cdiv(triton.cdiv(nb, max(1, split)), bb) * bb          # whole iterations per split
    split = triton.cdiv(nb, bps)                                        # no empty splits
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    part = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else out
    grid = (triton.cdiv(n, bn), split, triton.cdiv(m, mp) if use_dot else m)
    inline = inline_reduce and split > 1
    if inline:
        need = grid[0] * grid[2]
        cnt = ws.counters(need) if ws is not None else torch.zeros(need, dtype=torch.int32, device=x.device)
    else:
        cnt = out
    if resid is not None and (resid.shape != (m, n) or resid.stride(1) != 1):
        raise MinferError(f"gemv_repack: resid has shape {tuple(resid.shape)}, expected ({m}, {n}) with contiguous rows")
    p0, p1, p2, p3 = _planes4(rw)
    _gemv_kernel[grid](p0, p1, p2, p3, x, up if up is not None else x,
                       norm_weight if norm_weight is not None else x,
                       resid if resid is not None else out, bias if bias is not None else out, out, part, cnt,
                       m, n, nb, eps, x.stride(0), resid.stride(0) if resid is not None else 0, out.stride(0), bps,
                       QT=rw.qtype, BN=bn, BB=bb, MP=mp, SPLIT=split, USE_DOT=use_dot,
                       NORM=norm_weight is not None, SWIGLU=up is not None, HAS_BIAS=bias is not None,
                       HAS_RESID=resid is not None, INLINE_REDUCE=inline, IEEE=x.dtype == torch.float32,
                       NORM_BLK=64 if interpret else (256 if use_dot else 1024), num_warps=nw_)
    if split > 1 and not inline:
        blk = 64 if interpret else 1024
        _reduce_kernel[(triton.cdiv(n, blk), m)](part, bias if bias is not None else part,
                                                 resid if resid is not None else part, out, m, n, split,
                                                 resid.stride(0) if resid is not None else 0, out.stride(0),
                                                 HAS_BIAS=bias is not None, HAS_RESID=resid is not None,
                                                 BLOCK=blk, num_warps=4)
    return out


def dequantize_into(rw: Repacked, out: torch.Tensor, interpret: bool = False, tile=None, num_warps: int = 4):
    """out (N, >= K) float <- the exact values of the repacked weight (the prefill's
    dequantize + cuBLAS reads the planes; bit-exact against minfer.quants in fp32).
    tile = (rows, blocks) per program overrides the default (sweeps)."""
    br, bb = tile or ((4, 1) if interpret else (8, 1))
    nb = rw.k // 256
    if out.shape[0] < rw.n or out.shape[1] < rw.k or out.stride(1) != 1:
        raise MinferError(f"gemv_repack: dequantize_into out has shape {tuple(out.shape)}, expected ({rw.n}, >= {rw.k})")
    p0, p1, p2, p3 = _planes4(rw)
    grid = (triton.cdiv(rw.n, br), triton.cdiv(nb, bb))
    _dequant_kernel[grid](p0, p1, p2, p3, out, rw.n, nb, out.stride(0), QT=rw.qtype, BR=br, BB=bb, num_warps=num_warps)
    return out


def reference_gemv(x, w, bias=None, resid=None, norm_weight=None, eps: float = 1e-6, up=None):
    """The torch definition the kernel is tested against: w (N, K) dense (e.g. gguf's dequant)."""
    xin = x.double()
    if up is not None:
        xin = torch.nn.functional.silu(xin) * up.double()
    if norm_weight is not None:
        xin = xin * torch.rsqrt(xin.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.double()
    out = xin @ w.double().T
    if bias is not None:
        out = out + bias.double()
    if resid is not None:
        out = out + resid.double()
    return out
