"""Batched-decode GEMM with int8 activations on the tensor cores, over the repacked Q4_K / Q6_K planes.

out (M, N) = W_deq . x_hat for M = 9..256 rows of q8 activations (gemv_q8.py's form: int8 per
32 values with (d, s0, s1, 0) per chunk), in the manner of llama.cpp's mmq: the weight's 4-bit
(Q6_K: 6-bit) values become int8 in registers, the activations are int8 already, and each
32-value chunk (one scale) is ONE int8 x int8 -> int32 tl.dot on the tensor cores; the exact
int32 result is then scaled into an fp32 accumulator on the CUDA cores (a conversion, a multiply
and an fma per element and chunk):
  Q4_K: acc += (d sc)[n] * (xd[m] * isum)
  Q6_K: acc += a0[n] * (xd[m] * i0) + a1[n] * (xd[m] * i1)      (a = d * the chunk's two scales)
and once per super-block (8 chunks) the min / -32 term is one small matrix product (_min_term):
  Q4_K: acc -= dmin[n] * sum_c m[n, c] (s0 + s1)[m, c];  Q6_K: acc -= d[n] * sum 32 sc s
(Q6_K's values are q - 32 with q = 0..63: the -32 goes into the activations' sums, as in the
GEMV's _q8_tile). Exact up to fp32 rounding and summation order: |isum| <= 32 * 63 * 127 <
2^24 converts exactly; the min term's products are exact (bf16x3 split, _dot3).
Why not dequantize to bf16 and multiply (qgemm_repack.py, 0.17-1.06x cuBLAS on the H200,
docs/perf-log.md): there the decode took ~6-10 instructions per weight value. Here, from sm_90
builds compiled on the CPU (no GPU run yet), the loop is ~4.8 / 7.0 / 13.3 SASS instructions
per Q4_K value at M = 16 / 32 / 64 (the per-chunk rescale grows with M: BM/32 * ~3.3 per
value), Q6_K ~10 / 13 / 22 (two dots per chunk, two rescales).

K order inside a chunk (any permutation works when both sides agree). The q8 row keeps chunk c
as 8 int32 words: word 4h + w, byte b = value 8b + 4h + w (gemv_q8.py). Read as 32 int8 bytes,
position j = 16h + 4w + b holds value 8b + 4h + w. The weight's qs plane (gemv_repack_layout:
nibble p of word w is value 4p + w) read through an int8 pointer gives byte 4w + b of the chunk =
nibbles 2b (low) and 2b + 1 (high) of word w = values 8b + w and 8b + 4 + w. So the weight tile
at position 16h + 4w + b is (byte (4w + b) >> 4h) & 15: the chunk's 16 bytes read twice (the
second read hits L1), elementwise on [BN, 32] (no reshape, so Triton keeps the tile in the
MMA operand layout from the load on), and the activations load straight from the q8 row.
Q6_K's high 2 bits of value 4p + w are bits 2p..2p+1 of halfword w of its qh chunk; p = 2b + h,
so the shift is 4b + 2h. Q6_K's two scales: values 0..15 of the chunk (scale 2c) are the
positions with b < 2; two dots, each on the weights with the other half zeroed.
On the GPU the bytes are built 4 per PTX op (inline asm with pack=4, Q6_K 8: a 32-bit register holds
4 consecutive positions k..k+3, k % 4 == 0 (8: k % 8), which the tile layouts give: 16 contiguous bytes
per thread at the load, kWidth 4 in the MMA operand); config entry asm 0 (and the interpreter)
builds them one by one. tests/gpu/test_qgemm_q8_gpu.py and the sweep check both.

Shape (swap-AB): the MMA's M is the weight rows (BN), its N the batch rows (BM); the K loop
runs CB chunks per iteration (unrolled, so the pipeliner's num_stages covers all of them).
Split K (too few tiles for 132 SMs): fp32 partials (SPLIT, M, N), the last program of a tile
(an atomic ticket, as the GEMV) sums them in split order and runs the epilogue: one launch.
Configs: [BN, BM, CB, SPLIT, num_warps, num_stages(, asm)] per "<type> <N>x<K> m<bucket>" in
qgemm_q8_h200.json (minfer/bench/qgemm_q8_sweep.py writes it), else default_config.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from minfer.errors import MinferError
from minfer.ops.cuda.gemv_repack import _finish as _epilogue
from minfer.ops.cuda.gemv_repack import load_configs  # noqa: F401  (the one table reader; tests call it here)
from minfer.ops.cuda.qgemm_repack import _TARGET_PROGRAMS, m_bucket  # the batched GEMMs' M buckets
from minfer.ops.cuda.gemv_repack_layout import Q4_K, Q6_K, REPACKED_TYPES, Repacked

MAX_M = 256


@triton.jit
def _nibbles(wb, hi, ASM: tl.constexpr):
    """int8 [BN, 32] plane bytes -> their low nibbles where not hi, high nibbles where hi (int8).
    ASM: four bytes per 32-bit op (PTX on the packed register of 4 consecutive bytes; the
    interpreter cannot run PTX: it takes the same values byte by byte)."""
    if ASM:
        # the shift as a packed operand too: byte 0 of a 4-byte group holds 4 (hi) or 0, the
        # others 0, so the group's 32-bit register is the shift count (loop-invariant)
        return tl.inline_asm_elementwise("{ .reg .b32 t; shr.u32 t, $1, $2; and.b32 $0, t, 0x0F0F0F0F; }",
                                         "=r,r,r", [wb, _packed_shift(hi, 4, 0)], dtype=tl.int8, is_pure=True,
                                         pack=4)
    else:
        return ((wb.to(tl.int32) >> tl.where(hi, 4, 0)) & 15).to(tl.int8)


@triton.jit
def _packed_shift(hi, v_hi, v_lo):
    """int8 [1, 32]: in each group of 4 positions (one 32-bit register when packed) byte 0 holds
    v_hi where hi, else v_lo, the other bytes 0: the packed register IS the shift count."""
    kk = tl.arange(0, 32)[None, :]
    return tl.where(kk % 4 == 0, tl.where(hi, v_hi, v_lo), 0).to(tl.int8)


@triton.jit
def _prmt_sel(k2):
    """int8 [1, 32], packed per 4 positions (group w): the PTX prmt selector that spreads halfword
    w of the qh chunk's 8 bytes (two 32-bit registers) to bytes [lo, lo, hi, hi]: 2w, 2w, 2w+1, 2w+1."""
    w = (k2 // 4) % 4
    j = k2 % 4
    return tl.where(j == 0, 34 * w, tl.where(j == 1, 34 * w + 17, 0)).to(tl.int8)


def _q6_group(g: int, mask: str) -> str:
    """PTX for group g (0, 1) of an 8-position pack: operands $2+g ql word, $4/$5 the qh chunk,
    $6+g / $8+g / $10+g the shifts 4h / 2h / 4-2h, $12+g the prmt selector; result $g."""
    return (f"prmt.b32 x, $4, $5, ${12 + g}; shr.u32 t, ${2 + g}, ${6 + g}; and.b32 t, t, 0x0F0F0F0F; "
            f"shl.b32 v, x, ${10 + g}; and.b32 v, v, 0x00300030; shr.u32 w, x, ${8 + g}; "
            f"and.b32 w, w, 0x30003000; or.b32 t, t, v; or.b32 t, t, w; and.b32 ${g}, t, {mask}; ")


_Q6_ASM0 = tl.constexpr("{ .reg .b32 t, v, w, x; " + _q6_group(0, "0x0000FFFF") + _q6_group(1, "0x0000FFFF") + "}")
_Q6_ASM1 = tl.constexpr("{ .reg .b32 t, v, w, x; " + _q6_group(0, "0xFFFF0000") + _q6_group(1, "0xFFFF0000") + "}")


@triton.jit
def _q6(wb, hb, k2, HALF: tl.constexpr, ASM: tl.constexpr):
    """Q6_K's 6-bit values 0..63 (int8 [BN, 32]) at positions k2 = 16h + 4w + b (value 4p + w,
    p = 2b + h): the low nibble (wb: byte 4w + b of the ql chunk) | the 2 high bits << 4, only
    where b < 2 (HALF 0: the chunk's values 0..15, scale 2c) or b >= 2 (HALF 1), else 0.
    ASM: hb holds byte k % 8 of the 8-byte qh chunk (an 8-byte run: Triton's pipeliner copies it
    asynchronously, a 4-byte one it did not), so a pack of 8 positions holds the whole chunk
    in two registers; prmt spreads halfword w to bytes [lo, lo, hi, hi] and the crumbs go to
    bits 4..5 of each byte as the GEMV's _q8_tile places them (checked bit for bit against the
    per-value formula in numpy). Else: hb holds halfword w (int32), the crumb is bits 4b + 2h."""
    hi = k2 >= 16
    if ASM:
        return tl.inline_asm_elementwise(
            _Q6_ASM0 if HALF == 0 else _Q6_ASM1, "=r,=r,r,r,r,r,r,r,r,r,r,r,r,r",
            [wb, hb, _packed_shift(hi, 4, 0), _packed_shift(hi, 2, 0), _packed_shift(hi, 2, 4), _prmt_sel(k2)],
            dtype=tl.int8, is_pure=True, pack=8)
    else:
        q = (wb.to(tl.int32) >> tl.where(hi, 4, 0)) & 15
        q = q | (((hb >> (4 * (k2 % 4) + 2 * (k2 // 16))) & 3) << 4)
        return tl.where(((k2 % 4) < 2) == (HALF == 0), q, 0).to(tl.int8)


@triton.jit
def _chunk(p0, p1, p2, d, x8, xf, row1, xrow, xfrow, c, acc, QT: tl.constexpr, BN: tl.constexpr,
           BM: tl.constexpr, NB, EVICT: tl.constexpr, ASM: tl.constexpr):
    """acc [BN, BM] += the chunk c (32 values) of the tile's rows times the batch rows; d [BN] the
    rows' super-block d (fp32), loaded once per K step (_super_d)."""
    kk = tl.arange(0, 32)
    k2 = kk[None, :]                                                   # position 16h + 4w + b
    # weights: byte (4w + b) of the chunk's 16-byte plane slice for both h (the second read hits
    # L1), its low (h = 0) or high (h = 1) nibble; elementwise on [BN, 32], no reshape, so the
    # compiler may keep the tile in the MMA operand layout from the load on
    wb = tl.load(p0.to(tl.pointer_type(tl.int8)) + row1[:, None] * (NB * 128) + c * 16 + (k2 % 16),
                 eviction_policy=EVICT)
    # activations: the q8 row's 32 bytes of chunk c (module doc), and its (d, s0, s1, 0)
    xb = tl.load(x8 + xrow + c * 32 + k2)                              # [BM, 32] int8
    xd = tl.load(xf + xfrow + c * 4)                                   # [BM]
    if QT == 12:
        isum = tl.dot(_nibbles(wb, k2 >= 16, ASM), tl.trans(xb), out_dtype=tl.int32).to(tl.float32)   # [BN, BM], exact
        scm = tl.load(p1 + row1 * (NB * 8) + c, eviction_policy=EVICT).to(tl.int32)
        a = d * (scm & 255).to(tl.float32)                             # exact: 11 x 6 bits
        # two ops per element past the conversion: a multiply and an fma (the min term: _min_term)
        acc += a[:, None] * (isum * xd[None, :])
    else:
        # high 2 bits of value 4p + w (p = 2b + h): bits 4b + 2h of halfword w of the qh chunk
        if ASM:
            hb = tl.load(p1.to(tl.pointer_type(tl.int8)) + row1[:, None] * (NB * 64) + c * 8 + k2 % 8,
                         eviction_policy=EVICT)
        else:
            hb = tl.load(p1 + row1[:, None] * (NB * 32) + c * 4 + (k2 % 16) // 4, eviction_policy=EVICT).to(tl.int32)
        # b < 2: values 0..15 of the chunk, scale 2c; b >= 2: scale 2c + 1: two dots on the two
        # halves of the weights (each built from the loads on its own: one use each, so the MMA
        # operand layout reaches the loads; the activations go straight from shared memory)
        i0 = tl.dot(_q6(wb, hb, k2, 0, ASM), tl.trans(xb), out_dtype=tl.int32).to(tl.float32)
        i1 = tl.dot(_q6(wb, hb, k2, 1, ASM), tl.trans(xb), out_dtype=tl.int32).to(tl.float32)
        # the int8 scales 2c, 2c+1 as one little-endian int16
        s2 = tl.load(p2.to(tl.pointer_type(tl.int16)) + row1 * (NB * 8) + c, eviction_policy=EVICT).to(tl.int32)
        a0 = d * ((s2 << 24) >> 24).to(tl.float32)
        a1 = d * (s2 >> 8).to(tl.float32)
        acc += a0[:, None] * (i0 * xd[None, :])
        acc += a1[:, None] * (i1 * xd[None, :])
    return acc


@triton.jit
def _dot3(w, s, INTERP: tl.constexpr):
    """w [BN, 16] fp32 small integers (exact in bf16) @ s [16, BM] fp32 on the tensor cores, the
    products exact: s = hi + mid + lo, three bf16 parts (each keeps 8 bits of what is left:
    24 bits in all, so the split is exact, rounding or truncating), three bf16 MMAs into one
    fp32 accumulator. The interpreter (whose bf16 dot is not one) multiplies the same parts in
    fp32."""
    hi = s.to(tl.bfloat16)
    r = s - hi.to(tl.float32)
    mid = r.to(tl.bfloat16)
    lo = (r - mid.to(tl.float32)).to(tl.bfloat16)
    if INTERP:
        t = tl.dot(w, hi.to(tl.float32), input_precision="ieee")
        t = tl.dot(w, mid.to(tl.float32), t, input_precision="ieee")
        return tl.dot(w, lo.to(tl.float32), t, input_precision="ieee")
    else:
        wb = w.to(tl.bfloat16)
        t = tl.dot(wb, hi)
        t = tl.dot(wb, mid, t)
        return tl.dot(wb, lo, t)


@triton.jit
def _min_term(p1, p2, p3, xf, row1, xfrow, c0, acc, QT: tl.constexpr, CB: tl.constexpr, NB,
              EVICT: tl.constexpr, INTERP: tl.constexpr):
    """acc -= the K step's (chunks c0 .. c0 + CB - 1, one super-block) min / -32 term, as one
    small matrix product per step instead of an fma per element and chunk:
      Q4_K: dmin[n] * sum_c m[n, c] (s0 + s1)[m, c]        (K index j = chunk c0 + j, j < CB)
      Q6_K: d[n] * sum_j sc[n, 2 c0 + j] * 32 s_{j % 2}[m, c0 + j // 2]   (j < 2 CB)
    (the 6-bit m and the int8 sc are exact in bf16: _dot3)."""
    j = tl.arange(0, 16)
    if QT == 12:
        jm = j < CB
        scm = tl.load(p1 + row1[:, None] * (NB * 8) + c0 + j[None, :], mask=jm[None, :], other=0,
                      eviction_policy=EVICT).to(tl.int32)
        wm = ((scm >> 8) & 255).to(tl.float32)                        # [BN, 16]
        xo = xfrow[None, :] + (c0 + j)[:, None] * 4                    # [16, BM]
        s = tl.load(xf + xo + 1, mask=jm[:, None], other=0.0) + tl.load(xf + xo + 2, mask=jm[:, None], other=0.0)
        sb = tl.load(p2.to(tl.pointer_type(tl.int32)) + row1 * NB + c0 // 8, eviction_policy=EVICT)
        scale = (sb >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)   # dmin
    else:
        jm = j < 2 * CB
        wm = tl.load(p2 + row1[:, None] * (NB * 16) + 2 * c0 + j[None, :], mask=jm[None, :], other=0,
                     eviction_policy=EVICT).to(tl.float32)             # the int8 scales
        xo = xfrow[None, :] + (c0 + j // 2)[:, None] * 4 + 1 + (j % 2)[:, None]
        s = tl.load(xf + xo, mask=jm[:, None], other=0.0) * 32.0
        scale = tl.load(p3 + row1 * NB + c0 // 8, eviction_policy=EVICT).to(tl.float32)   # d
    return acc - scale[:, None] * _dot3(wm, s, INTERP)


@triton.jit
def _super_d(p2, p3, row1, blk, NB, QT: tl.constexpr, EVICT: tl.constexpr):
    """[BN] fp32 d of super-block blk of the rows (Q4_K: the low half of the d | dmin word)."""
    if QT == 12:
        sb = tl.load(p2.to(tl.pointer_type(tl.int32)) + row1 * NB + blk, eviction_policy=EVICT)
        return (sb & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    else:
        return tl.load(p3 + row1 * NB + blk, eviction_policy=EVICT).to(tl.float32)


@triton.jit
def _qgemm_q8_kernel(p0, p1, p2, p3, x8, xf, out, part, cnt, bias,
                     M, N, NB, stride_om, steps_per_split, SPLIT,
                     QT: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, CB: tl.constexpr,
                     IS_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, EVICT: tl.constexpr, ASM: tl.constexpr,
                     INTERP: tl.constexpr):
    """Program (M tile, row tile, K split): acc [BN, BM] = W[rows, chunks] . x_hat[mcols, chunks]."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    rows = pid_n * BN + tl.arange(0, BN)
    rmask = rows < N
    # rows past N (batch rows past M) read the last valid one: no masks on the hot loads; never stored
    row1 = tl.minimum(rows, N - 1).to(tl.int64)                       # [BN]
    mcol = pid_m * BM + tl.arange(0, BM)
    mmask = mcol < M
    mrow = tl.minimum(mcol, M - 1).to(tl.int64)
    xrow = mrow[:, None] * (NB * 256)                                  # int8 bytes per q8 row = K
    xfrow = mrow * (NB * 32)                                           # xf floats per row = K / 8
    # whole steps of CB chunks per split; NB * 8 is a multiple of CB (CB divides 8): no K masks
    c_lo = pid_s * steps_per_split * CB
    c_hi = tl.minimum(c_lo + steps_per_split * CB, NB * 8)
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for c0 in range(c_lo, c_hi, CB):
        d = _super_d(p2, p3, row1, c0 // 8, NB, QT, EVICT)           # one super-block per step
        for i in tl.static_range(CB):
            acc = _chunk(p0, p1, p2, d, x8, xf, row1, xrow, xfrow, c0 + i, acc, QT, BN, BM, NB, EVICT, ASM)
        acc = _min_term(p1, p2, p3, xf, row1, xfrow, c0, acc, QT, CB, NB, EVICT, INTERP)
    if not IS_SPLIT:
        _epilogue(acc, rows, rmask, mcol, mmask, bias, out, out, 0, stride_om, HAS_BIAS, False)
    else:
        pm = rmask[:, None] & mmask[None, :]
        tl.store(part + (pid_s * M + mcol[None, :]).to(tl.int64) * N + rows[:, None], acc, mask=pm)
        # the last split of a tile to finish sums the partials in split order (deterministic; the
        # GEMV's scheme): a CTA barrier, then one acq_rel ticket per program
        tl.debug_barrier()
        tile = pid_n * tl.num_programs(0) + pid_m
        ticket = tl.atomic_add(cnt + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT - 1:
            tot = tl.zeros([BN, BM], dtype=tl.float32)
            for sp in range(SPLIT):
                tot += tl.load(part + (sp * M + mcol[None, :]).to(tl.int64) * N + rows[:, None], mask=pm,
                               other=0.0, cache_modifier=".cg")
            _epilogue(tot, rows, rmask, mcol, mmask, bias, out, out, 0, stride_om, HAS_BIAS, False)
            tl.atomic_xchg(cnt + tile, 0)                              # ready for the next launch (graphs)


# ---------------------------------------------------------------- configs

_CONFIG_FILE = os.path.join(os.path.dirname(__file__), "qgemm_q8_h200.json")
H200_CONFIGS = load_configs(_CONFIG_FILE)


def split_for(m: int, n: int, k: int, bn: int, bm: int, cb: int, target: int = _TARGET_PROGRAMS) -> int:
    """K splits so that tiles x splits reaches ~target programs (at most 16, >= 2 steps each)."""
    tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
    if tiles >= target:
        return 1
    return max(1, min(k // (64 * cb), triton.cdiv(target, tiles), 16))


def default_config(qtype: int, m: int, n: int, k: int) -> tuple:
    """[BN, BM, CB, SPLIT, num_warps, num_stages] for a shape the table lacks: 128 weight rows and
    8 chunks (one super-block) per step; all rows in one M tile up to 64, M tiles of 64 above
    (BM = 128 spills). Chosen from sm_90 builds compiled on the CPU (SASS instructions per Q4_K
    value in the loop: 4.8 at M=16, 7.0 at 32, 13.3 at 64; qgemm_q8_sweep.CANDIDATES), not yet
    from a GPU run: the sweep's table replaces it."""
    bm = min(m_bucket(m), 64)
    warps, stages = {16: (4, 4), 32: (4, 3), 64: (8, 3)}[bm]
    return 128, bm, 8, split_for(m, n, k, 128, bm, 8), warps, stages


def config_for(qtype: int, m: int, n: int, k: int, interpret: bool = False) -> tuple:
    if interpret:   # few, large programs: the interpreter's cost is per operation
        return (32, min(m_bucket(m), 64), 8, 1, 4, 1)
    hit = H200_CONFIGS.get(f"{REPACKED_TYPES[qtype]} {n}x{k} m{m_bucket(m)}")
    return tuple(hit) if hit else default_config(qtype, m, n, k)


# ---------------------------------------------------------------- wrapper

def qgemm_q8(q8rows, rw: Repacked, bias=None, out_dtype=torch.bfloat16, config=None, ws=None,
             interpret: bool = False) -> torch.Tensor:
    """out (M, N) = x_hat @ W^T [+ bias] for the repacked Q4_K/Q6_K weight W and M q8 rows
    (xq int32 (M, K/4), xf float32 (M, K/8): gemv_q8.quantize_rows). bias (N,) added in fp32.
    config = (BN, BM, CB, SPLIT, num_warps, num_stages[, asm]) overrides the table (sweeps); asm 0
    builds the weight bytes one by one (the interpreter's form) instead of 4 per PTX op. A split K
    takes its ticket counters from `ws` (anything with .counters(n) -> zeroed int32, e.g.
    gemv_repack.GemvWorkspace; the counters reset themselves) or a fresh zeroed buffer."""
    xq, xf = q8rows
    if rw.qtype not in (Q4_K, Q6_K):
        raise MinferError(f"qgemm_q8: ggml type {rw.qtype} has no int8 path (Q4_K, Q6_K only)")
    k, n = rw.k, rw.n
    if xq.dim() == 1:
        xq, xf = xq.view(1, -1), xf.view(1, -1)
    m = xq.shape[0]
    if (xq.dtype != torch.int32 or tuple(xq.shape) != (m, k // 4) or tuple(xf.shape) != (m, k // 8)
            or not xq.is_contiguous() or not xf.is_contiguous()):
        raise MinferError(f"qgemm_q8: q8 rows xq {tuple(xq.shape)} {xq.dtype} / xf {tuple(xf.shape)}, expected "
                          f"contiguous int32 ({m}, {k // 4}) / float32 ({m}, {k // 8}) for K = {k}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise MinferError(f"qgemm_q8: bias has shape {tuple(bias.shape)}, expected ({n},)")
    cfg = tuple(config or config_for(rw.qtype, m, n, k, interpret))
    bn, bm, cb, split, nwarps, stages = cfg[:6]
    asm = bool(cfg[6]) if len(cfg) > 6 else True
    if cb not in (1, 2, 4, 8):
        raise MinferError(f"qgemm_q8: config chunks per step {cb}, expected 1, 2, 4 or 8")
    nc = k // 32
    sps = triton.cdiv(triton.cdiv(nc, max(1, split)), cb)               # whole steps per split
    split = triton.cdiv(nc, sps * cb)                                   # no empty splits
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    mt = triton.cdiv(m, bm)
    grid = (mt, triton.cdiv(n, bn), split)
    part = torch.empty((split, m, n), dtype=torch.float32, device=xq.device) if split > 1 else out
    cnt = out
    if split > 1:
        need = grid[0] * grid[1]
        cnt = ws.counters(need) if ws is not None else torch.zeros(need, dtype=torch.int32, device=xq.device)
    if rw.tile_rows:
        raise MinferError("qgemm_q8: the planes are tile-major; this GEMM reads row-major planes")
    p = rw.planes
    p0, p1, p2, p3 = p if len(p) == 4 else (p[0], p[1], p[2], p[0])
    _qgemm_q8_kernel[grid](p0, p1, p2, p3, xq.view(torch.int8), xf, out, part, cnt,
                           bias if bias is not None else out, m, n, k // 256, out.stride(0), sps, split,
                           QT=rw.qtype, BN=bn, BM=bm, CB=cb, IS_SPLIT=split > 1, HAS_BIAS=bias is not None,
                           EVICT="evict_first" if mt == 1 else "", ASM=asm and not interpret, INTERP=interpret,
                           num_warps=nwarps, num_stages=stages)
    return out
