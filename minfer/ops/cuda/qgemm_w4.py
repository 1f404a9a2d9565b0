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
so each word holds its 8 values as pairs: nibble i = value 2i, nibble i + 4 = value 2i + 1 (the
interleave FasterTransformer and Marlin use for the same reason). A Triton kernel over these
planes lost on the GPU (Triton moved the decoded tile into the MMA layout through shared memory,
16 rounds with 2 barriers per K step; perf-log W1; commit 15e8cd2 holds it); the Gluon kernel
reads them in its own word order (qgemm_w4_mma.to_fragment_order).

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
s and m to bf16 first: within 2^-7 of the largest value of their scale group (tests/ops/
test_qgemm_w4.py, against the gguf package), and the logits are checked end to end against the
dense path by the GPU suite's batching tests.
"""

from __future__ import annotations

import torch

from minfer.errors import MinferError
from minfer.ops.cuda.gemv_repack_layout import Q4_K, Q6_K, Repacked


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
