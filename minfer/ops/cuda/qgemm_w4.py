"""Batched-decode GEMM over 4/6-bit "w4" planes: out (M, N) = x (M, K) @ W^T for 8 < M <= 256.

Why: the batch engine multiplied dense bf16 copies of every weight (runtime/dense_planes.py):
14.1 GB read per step on the 7B, cuBLAS streaming them at ~3.6 TB/s, 3.9 of a 5.1 ms step at
32 sequences (docs/perf-log.md N1, N7). These planes hold the same weights in 5 / 7 bits per
value (~4.9 GB for the 7B). The two earlier kernels over the GEMV planes lost to cuBLAS because
their decode cost 6.5-10 instructions per value (qgemm_repack: exact fp32 values) or a per-chunk
fp32 rescale of the int32 MMA result (qgemm_q8); see docs/perf-log.md Q6, L4.

The decode here works on two values at a time in bf16x2 registers (sm_90 PTX), about 2 SASS
instructions per value:
  lop3      t = ((w >> 4i) & 0x000F000F) | 0x43004300    two bf16 128 + q (q < 64 is exact in bf16)
  sub       t = t - {128, 128}                            exact: q
  fma.rn    v = q * {s, s} + {-m, -m}                    rounded once to bf16
so each word must hold its 8 values as pairs: nibble i = value 2i, nibble i + 4 = value 2i + 1
(the interleave FasterTransformer and Marlin use for the same reason).

Planes (made on the GPU from the GEMV's planes, gemv_repack_layout.Repacked, at engine start):
  Q4_K: qw int32 (N, K/8)  word j: values 8j..8j+7 interleaved as above
        sm int32 (N, K/32) per 32-value sub-block: bf16 s = bf16(d * sc) in the low half and
                           bf16 -(dmin * m) rounded once (ggml: v = d*sc*q - dmin*m, ggml-quants.c
                           dequantize_row_q4_K)
  Q6_K: qw int32 (N, K/8)  the low 4 bits, interleaved as above
        qh int16 (N, K/8)  the high 2 bits: value 2i at bits 2i, value 2i + 1 at bits 8 + 2i
        s  bf16  (N, K/16) bf16(d * sc) per 16 values; v = (q - 32) d sc = q s - 32 s, and
                           -32 s is exact in bf16 (ggml-quants.c dequantize_row_q6_K)
Values differ from the dense bf16 plane's (one rounding of the fp32 value) by the rounding of
s and m to bf16 first: at most about 2^-9 (15 s + m) per value (tests measure it against the
gguf package's float32 values, and the logits against the dense path).

Shape (swap-AB): the MMA's M dimension is BN weight rows, its N the batch rows (BM = 16..128),
K BK values per iteration. Split K (too few row tiles to fill the GPU): fp32 partials and the
last program of a tile (an atomic ticket) sums them in split order: deterministic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minfer.errors import MinferError
from minfer.ops.cuda.gemv_repack import _finish as _epilogue
from minfer.ops.cuda.gemv_repack_layout import Q4_K, Q6_K, Repacked

MAX_M = 256
_TARGET_PROGRAMS = 132 * 2            # two programs per H200 SM before K is split


class W4Planes:
    """A weight's (or a group's) w4 planes; see the module doc."""

    def __init__(self, qtype: int, n: int, k: int, planes: tuple):
        self.qtype, self.n, self.k, self.planes = qtype, n, k, planes

    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.planes)

    def rows(self, r0: int, r1: int) -> "W4Planes":
        return W4Planes(self.qtype, r1 - r0, self.k, tuple(p[r0:r1] for p in self.planes))


# ---------------------------------------------------------------- planes (torch, any device)

def _interleave(q: torch.Tensor, bits: int) -> torch.Tensor:
    """q (R, K) small ints in K order -> (R, K/8) int64 words: value 8j + 2i at bits*i, value
    8j + 2i + 1 at bits*(i + 4) (bits=4: the low nibbles; bits=2 gives the crumbs' 16-bit form)."""
    q = q.to(torch.int64).view(q.shape[0], -1, 4, 2)                      # [R, word, i, parity]
    sh = (torch.arange(4, device=q.device, dtype=torch.int64) * bits).view(1, 1, 4)
    return ((q[..., 0] << sh) | (q[..., 1] << (sh + 4 * bits))).sum(-1)


def _s32(v: torch.Tensor) -> torch.Tensor:
    return (v - ((v >> 31) & 1) * (1 << 32)).to(torch.int32)


def _bf16_bits(v: torch.Tensor) -> torch.Tensor:
    """float32 -> the bf16 bits (round to nearest even, torch's cast) as int64 in 0..65535."""
    return v.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF


def _rows_to_w4(rw: Repacked, r0: int, r1: int) -> tuple:
    p = [t[r0:r1] for t in rw.planes]
    r, nb = r1 - r0, rw.k // 256
    sh = torch.arange(8, device=p[0].device, dtype=torch.int64).view(1, 1, 8, 1)
    w = p[0].to(torch.int64).view(r, nb * 8, 1, 4) & 0xFFFFFFFF
    low = ((w >> (4 * sh)) & 15).reshape(r, rw.k)                          # value 4p + w of each chunk
    if rw.qtype == Q4_K:
        scm, dm = p[1].to(torch.int64) & 0xFFFF, p[2].float().view(r, nb, 2)
        dl = (dm[..., :1] * (scm & 255).float().view(r, nb, 8)).view(r, nb * 8)       # exact in fp32
        ml = (dm[..., 1:] * (scm >> 8).float().view(r, nb, 8)).view(r, nb * 8)
        sm = _s32(_bf16_bits(dl) | (_bf16_bits(-ml) << 16))
        return _s32(_interleave(low, 4)), sm
    h = (p[1].to(torch.int64) & 0xFFFF).view(r, nb * 8, 1, 4)
    high = ((h >> (2 * sh)) & 3).reshape(r, rw.k)
    hw = _interleave(high, 2)                                              # 16 bits per word
    hq = (hw - ((hw >> 15) & 1) * (1 << 16)).to(torch.int16)
    s = (p[3].float().view(r, nb, 1) * p[2].float().view(r, nb, 16)).view(r, nb * 16).to(torch.bfloat16)
    return _s32(_interleave(low, 4)), hq, s


def make_w4(rw: Repacked, rows_per_step: int = 2048) -> W4Planes:
    """W4Planes from a weight's GEMV planes (same device), in row chunks (int64 temporaries)."""
    if rw.qtype not in (Q4_K, Q6_K) or rw.k % 256:
        raise MinferError(f"qgemm_w4: planes of ggml type {rw.qtype} with K={rw.k}; expected Q4_K/Q6_K, K % 256 == 0")
    parts = [_rows_to_w4(rw, r0, min(rw.n, r0 + rows_per_step)) for r0 in range(0, rw.n, rows_per_step)]
    planes = tuple(torch.cat([pt[i] for pt in parts]).contiguous() for i in range(len(parts[0])))
    return W4Planes(rw.qtype, rw.n, rw.k, planes)


def dequantize_w4(p: W4Planes) -> torch.Tensor:
    """float32 (n, k) values the kernel multiplies (the bf16 fma's result), from the planes alone:
    q * s + (-m) rounded once to bf16 (float64 is exact here). For tests and the validator."""
    qw = p.planes[0].to(torch.int64) & 0xFFFFFFFF
    n, kw = qw.shape
    i = torch.arange(4, device=qw.device, dtype=torch.int64)
    even = (qw[..., None] >> (4 * i)) & 15                                 # values 2i
    odd = (qw[..., None] >> (4 * i + 16)) & 15                             # values 2i + 1
    q = torch.stack([even, odd], -1).view(n, p.k)
    if p.qtype == Q4_K:
        sm = p.planes[1].to(torch.int64) & 0xFFFFFFFF
        s = (sm & 0xFFFF).to(torch.int16).view(torch.bfloat16).double()
        negm = (sm >> 16).to(torch.int16).view(torch.bfloat16).double()
        g = 32
    else:
        h = p.planes[1].to(torch.int64) & 0xFFFF
        q = q | (torch.stack([(h[..., None] >> (2 * i)) & 3, (h[..., None] >> (2 * i + 8)) & 3], -1).view(n, p.k) << 4)
        s = p.planes[2].double()
        negm = -32.0 * s
        g = 16
    v = q.double().view(n, -1, g) * s[..., None] + negm[..., None]
    return v.view(n, p.k).to(torch.bfloat16).float()


# ---------------------------------------------------------------- the kernel

# PTX (sm_90: sub/mul.bf16x2 need it). $8 = word, then the scale operands and the constants
# (kernel arguments, so that they sit in registers and each and-or stays one LOP3: an immediate
# pair cost an extra move per use); outputs $0..$7 = the word's values 0..7 as bf16 bits.
# Pair i (values 2i, 2i + 1) = nibbles i and i + 4.
_PAIR4 = """
    lop3.b32 t, {src}, $10, $11, 0xEA;
    sub.bf16x2 t, t, $11;
    fma.rn.bf16x2 t, t, s2, m2;
    mov.b32 {{{o0}, {o1}}}, t;"""

_ASM_Q4 = tl.constexpr("{\n .reg .b32 t, u, s2, m2;\n"
           " prmt.b32 s2, $9, 0, 0x1010;\n prmt.b32 m2, $9, 0, 0x3232;"
           + _PAIR4.format(src="$8", o0="$0", o1="$1")
           + "\n shr.b32 u, $8, 4;" + _PAIR4.format(src="u", o0="$2", o1="$3")
           + "\n shr.b32 u, $8, 8;" + _PAIR4.format(src="u", o0="$4", o1="$5")
           + "\n shr.b32 u, $8, 12;" + _PAIR4.format(src="u", o0="$6", o1="$7")
           + "\n}")

# Q6_K: the high crumbs of pair i moved to bits 4-5 / 20-21 and or-ed in (a second lop3);
# $9 = the 16-bit crumbs, $10 = bf16 s; -32 s by one exact bf16x2 multiply.
_PAIR6 = """
    {shift}
    lop3.b32 t, {src}, $11, $12, 0xEA;
    lop3.b32 t, v, $13, t, 0xEA;
    sub.bf16x2 t, t, $12;
    fma.rn.bf16x2 t, t, s2, m2;
    mov.b32 {{{o0}, {o1}}}, t;"""

_ASM_Q6 = tl.constexpr("{\n .reg .b32 t, u, v, hh, s2, m2;\n"
           " mov.b32 s2, {$10, $10};\n mul.rn.bf16x2 m2, s2, $14;\n"
           " cvt.u32.u16 hh, $9;\n prmt.b32 hh, hh, 0, 0x4140;"
           + _PAIR6.format(shift="shl.b32 v, hh, 4;", src="$8", o0="$0", o1="$1")
           + "\n shr.b32 u, $8, 4;" + _PAIR6.format(shift="shl.b32 v, hh, 2;", src="u", o0="$2", o1="$3")
           + "\n shr.b32 u, $8, 8;" + _PAIR6.format(shift="mov.b32 v, hh;", src="u", o0="$4", o1="$5")
           + "\n shr.b32 u, $8, 12;" + _PAIR6.format(shift="shr.b32 v, hh, 2;", src="u", o0="$6", o1="$7")
           + "\n}")


@triton.jit
def _join8(v0, v1, v2, v3, v4, v5, v6, v7):
    """[..., 2, 2, 2] with v_p at [..., p // 4, p // 2 % 2, p % 2] (joins add minor axes)."""
    return tl.join(tl.join(tl.join(v0, v4), tl.join(v2, v6)), tl.join(tl.join(v1, v5), tl.join(v3, v7)))


@triton.jit
def _bf16(v):
    """float64 -> bf16 rounded once (the interpreter's fp32 -> bf16 cast truncates): round to
    nearest even on the float32 bits of v, which is exact here (at most 18 significant bits)."""
    bits = v.to(tl.float32).to(tl.int32, bitcast=True)
    r = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return r.to(tl.float32, bitcast=True)


@triton.jit
def _decode_interp(w, h, s, HIGH: tl.constexpr):
    """The asm's values in float32 (already bf16-exact), for Triton's interpreter (no PTX)."""
    vals = []
    if HIGH:
        sd = s.to(tl.float64)
        md = sd * -32.0
    else:
        sd = (s & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float64)
        md = ((s >> 16) & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float64)
    q0 = w & 15
    q1 = (w >> 4) & 15
    q2 = (w >> 8) & 15
    q3 = (w >> 12) & 15
    q4 = (w >> 16) & 15
    q5 = (w >> 20) & 15
    q6 = (w >> 24) & 15
    q7 = (w >> 28) & 15
    if HIGH:
        hi = h.to(tl.int32) & 0xFFFF
        q0 = q0 | ((hi & 3) << 4)
        q1 = q1 | (((hi >> 2) & 3) << 4)
        q2 = q2 | (((hi >> 4) & 3) << 4)
        q3 = q3 | (((hi >> 6) & 3) << 4)
        q4 = q4 | (((hi >> 8) & 3) << 4)
        q5 = q5 | (((hi >> 10) & 3) << 4)
        q6 = q6 | (((hi >> 12) & 3) << 4)
        q7 = q7 | (((hi >> 14) & 3) << 4)
    # nibble i = value 2i, nibble i + 4 = value 2i + 1
    return _join8(_bf16(q0.to(tl.float64) * sd + md), _bf16(q4.to(tl.float64) * sd + md),
                  _bf16(q1.to(tl.float64) * sd + md), _bf16(q5.to(tl.float64) * sd + md),
                  _bf16(q2.to(tl.float64) * sd + md), _bf16(q6.to(tl.float64) * sd + md),
                  _bf16(q3.to(tl.float64) * sd + md), _bf16(q7.to(tl.float64) * sd + md))


@triton.jit
def _decode_asm(w, h, s, HIGH: tl.constexpr):
    if HIGH:
        v = tl.inline_asm_elementwise(_ASM_Q6, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h,r,r,r,r",
                                      [w, h, s, 0x000F000F, 0x43004300, 0x00300030, -1040137728],
                                      dtype=(tl.int16,) * 8, is_pure=True, pack=1)
    else:
        v = tl.inline_asm_elementwise(_ASM_Q4, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r", [w, s, 0x000F000F, 0x43004300],
                                      dtype=(tl.int16,) * 8, is_pure=True, pack=1)
    return _join8(v[0].to(tl.bfloat16, bitcast=True), v[1].to(tl.bfloat16, bitcast=True),
                  v[2].to(tl.bfloat16, bitcast=True), v[3].to(tl.bfloat16, bitcast=True),
                  v[4].to(tl.bfloat16, bitcast=True), v[5].to(tl.bfloat16, bitcast=True),
                  v[6].to(tl.bfloat16, bitcast=True), v[7].to(tl.bfloat16, bitcast=True))


@triton.jit
def _w4_kernel(qw, qh, sp, x, out, part, cnt, bias, resid,
               M, N, K, stride_w, stride_s, stride_xm, stride_rm, stride_om, steps_per_split, SPLIT,
               HIGH: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
               IS_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESID: tl.constexpr,
               EVICT: tl.constexpr, XA: tl.constexpr, INTERP: tl.constexpr):
    """Program (M tile, row tile, K split): acc [BN, BM] = W[rows, K range] @ x[mcols, K range]^T."""
    W: tl.constexpr = BK // 8                                          # words per row and K step
    G: tl.constexpr = 16 if HIGH else 32                               # values per scale
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    rows = pid_n * BN + tl.arange(0, BN)
    rmask = rows < N
    # rows past N (and batch rows past M) read the last valid one: no masks on the hot loads
    row2 = tl.minimum(rows, N - 1).to(tl.int64)[:, None]
    mcol = pid_m * BM + tl.arange(0, BM)
    mmask = mcol < M
    xrow = tl.minimum(mcol, M - 1).to(tl.int64)[:, None] * stride_xm
    wj = tl.arange(0, W)
    kv = tl.arange(0, BK)
    k_lo = pid_s * steps_per_split * BK
    k_hi = tl.minimum(k_lo + steps_per_split * BK, K)
    if XA:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
    else:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        widx = k0 // 8 + wj                                           # [W] word index in the row
        w = tl.load(qw + row2 * stride_w + widx[None, :], eviction_policy=EVICT)
        if HIGH:
            h = tl.load(qh + row2 * stride_w + widx[None, :], eviction_policy=EVICT)
            s = tl.load(sp + row2 * stride_s + (widx // 2)[None, :], eviction_policy=EVICT)
        else:
            h = w
            s = tl.load(sp + row2 * stride_s + (widx // 4)[None, :], eviction_policy=EVICT)
        xb = tl.load(x + xrow + (k0 + kv)[None, :], eviction_policy="evict_last")
        if INTERP:
            wt = tl.reshape(_decode_interp(w, h, s, HIGH), (BN, BK))
            if XA:
                acc = tl.dot(xb.to(tl.float32), tl.trans(wt), acc, input_precision="ieee")
            else:
                acc = tl.dot(wt, tl.trans(xb.to(tl.float32)), acc, input_precision="ieee")
        else:
            if HIGH:
                s = s.to(tl.int16, bitcast=True)
            wt = tl.reshape(_decode_asm(w, h, s, HIGH), (BN, BK))
            if XA:
                acc = tl.dot(xb, tl.trans(wt), acc)
            else:
                acc = tl.dot(wt, tl.trans(xb), acc)
    if XA:
        acc = tl.trans(acc)
    if not IS_SPLIT:
        _epilogue(acc, rows, rmask, mcol, mmask, bias, resid, out, stride_rm, stride_om, HAS_BIAS, HAS_RESID)
    else:
        poff = (pid_s * M + mcol[None, :]).to(tl.int64) * N + rows[:, None]
        pm = rmask[:, None] & mmask[None, :]
        tl.store(part + poff, acc, mask=pm)
        # the last split of a tile to finish sums all partials in split order (deterministic);
        # a CTA barrier, then one acq_rel ticket per program, orders the partial stores before it
        tl.debug_barrier()
        tile = pid_n * tl.num_programs(0) + pid_m
        ticket = tl.atomic_add(cnt + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT - 1:
            tot = tl.zeros([BN, BM], dtype=tl.float32)
            for sp_ in range(SPLIT):
                o2 = (sp_ * M + mcol[None, :]).to(tl.int64) * N + rows[:, None]
                tot += tl.load(part + o2, mask=pm, other=0.0, cache_modifier=".cg")
            _epilogue(tot, rows, rmask, mcol, mmask, bias, resid, out, stride_rm, stride_om, HAS_BIAS, HAS_RESID)
            tl.atomic_xchg(cnt + tile, 0)                              # ready for the next launch (graph replays)


# ---------------------------------------------------------------- configs and wrapper

def m_bucket(m: int) -> int:
    for b in (16, 32, 64, 128):
        if m <= b:
            return b
    return 256


def default_config(qtype: int, m: int, n: int, k: int) -> tuple:
    """(BN, BM, BK, SPLIT, num_warps, num_stages): all batch rows in one M tile up to 64 (each M
    tile decodes the weights again), 128 weight rows per program, K split until ~2 programs
    per SM."""
    bm = min(m_bucket(m), 128)
    bn, bk, warps, stages = 128, 128, 4, 4
    return bn, bm, bk, split_for(m, n, k, bn, bm, bk), warps, stages


def split_for(m: int, n: int, k: int, bn: int, bm: int, bk: int) -> int:
    """K splits so that row tiles x M tiles x splits reaches ~_TARGET_PROGRAMS (at most 16, at
    least two K steps each)."""
    tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
    return 1 if tiles >= _TARGET_PROGRAMS else max(1, min(k // (2 * bk), triton.cdiv(_TARGET_PROGRAMS, tiles), 16))


def qgemm_w4(x: torch.Tensor, p: W4Planes, bias=None, resid=None, out_dtype=None, config=None, ws=None,
             xa: bool = True, interpret: bool = False) -> torch.Tensor:
    """out (M, N) = x @ W^T [+ bias] [+ resid] over w4 planes; x (M, K) bf16 with contiguous rows
    (float32 in the interpreter). config overrides the default (sweeps); a split K takes its
    ticket counters from ws (.counters(n) -> zeroed int32 that reset themselves) or a fresh one."""
    m, k = x.shape
    n = p.n
    if k != p.k or x.stride(1) != 1:
        raise MinferError(f"qgemm_w4: x of shape {tuple(x.shape)} (strides {x.stride()}), expected (M, {p.k}) "
                          f"with contiguous rows")
    if bias is not None and tuple(bias.shape) != (n,):
        raise MinferError(f"qgemm_w4: bias has shape {tuple(bias.shape)}, expected ({n},)")
    if resid is not None and (tuple(resid.shape) != (m, n) or resid.stride(1) != 1):
        raise MinferError(f"qgemm_w4: resid has shape {tuple(resid.shape)}, expected ({m}, {n}) with contiguous rows")
    if interpret:
        config = config or (32, min(m_bucket(m), 64), 256, 1, 4, 1)
    bn, bm, bk, split, nwarps, stages = tuple(config or default_config(p.qtype, m, n, k))
    if split == 0:                                                      # (sweeps) the default split
        split = split_for(m, n, k, bn, bm, bk)
    if k % bk:
        raise MinferError(f"qgemm_w4: K={k} is not a multiple of the config's K step {bk}")
    steps = k // bk
    sps = triton.cdiv(steps, max(1, split))
    split = triton.cdiv(steps, sps)                                     # no empty splits
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    mt = triton.cdiv(m, bm)
    grid = (mt, triton.cdiv(n, bn), split)
    part, cnt = out, out
    if split > 1:
        part = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
        need = grid[0] * grid[1]
        cnt = ws.counters(need) if ws is not None else torch.zeros(need, dtype=torch.int32, device=x.device)
    high = p.qtype == Q6_K
    qw = p.planes[0]
    qh = p.planes[1] if high else qw
    sp = p.planes[2] if high else p.planes[1]
    _w4_kernel[grid](qw, qh, sp, x, out, part, cnt, bias if bias is not None else out,
                     resid if resid is not None else out, m, n, k, qw.stride(0), sp.stride(0), x.stride(0),
                     resid.stride(0) if resid is not None else 0, out.stride(0), sps, split,
                     HIGH=high, BN=bn, BM=bm, BK=bk, IS_SPLIT=split > 1, HAS_BIAS=bias is not None,
                     HAS_RESID=resid is not None, EVICT="evict_first" if mt == 1 else "",
                     XA=xa, INTERP=interpret, num_warps=nwarps, num_stages=stages)
    return out
