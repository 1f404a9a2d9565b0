"""The CPU fast path for matmuls: weights requantized at load to per-channel int8, so a decode
step reads 8 bits per weight instead of the reference's 32.

Why this format (measured on the 2-core CI machine's kind, Qwen2.5-0.5B shapes, docs/perf-log.md
"CPU decode"): a decode step is a chain of matrix-vector products, bound by the bytes of weight
read. torch's weight-only int8 kernel (`aten._weight_int8pack_mm`: bf16 activations, int8 weights,
one bf16 scale per output row; AVX-512 on x86) read the 0.5B's matrices in about half the time of
float32 or bf16 dense `F.linear`; its int4 sibling (`_weight_int4pack_mm_for_cpu`) was as fast or
faster but cannot hold Q5_0/Q8_0/Q6_K blocks (55% + 30% + 9% of the 0.5B's bytes) without a
second, coarser rounding, where per-channel int8 is finer than those blocks' own steps in
most rows. Both kernels take float32 inputs only through a scalar loop, hence bf16 activations.

    w.packed = pack(w)              # at load (Engine.load, switch MINFER_CPU_QUANT, on by default)
    y = linear(x, w, bias)          # (T, K) float32 -> (T, N) float32

- T <= DECODE_MAX_M rows (decode, short prompts): the int8 kernel.
- more rows (prefill): the int8 rows dequantized to bf16 and one bf16 GEMM (oneDNN; AMX where
  the CPU has it), faster than the int8 kernel past ~32 rows and than float32 MKL at 512.
- the output (vocabulary) projection: its result comes back in bf16, too coarse for logits
  (a step of 0.125 at 16-32), so the REFINE_TOP largest logits of each row are recomputed in
  float32 from the same int8 rows; greedy choices and the probability mass that matters are
  then those of the int8 weights in float32 arithmetic. Prefill's all-row logits (perplexity)
  use a float32 GEMM of the dequantized int8 rows.

Requantizing changes numerics slightly (Q5_0's per-32 steps vs one step per row); the float32
reference (MINFER_CPU_QUANT=0) stays the path every kernel and golden is checked against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

DECODE_MAX_M = 16   # rows up to which the int8 kernel beats dequantize + bf16 GEMM (measured crossover ~32)
REFINE_TOP = 64     # logits per row recomputed in float32 after the bf16 vocabulary projection


@dataclass(eq=False)
class Int8Weight:
    """Per-output-row int8 weights: w[n, k] ~= q[n, k] * scale[n]."""

    q: torch.Tensor            # (N, K) int8
    scale: torch.Tensor        # (N,) bfloat16, what the kernel multiplies by
    refine_top: int = 0        # > 0 on the vocabulary projection (see the module docstring)

    def nbytes(self) -> int:
        return self.q.numel() + 2 * self.scale.numel()

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        return self.q.to(dtype) * self.scale.to(dtype)[:, None]


def pack(w, refine_top: int = 0) -> Int8Weight:
    """The int8 form of QWeight w, from its dense float32 matrix (or its blocks when it has none).

    The scale is rounded to bf16 first and q is computed against that rounded scale, so that
    q * scale (what the kernel computes with) is the closest int8 grid to the weights."""
    dense = w.dense if w.dense is not None else w.dequantize_rows(torch.arange(w.shape[0]))
    dense = dense.float()
    amax = dense.abs().amax(dim=1)
    scale = (amax / 127.0).clamp_min(torch.finfo(torch.bfloat16).tiny).to(torch.bfloat16)
    q = torch.round(dense / scale.float()[:, None]).clamp_(-128, 127).to(torch.int8)
    return Int8Weight(q.contiguous(), scale.contiguous(), refine_top)


def linear(x: torch.Tensor, p: Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, K) float32 @ (q * scale)^T + bias -> (T, N) float32."""
    T = x.shape[0]
    if T > DECODE_MAX_M:
        from minfer.ops import paths

        if p.refine_top:      # all-row logits (perplexity): float32, as exact as the int8 rows allow
            paths.count("cpu.int8.logits_f32")
            y = F.linear(x.float(), p.dequantize(torch.float32))
        else:
            paths.count("cpu.int8.prefill_bf16")
            y = F.linear(x.to(torch.bfloat16), p.dequantize(torch.bfloat16)).float()
    else:
        from minfer.ops import paths

        paths.count("cpu.int8.decode")
        y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), p.q, p.scale).float()
        if p.refine_top:
            y = _refine(x.float(), p, y)
    if bias is not None:
        y = y + bias.float()
    return y


def _refine(x: torch.Tensor, p: Int8Weight, y: torch.Tensor) -> torch.Tensor:
    """Recompute each row's top logits in float32 from the int8 rows: (T, N) float32."""
    k = min(p.refine_top, y.shape[1])
    idx = y.topk(k, dim=1).indices                                   # (T, k)
    rows = p.q[idx].float() * p.scale[idx].float()[..., None]        # (T, k, K)
    exact = torch.bmm(rows, x[:, :, None]).squeeze(2)                # (T, k)
    return y.scatter(1, idx, exact)


def prepare_model(model) -> int:
    """Pack every matrix of a CPU model that a matmul reads and drop its dense float32 copy (an
    embedding's rows are then decoded from the file's blocks, exactly, as an untied embedding's
    always are). An untied embedding table, only gathered from, is left alone. Returns the bytes
    held by the int8 forms. The vocabulary projection gets the float32 refinement of its top
    logits."""
    output = getattr(model, "output", None)
    embd = getattr(model, "token_embd", None)
    total = 0
    for w in model.qweights():
        if w is embd and w is not output:
            continue
        w.packed = pack(w, REFINE_TOP if w is output else 0)
        w.dense = None
        total += w.packed.nbytes()
    return total
