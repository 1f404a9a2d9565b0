"""Decoding of raw ggml blocks inside Triton kernels, and the dequantize-to-scratch kernel.

Every kernel here sees a weight as its raw GGUF bytes: `raw` uint8 (N, row_bytes), one row
of blocks per output row. A tile of a weight is decoded as [rows, S, 16]: S runs of 16
consecutive values of one row. 16 is the finest granularity of any scale in the supported
types (Q2_K/Q3_K/Q6_K scale 16 values), so one run shares one scale, which is loaded once
per run ([rows, S, 1]) instead of once per value, and the quant bytes of a run are
consecutive (loads the compiler can widen). Values come out in natural order, so the
caller multiplies them with a contiguous slice of the activations.

Block layouts (ggml-common.h block_* structs; value formulas from ggml-quants.c
dequantize_row_*; gguf-py quants.py is the executable reference the tests compare with):
  Q4_0 (32 values, 18 B):  d f16 | qs[16]: value j = low nibble of qs[j], j+16 = high nibble;
                           w = d * (q - 8)
  Q4_1 (32, 20 B):         d f16 | m f16 | qs[16];                        w = d * q + m
  Q5_0 (32, 22 B):         d f16 | qh u32 (bit j = 5th bit of value j) | qs[16]; w = d * (q - 16)
  Q5_1 (32, 24 B):         d f16 | m f16 | qh u32 | qs[16];              w = d * q + m
  Q8_0 (32, 34 B):         d f16 | qs int8[32];                          w = d * q
  Q2_K (256, 84 B):        scales[16] (lo nibble scale, hi nibble min) | qs[64] | d | dmin
                           value 128h + 32j + l: 2 bits at shift 2j of qs[32h + l]
  Q3_K (256, 110 B):       hmask[32] | qs[64] | scales[12] (16 x 6-bit, minus 32) | d
                           high bit: bit (4h + j) of hmask[l], subtract 4 when it is clear
  Q4_K (256, 144 B):       d | dmin | scales[12] (8 x 6-bit scale and min) | qs[128]
                           value 64j + 32h + l: nibble h of qs[32j + l]; sub-block 2j + h
                           w = d * sc * q - dmin * m       (get_scale_min_k4 for sc, m)
  Q5_K (256, 176 B):       d | dmin | scales[12] | qh[32] | qs[128]; 5th bit: bit (2j + h) of qh[l]
  Q6_K (256, 210 B):       ql[128] | qh[64] | scales int8[16] | d
                           value 128h + 32g + l: low 4 bits from ql[64h + 32(g%2) + l] (nibble g//2),
                           high 2 bits at shift 2g of qh[32h + l]; scale index 8h + 2g + l//16
  IQ4_NL (32, 18 B):       d f16 | qs[16] (nibbles as Q4_0);            w = d * kvalues_iq4nl[q]
  IQ4_XS (256, 136 B):     d f16 | scales_h u16 | scales_l[4] | qs[128]; group g = value // 32:
                           ls = ((scales_l[g/2] >> 4(g%2)) & 15) | (((scales_h >> 2g) & 3) << 4),
                           value 32g + 16h + l: nibble h of qs[16g + l]; w = (d * (ls - 32)) * kvalues_iq4nl[q]
  MXFP4 (32, 17 B):        e e8m0 | qs[16] (nibbles as Q4_0);   w = 2^(e - 128) * kvalues_mxfp4[q]
                           (ggml-impl.h ggml_e8m0_to_fp32_half; the table is the e2m1 values doubled)
  TQ2_0 (256, 66 B):       qs[64] | d f16; value 128j + 32l + m: bits 2l of qs[32j + m] = c; w = d * (c - 1)
  TQ1_0 (256, 54 B):       qs[48] | qh[4] | d f16; five trits a byte: trit n of byte b is ((b * 3^n) & 255) * 3 >> 8
                           = c, w = d * (c - 1); value 32n + m from qs[m] (n < 5), 160 + 16n + m from qs[32 + m],
                           240 + 4n + j from qh[j] (n < 4); a run of 16 lies in one part, one trit (qh: trit i // 4)
  F32/F16/BF16:            handled as 'blocks' of 16 values (64 / 32 / 32 bytes)
The codebooks (ggml-common.h kvalues_iq4nl, kvalues_mxfp4) are computed in registers: _iq4nl
reads the byte of a 64-bit constant, _mxfp4 does the e2m1 arithmetic. The CPU twin of every
branch is minfer/quants (iquants.py for IQ4_NL / IQ4_XS / MXFP4, tquants.py for TQ1_0 / TQ2_0), which tests/ops
compare bit for bit.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl


def interpret() -> bool:
    """Triton's own process-level switch TRITON_INTERPRET=1 (kernels run on the CPU, the tests):
    the kernels then take small fixed tiles. Read at call time, the one place minfer reads it."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# ggml type ids (ggml.h enum ggml_type; gguf.GGMLQuantizationType)
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 10, 11, 12, 13, 14, 30
IQ4_NL, IQ4_XS, MXFP4 = 20, 23, 39
TQ1_0, TQ2_0 = 34, 35



def _layout() -> dict:
    """qtype -> (name, values per block, bytes per block) as the kernels see them, from the one
    table of block sizes (minfer.quants). The float types are read as 'blocks' of 16 values."""
    from minfer.quants import block_size, type_name, type_size

    out = {}
    for q in (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4,
              TQ1_0, TQ2_0):
        bs, ts = block_size(q), type_size(q)
        out[q] = (type_name(q), 16, 16 * ts) if bs == 1 else (type_name(q), bs, ts)
    return out


LAYOUT = _layout()
FLOAT_TYPES = (F32, F16, BF16)


def type_name(qtype: int) -> str:
    return LAYOUT[qtype][0] if qtype in LAYOUT else f"type {qtype}"


@triton.jit
def _ld(p, m):
    """uint8 at p (masked) -> int32."""
    return tl.load(p, mask=m, other=0).to(tl.int32)


@triton.jit
def _ldh(p, m):
    """f16 at byte pointer p (2-aligned; every block size and f16 offset is even) -> f32."""
    return tl.load(p.to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32)


@triton.jit
def _kscale(bp, sub, m):
    """Q4_K/Q5_K 6-bit scale and min of sub-block `sub` (ggml-quants.c get_scale_min_k4)."""
    s = bp + 4
    a = _ld(s + sub, m)                                # scales[sub]
    b = _ld(s + sub + 4, m)                            # scales[sub + 4]
    c = _ld(s + tl.maximum(sub - 4, 0), m)             # scales[sub - 4] (used when sub >= 4)
    lo = sub < 4
    sc = tl.where(lo, a & 63, (b & 15) | ((c >> 6) << 4))
    mn = tl.where(lo, b & 63, (b >> 4) | ((a >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _iq4nl(q):
    """kvalues_iq4nl[q] for codes q in 0..15 (int32): byte q % 8 of one of two 64-bit constants,
    the low one holding kvalues[0..7] + 127, the high one kvalues[8..15] - 1 (every byte < 128,
    so both constants are positive int64)."""
    lo = q < 8
    w = tl.where(lo, 0x75695C4E3E2C1700, 0x7058443425180C00)
    b = ((w >> (8 * (q & 7)).to(tl.int64)) & 255).to(tl.int32)
    return tl.where(lo, b - 127, b + 1)


@triton.jit
def _mxfp4(q):
    """kvalues_mxfp4[q] (int32): bit 3 the sign, bits 0-2 the doubled e2m1 magnitude
    0 1 2 3 4 6 8 12 (m < 4: m; else (2 + (m & 1)) << (m // 2 - 1))."""
    mg = q & 7
    mag = tl.where(mg < 4, mg, (2 + (mg & 1)) << tl.maximum((mg >> 1) - 1, 0))
    return tl.where(q >= 8, -mag, mag)


# Q4_0 / Q5_0 / Q8_0: block sizes 18 / 22 / 34 bytes, the f16 scale first, every field at an even
# offset (ggml-common.h's block_q4_0 / block_q5_0 / block_q8_0), so their quant bytes are halfword-aligned
HALFWORD_TYPES = (2, 6, 8)


@triton.jit
def decode_hw(QT: tl.constexpr, bp, e0, m):
    """A Q4_0 / Q5_0 / Q8_0 run (HALFWORD_TYPES) as decode() gives it, split in its even and odd values
    ([R, 8] fp32 each: value 2j, value 2j + 1), its 16 quant bytes read as 8 halfwords (byte 2j is
    halfword j's low byte, little-endian) and Q5_0's 16 fifth bits as two bytes: a thread's run costs 8
    two-byte loads (and Q5_0's 2 one-byte loads), not 16 or 32 one-byte loads, and no shuffle of the values
    (the caller reads x's even and odd values to match). bp, e0, m: [R, 1]."""
    j = tl.arange(0, 8)[None, :]
    d = _ldh(bp, m)
    if QT == 8:  # Q8_0: int8 values
        h = tl.load((bp + 2 + e0).to(tl.pointer_type(tl.int16)) + j, mask=m, other=0).to(tl.int32)
        return ((h << 24) >> 24).to(tl.float32) * d, (h >> 8).to(tl.float32) * d
    if QT == 6:
        h = tl.load((bp + 6).to(tl.pointer_type(tl.int16)) + j, mask=m, other=0).to(tl.int32)
    else:
        h = tl.load((bp + 2).to(tl.pointer_type(tl.int16)) + j, mask=m, other=0).to(tl.int32)
    sh = (e0 // 16) * 4               # qs[b] holds value b (low nibble) and b + 16 (high nibble)
    lo = (h >> sh) & 15
    hi = (h >> (sh + 8)) & 15
    if QT == 6:  # Q5_0: qh (32 bits, little-endian) bit e is value e's fifth bit
        # the two qh bytes as two byte loads: one uint16 load here, beside the caller's bf16 x read as 32-bit
        # words, gave wrong sums at the one-pass BN 4 tile on an H100 and an H200 (Triton 3.6; float32 rows and
        # BN 8 were right; perf-log AZ1, tools/hw_bisect.py)
        qb = (_ld(bp + 2 + e0 // 8, m) | (_ld(bp + 3 + e0 // 8, m) << 8)) >> (2 * j)
        lo = (lo | (qb << 4 & 16)) - 16                              # bit 2j (value 2j's), then bit 2j + 1
        hi = (hi | (qb << 3 & 16)) - 16
    else:
        lo = lo - 8
        hi = hi - 8
    return lo.to(tl.float32) * d, hi.to(tl.float32) * d


@triton.jit
def decode(QT: tl.constexpr, bp, e0, i, m):
    """Values of runs of 16 inside blocks.

    bp: [R, 1] uint8 pointers to each run's block; e0: [R, 1] int32 index of the run's first
    value inside its block (a multiple of 16); i: [1, 16] arange(16); m: [R, 1] mask (masked
    runs decode to 0). Returns [R, 16] float32. (Any broadcastable shapes work; the kernels use
    one run per tile row so that a thread holds a whole run: its 16 quant bytes are one load
    and its scales need no layout conversion.)
    """
    if QT == 0:  # F32
        v = tl.load((bp + 4 * i).to(tl.pointer_type(tl.float32)), mask=m, other=0.0)
    elif QT == 1:  # F16
        v = tl.load((bp + 2 * i).to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32)
    elif QT == 30:  # BF16
        v = tl.load((bp + 2 * i).to(tl.pointer_type(tl.bfloat16)), mask=m, other=0.0).to(tl.float32)
    elif QT == 2:  # Q4_0
        d = _ldh(bp, m)
        q = (_ld(bp + 2 + i, m) >> ((e0 // 16) * 4)) & 15
        v = (q - 8).to(tl.float32) * d
    elif QT == 3:  # Q4_1
        d = _ldh(bp, m)
        mn = _ldh(bp + 2, m)
        q = (_ld(bp + 4 + i, m) >> ((e0 // 16) * 4)) & 15
        v = q.to(tl.float32) * d + mn
    elif QT == 6:  # Q5_0
        d = _ldh(bp, m)
        e = e0 + i
        hb = (_ld(bp + 2 + e // 8, m) >> (e % 8)) & 1
        q = ((_ld(bp + 6 + i, m) >> ((e0 // 16) * 4)) & 15) | (hb << 4)
        v = (q - 16).to(tl.float32) * d
    elif QT == 7:  # Q5_1
        d = _ldh(bp, m)
        mn = _ldh(bp + 2, m)
        e = e0 + i
        hb = (_ld(bp + 4 + e // 8, m) >> (e % 8)) & 1
        q = ((_ld(bp + 8 + i, m) >> ((e0 // 16) * 4)) & 15) | (hb << 4)
        v = q.to(tl.float32) * d + mn
    elif QT == 8:  # Q8_0
        d = _ldh(bp, m)
        q = tl.load(bp + 2 + e0 + i, mask=m, other=0).to(tl.int8, bitcast=True)
        v = q.to(tl.float32) * d
    elif QT == 10:  # Q2_K
        h = e0 // 128
        j = (e0 % 128) // 32
        l0 = e0 % 32
        q = (_ld(bp + 16 + 32 * h + l0 + i, m) >> (2 * j)) & 3
        sc = _ld(bp + e0 // 16, m)                     # scale index 8h + 2j + l//16 == e0 // 16
        d = _ldh(bp + 80, m)
        dmin = _ldh(bp + 82, m)
        v = (d * (sc & 15).to(tl.float32)) * q.to(tl.float32) - dmin * (sc >> 4).to(tl.float32)
    elif QT == 11:  # Q3_K
        h = e0 // 128
        j = (e0 % 128) // 32
        l0 = e0 % 32
        q = (_ld(bp + 32 + 32 * h + l0 + i, m) >> (2 * j)) & 3
        hb = (_ld(bp + l0 + i, m) >> (4 * h + j)) & 1
        q = q - 4 * (1 - hb)
        s = e0 // 16                                   # scale index, 0..15
        lo4 = (_ld(bp + 96 + s % 8, m) >> (4 * (s // 8))) & 15
        hi2 = (_ld(bp + 104 + s % 4, m) >> (2 * (s // 4))) & 3
        sc = (lo4 | (hi2 << 4)) - 32
        d = _ldh(bp + 108, m)
        v = (d * sc.to(tl.float32)) * q.to(tl.float32)
    elif QT == 12:  # Q4_K
        j = e0 // 64
        hi = (e0 % 64) // 32
        l0 = e0 % 32
        # the 16 quant bytes of a run start 16-aligned (144-byte blocks; rows of 16-aligned
        # length are specialized by Triton): say so, so the compiler makes them one 16-byte load
        q = (_ld(bp + tl.multiple_of(16 + 32 * j + l0, [16, 16]) + i, m) >> (4 * hi)) & 15
        sc, mn = _kscale(bp, e0 // 32, m)
        d = _ldh(bp, m)
        dmin = _ldh(bp + 2, m)
        v = (d * sc) * q.to(tl.float32) - dmin * mn
    elif QT == 13:  # Q5_K
        j = e0 // 64
        hi = (e0 % 64) // 32
        l0 = e0 % 32
        sub = e0 // 32
        q = (_ld(bp + tl.multiple_of(48 + 32 * j + l0, [16, 16]) + i, m) >> (4 * hi)) & 15   # 176-byte blocks
        hb = (_ld(bp + tl.multiple_of(16 + l0, [16, 16]) + i, m) >> sub) & 1
        q = q + 16 * hb
        sc, mn = _kscale(bp, sub, m)
        d = _ldh(bp, m)
        dmin = _ldh(bp + 2, m)
        v = (d * sc) * q.to(tl.float32) - dmin * mn
    elif QT == 20:  # IQ4_NL
        d = _ldh(bp, m)
        q = (_ld(bp + 2 + i, m) >> ((e0 // 16) * 4)) & 15
        v = _iq4nl(q).to(tl.float32) * d
    elif QT == 23:  # IQ4_XS
        g = e0 // 32                                   # 32-value group, 0..7
        q = (_ld(bp + 8 + 16 * g + i, m) >> (4 * ((e0 % 32) // 16))) & 15
        lo4 = (_ld(bp + 4 + g // 2, m) >> (4 * (g % 2))) & 15
        hi2 = (_ld(bp + 2 + g // 4, m) >> (2 * (g % 4))) & 3     # scales_h (u16 LE), bits 2g..2g+1
        d = _ldh(bp, m)
        v = (d * ((lo4 | (hi2 << 4)) - 32).to(tl.float32)) * _iq4nl(q).to(tl.float32)
    elif QT == 39:  # MXFP4
        e = _ld(bp, m)
        d = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23).to(tl.float32, bitcast=True)   # 2^(e - 128)
        q = (_ld(bp + 1 + i, m) >> ((e0 // 16) * 4)) & 15
        v = _mxfp4(q).to(tl.float32) * d
    elif QT == 35:  # TQ2_0
        j = e0 // 128
        sh = 2 * ((e0 % 128) // 32)
        c = (_ld(bp + 32 * j + e0 % 32 + i, m) >> sh) & 3
        d = _ldh(bp + 64, m)
        v = (c - 1).to(tl.float32) * d
    elif QT == 34:  # TQ1_0
        lo = e0 < 160                                  # qs[0:32], trit e0 // 32
        mid = e0 < 240                                 # qs[32:48], trit (e0 - 160) // 16; else qh, trit i // 4
        off = tl.where(lo, e0 % 32 + i, tl.where(mid, 32 + i, 48 + i % 4))
        n = tl.where(lo, e0 // 32, tl.where(mid, (e0 - 160) // 16, i // 4))
        p3 = tl.where(n == 0, 1, tl.where(n == 1, 3, tl.where(n == 2, 9, tl.where(n == 3, 27, 81))))
        c = (((_ld(bp + off, m) * p3) & 255) * 3) >> 8
        d = _ldh(bp + 52, m)
        v = (c - 1).to(tl.float32) * d
    else:
        tl.static_assert(QT == 14, "dequant.decode: no branch for this ggml type")
        # 14: Q6_K
        h = e0 // 128
        g = (e0 % 128) // 32
        l0 = e0 % 32
        ql = (_ld(bp + 64 * h + 32 * (g % 2) + l0 + i, m) >> (4 * (g // 2))) & 15
        qh = (_ld(bp + 128 + 32 * h + l0 + i, m) >> (2 * g)) & 3
        q = (ql | (qh << 4)) - 32
        sc = tl.load(bp + 192 + e0 // 16, mask=m, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        d = _ldh(bp + 208, m)
        v = (d * sc) * q.to(tl.float32)
    return v


@triton.jit
def _dequant_kernel(raw, out, idx, N, K, row_bytes, out_stride,
                    QT: tl.constexpr, QK: tl.constexpr, TS: tl.constexpr,
                    BR: tl.constexpr, BK: tl.constexpr, HAS_IDX: tl.constexpr):
    """out[r, :K] = decode(raw[idx[r] if HAS_IDX else r]) for BR rows x BK values per program.

    The tile is [BR * BK/16 runs, 16]: run q covers row BR-local q // S, values s*16.. of the
    program's K range (s = q % S)."""
    S: tl.constexpr = BK // 16
    run = tl.arange(0, BR * S)
    r = tl.program_id(0) * BR + run // S
    rmask = r < N
    if HAS_IDX:
        src = tl.load(idx + r, mask=rmask, other=0).to(tl.int64)
    else:
        src = r.to(tl.int64)
    k0 = tl.program_id(1) * BK + (run % S) * 16               # first value of each run
    m = (rmask & (k0 < K))[:, None]
    bp = (raw + src * row_bytes + (k0 // QK) * TS)[:, None]
    i = tl.arange(0, 16)[None, :]
    if QT == 0 or QT == 1 or QT == 30:
        # float rows read as runs of 16 (LAYOUT): with K no multiple of 16 the last run's values
        # past K are neither read nor stored (they would land in the next output row)
        m = m & ((k0[:, None] + i) < K)
    v = decode(QT, bp, (k0 % QK)[:, None], i, m)
    optr = out + (r.to(tl.int64) * out_stride + k0)[:, None] + i
    tl.store(optr, v.to(out.dtype.element_ty), mask=m)


def dequant_config(qtype: int, interpret: bool):
    """(rows, values) per program: 8 x 256 = 128 runs of 16, one per thread of 4 warps
    (H200 tile sweep, docs/perf-log.md section 3: Q4_K 3.23 TB/s, Q6_K 2.28 TB/s at (8, 256); (16, 256) gave 3.14 / 2.24)."""
    if interpret:
        return 4, 64
    return 8, 256


def dequantize_into(raw, qtype: int, n_rows: int, k: int, out, idx=None, interpret: bool = False,
                    tile: tuple[int, int] | None = None, num_warps: int = 4):
    """Decode rows of `raw` (uint8 (N, row_bytes), CUDA) into `out` (n_rows, >= k) float tensor.

    idx: optional int64 (n_rows,) row indices into raw (the embedding gather); else rows 0..n_rows-1.
    tile=(rows, values) and num_warps override the config (benchmark sweeps).
    """
    name, qk, ts = LAYOUT[qtype]
    br, bk = tile or dequant_config(qtype, interpret)
    grid = (triton.cdiv(n_rows, br), triton.cdiv(k, bk))
    _dequant_kernel[grid](raw, out, idx if idx is not None else raw, n_rows, k, raw.stride(0), out.stride(0),
                          QT=qtype, QK=qk, TS=ts, BR=br, BK=bk, HAS_IDX=idx is not None, num_warps=num_warps)
    return out
