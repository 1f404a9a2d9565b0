"""LayerNorm without bias as a Triton kernel (command-r, cohere2): one program per row, float32
math, the output in the dtype asked.

    y = (x - mean(x)) * rsqrt(mean((x - mean(x))^2) + eps) * weight

The formula is the reference's (minfer/ops/reference.py layer_norm, after ggml's CPU ggml_norm:
the mean, then the variance of the centred values, then the scale; llama.cpp build_norm LLM_NORM).
A weight of G rows serves rows r with weight[r % G] (Command-R+'s per-head q/k norms).
Launch path: `layer_norm.triton`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minfer.errors import MinferError
from minfer.ops import paths


@triton.jit
def _layer_norm_kernel(x, w, out, D, G, stride_x, stride_o, eps, BD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BD)
    dm = d < D
    v = tl.load(x + row * stride_x + d, mask=dm, other=0.0).to(tl.float32)
    mean = tl.sum(v, axis=0) / D
    c = tl.where(dm, v - mean, 0.0)
    r = 1.0 / tl.sqrt(tl.sum(c * c, axis=0) / D + eps)
    g = tl.load(w + (row % G) * D + d, mask=dm, other=0.0).to(tl.float32)
    tl.store(out + row * stride_o + d, (c * r * g).to(out.dtype.element_ty), mask=dm)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype=None) -> torch.Tensor:
    """x (N, D) -> LayerNorm(x) * weight (N, D) in out_dtype (None: x's dtype); weight (D,) or (G, D)."""
    n, d = x.shape
    g = 1 if weight.dim() == 1 else weight.shape[0]
    if weight.shape[-1] != d or n % g:
        raise MinferError(f"layer_norm: weight {tuple(weight.shape)} does not fit rows {tuple(x.shape)}")
    paths.count("layer_norm.triton")
    if x.stride(-1) != 1:
        x = x.contiguous()
    weight = weight.contiguous()
    out = torch.empty((n, d), dtype=out_dtype or x.dtype, device=x.device)
    bd = triton.next_power_of_2(d)
    _layer_norm_kernel[(n,)](x, weight, out, d, g, x.stride(0), out.stride(0), float(eps), BD=bd,
                             num_warps=4 if bd <= 2048 else 8)
    return out
