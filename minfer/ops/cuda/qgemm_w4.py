"""The "w4" planes of the batched-decode GEMM (ops/cuda/qgemm_w4_mma.py): Q4_K / Q6_K weights
in 5 / 7 bits per value, made so that two values decode at once in bf16x2 registers.

Why: the batch engine multiplied dense bf16 copies of every weight (runtime/dense_planes.py):
14.1 GB read per step on the 7B, 3.9 of a 5.1 ms step at 32 sequences (docs/perf-log.md N1,
N7). These planes hold the same weights in 5 / 7 bits. The two earlier kernels over the GEMV's
planes lost to cuBLAS because their decode cost 6.5-10 instructions per value (qgemm_repack:
exact fp32 values) or a per-chunk fp32 rescale (qgemm_q8; perf-log Q6, L4).

The decode (sm_90 PTX, in qgemm_w4_mma.py) works on pairs, about 2 SASS instructions per value:
  lop3      t = ((w >> 4i) & 0x000F000F) | 0x43004300    two bf16 128 + q (q < 64 is exact in bf16)
  sub       t = t - {128, 128}                            exact: q
  fma.rn    v = q * {s, s} + {-m, -m}                    rounded once to bf16
so a word holds its 8 values as 4 pairs, pair i's two values in nibbles i and i + 4 (the
interleave FasterTransformer and Marlin use for the same reason).

Word order ("fragment order"): each thread of the kernel loads exactly the values its MMA A
fragments hold (lane 4g + t: rows g and g + 8, and per 32 values of K the offsets 8i + 2t + e;
PTX ISA, "Matrix Fragments for mma.m16n8k16"). So per row, word 16 * step + 4t + c holds K
offsets 128 step + 32c + 8i + 2t + e (c: the 32-value chunk within a 128-value step, i: the pair,
e: its value), and a thread's 4 chunks of a step are one 16-byte load.

Planes (made on the GPU from the GEMV's planes, gemv_repack_layout.Repacked, at engine start):
  Q4_K: qw int32 (N, K/8)  the 4-bit values in the fragment order
        sm int32 (N, K/32) per 32-value sub-block: bf16 s = bf16(d * sc) in the low half and
                           bf16 -(dmin * m) rounded once (ggml: v = d*sc*q - dmin*m, ggml-quants.c
                           dequantize_row_q4_K)
  Q6_K: qw int32 (N, K/8)  the low 4 bits in the fragment order
        qh int16 (N, K/8)  the high 2 bits of the same 8 values: pair i's at bits 2i and 8 + 2i
        s  int32 (N, K/32) the chunk's two bf16(d * sc), K offsets 0-15 (low half) and 16-31; v =
                           (q - 32) d sc = q s - 32 s, and -32 s is exact in bf16 (ggml-quants.c
                           dequantize_row_q6_K)
Values differ from the dense bf16 plane's (one rounding of the fp32 value) by the rounding of
s and m to bf16 first: within 2^-7 of the largest value of their scale group (tests/ops/
test_qgemm_w4.py, against the gguf package).
A Triton kernel over planes of this decode lost on the GPU (Triton moved the decoded tile into the
MMA layout through shared memory, 16 rounds with 2 barriers per K step; perf-log W1; commit
15e8cd2 holds it), hence the Gluon kernel and this word order.
"""

from __future__ import annotations

import torch

from minfer.errors import MinferError
from minfer.ops.cuda.gemv_repack_layout import Q4_K, Q6_K, Repacked, to_rows


class W4Planes:
    """A weight's (or a group's) w4 planes; see the module doc."""

    def __init__(self, qtype: int, n: int, k: int, planes: tuple):
        self.qtype, self.n, self.k, self.planes = qtype, n, k, planes

    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.planes)

    def rows(self, r0: int, r1: int) -> "W4Planes":
        return W4Planes(self.qtype, r1 - r0, self.k, tuple(p[r0:r1] for p in self.planes))


# ---------------------------------------------------------------- planes (torch, any device)

def _fragment_words(q: torch.Tensor, bits: int) -> torch.Tensor:
    """q (R, K) small ints in K order -> (R, K/8) int64 words in the fragment order (module doc):
    word 16 step + 4t + c holds K offsets 128 step + 32c + 8i + 2t + e, pair i's e = 0 at bits*i
    and e = 1 at bits*(i + 4) (bits=4: the low nibbles; bits=2: Q6_K's high crumbs, 16 bits)."""
    r, k = q.shape
    v = q.to(torch.int64).view(r, k // 128, 4, 4, 4, 2).permute(0, 1, 4, 2, 3, 5)   # [R, step, t, c, i, e]
    sh = (torch.arange(4, device=q.device, dtype=torch.int64) * bits).view(1, 1, 1, 1, 4)
    return ((v[..., 0] << sh) | (v[..., 1] << (sh + 4 * bits))).sum(-1).reshape(r, k // 8)


def _s32(v: torch.Tensor) -> torch.Tensor:
    return (v - ((v >> 31) & 1) * (1 << 32)).to(torch.int32)


def _bf16_bits(v: torch.Tensor) -> torch.Tensor:
    """float32 -> the bf16 bits (round to nearest even, torch's cast) as int64 in 0..65535."""
    return v.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF


def _rows_to_w4(rw: Repacked, r0: int, r1: int) -> tuple:
    # (tile-major planes, gemv_repack_layout.to_tiles: the rows' tiles back in row-major order first)
    p = list(to_rows(rw.rows(r0, r1)).planes) if rw.tile_rows else [t[r0:r1] for t in rw.planes]
    r, nb = r1 - r0, rw.k // 256
    sh = torch.arange(8, device=p[0].device, dtype=torch.int64).view(1, 1, 8, 1)
    w = p[0].to(torch.int64).view(r, nb * 8, 1, 4) & 0xFFFFFFFF
    low = ((w >> (4 * sh)) & 15).reshape(r, rw.k)                          # value 4p + w of each chunk
    if rw.qtype == Q4_K:
        scm, dm = p[1].to(torch.int64) & 0xFFFF, p[2].float().view(r, nb, 2)
        dl = (dm[..., :1] * (scm & 255).float().view(r, nb, 8)).view(r, nb * 8)       # exact in fp32
        ml = (dm[..., 1:] * (scm >> 8).float().view(r, nb, 8)).view(r, nb * 8)
        sm = _s32(_bf16_bits(dl) | (_bf16_bits(-ml) << 16))
        return _s32(_fragment_words(low, 4)), sm
    h = (p[1].to(torch.int64) & 0xFFFF).view(r, nb * 8, 1, 4)
    high = ((h >> (2 * sh)) & 3).reshape(r, rw.k)
    hw = _fragment_words(high, 2)                                          # 16 bits per word
    hq = (hw - ((hw >> 15) & 1) * (1 << 16)).to(torch.int16)
    s = _bf16_bits((p[3].float().view(r, nb, 1) * p[2].float().view(r, nb, 16)).view(r, nb * 16))
    return _s32(_fragment_words(low, 4)), hq, _s32(s[:, 0::2] | (s[:, 1::2] << 16))


def make_w4(rw: Repacked, rows_per_step: int = 1024) -> W4Planes:
    """W4Planes from a weight's GEMV planes (same device), in row chunks (int64 temporaries)."""
    if rw.qtype not in (Q4_K, Q6_K) or rw.k % 256:
        raise MinferError(f"qgemm_w4: planes of ggml type {rw.qtype} with K={rw.k}; expected Q4_K/Q6_K, K % 256 == 0")
    parts = [_rows_to_w4(rw, r0, min(rw.n, r0 + rows_per_step)) for r0 in range(0, rw.n, rows_per_step)]
    planes = tuple(torch.cat([pt[i] for pt in parts]).contiguous() for i in range(len(parts[0])))
    return W4Planes(rw.qtype, rw.n, rw.k, planes)


def dequantize_w4(p: W4Planes) -> torch.Tensor:
    """float32 (n, k) values in K order, read from the planes as the kernel reads them: the bf16
    q * s + (-m) rounded once (float64 is exact before it). For tests."""
    n, k = p.n, p.k
    qw = p.planes[0].to(torch.int64) & 0xFFFFFFFF
    i4 = torch.arange(4, device=qw.device, dtype=torch.int64)
    q = torch.stack([(qw[..., None] >> (4 * i4)) & 15, (qw[..., None] >> (4 * i4 + 16)) & 15], -1)
    q = q.view(n, k // 128, 4, 4, 4, 2)                                 # [n, step, t, c, i, e]
    sw = p.planes[-1].to(torch.int64) & 0xFFFFFFFF                      # (n, k/32) per chunk
    lo = (sw & 0xFFFF).to(torch.int16).view(torch.bfloat16).double().view(n, k // 128, 1, 4, 1, 1)
    hi = (sw >> 16).to(torch.int16).view(torch.bfloat16).double().view(n, k // 128, 1, 4, 1, 1)
    if p.qtype == Q6_K:
        h = p.planes[1].to(torch.int64) & 0xFFFF
        hq = torch.stack([(h[..., None] >> (2 * i4)) & 3, (h[..., None] >> (2 * i4 + 8)) & 3], -1)
        q = q | (hq.view(n, k // 128, 4, 4, 4, 2) << 4)
        first = (i4 < 2).view(1, 1, 1, 1, 4, 1)                         # K offsets 0..15 of the chunk
        sc = torch.where(first, lo, hi)
        v = q.double() * sc - 32.0 * sc
    else:
        v = q.double() * lo + hi
    v = v.to(torch.bfloat16).float().permute(0, 1, 3, 4, 2, 5)          # [n, step, c, i, t, e]
    return v.reshape(n, k)
