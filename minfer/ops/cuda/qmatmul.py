"""linear() on CUDA: choose between the decode GEMV and dequantize-to-scratch + cuBLAS.

- M <= MINFER_GEMV_MAX_M (default 32: on the H200, run 1, the GEMV beat dequant+cuBLAS
  up to M=32 on the qkv and gate shapes): gemv.gemv reads the raw blocks once (memory-bound).
- larger M (prefill): the layer's blocks are decoded into a reused scratch of the
  activation dtype by dequant.dequantize_into (memory-bound, ~N*K*2 bytes written) and
  torch.matmul (cuBLAS) does the math; ANCHORS.md measured this at 49k tok/s of linear
  work for the 7B at M=3354 -- the baseline issue 7 starts from.
- A weight whose dtype already equals the activations' (BF16 file tensor, bf16 activations)
  is used in place by cuBLAS: no copy.
The scratch holds at most MINFER_SCRATCH_MB (default 256 MiB); larger weights (the 7B's
lm head, 152064 x 3584) are decoded and multiplied in row chunks that fit.

Switches (read at each call): MINFER_GEMV=0 sends small M through dequant + cuBLAS too;
MINFER_GEMV_MAX_M sets the crossover.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from minfer.errors import MinferError
from minfer.ops import paths
from minfer.ops.cuda import dequant, gemv

_scratch: dict = {}            # (device, dtype) -> 1-D tensor, reused by every layer
_largest_weight = [0]          # elements of the largest prepared weight (for the load report)


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def scratch_limit_elems(dtype) -> int:
    mb = paths.env_int("MINFER_SCRATCH_MB", 256)
    return max(1 << 20, mb * (1 << 20) // torch.empty((), dtype=dtype).element_size())


def note_weight(n_elems: int) -> None:
    """prepare_weight records each weight's size so the scratch can be reported at load."""
    _largest_weight[0] = max(_largest_weight[0], n_elems)


def planned_scratch_bytes(dtype=torch.bfloat16) -> int:
    """Bytes the prefill scratch will take for the weights prepared so far."""
    esize = torch.empty((), dtype=dtype).element_size()
    return min(_largest_weight[0], scratch_limit_elems(dtype)) * esize


def scratch_bytes() -> int:
    """Bytes of scratch allocated now (all dtypes, all devices)."""
    return sum(t.numel() * t.element_size() for t in _scratch.values())


def _get_scratch(n_elems: int, dtype, device) -> torch.Tensor:
    key = (str(device), dtype)
    buf = _scratch.get(key)
    if buf is None or buf.numel() < n_elems:
        want = max(n_elems, min(_largest_weight[0], scratch_limit_elems(dtype)))
        _scratch.pop(key, None)
        buf = torch.empty(want, dtype=dtype, device=device)
        _scratch[key] = buf
    return buf


def _float_view(w):
    """The weight as a dense (N, K) tensor viewing the raw bytes, for F32/F16/BF16 files."""
    dt = {dequant.F32: torch.float32, dequant.F16: torch.float16, dequant.BF16: torch.bfloat16}[w.qtype]
    return w.raw.view(dt).view(w.shape[0], w.shape[1])


def check_supported(w) -> None:
    if w.qtype not in dequant.LAYOUT:
        from minfer.quants import type_name
        raise MinferError(f"tensor '{w.name}': ggml type {type_name(w.qtype)} has no CUDA kernel in minfer "
                          f"(supported on cuda: {', '.join(v[0] for v in dequant.LAYOUT.values())}); "
                          f"use --device cpu")


def _prefill(x, w, bias, tname):
    """Dequantize (in row chunks that fit the scratch) and multiply with cuBLAS."""
    n, k = w.shape
    dtype = x.dtype
    if w.qtype in dequant.FLOAT_TYPES and _float_view(w).dtype == dtype:
        paths.count(f"qmatmul.{tname}.cublas_direct")
        return F.linear(x, _float_view(w), None if bias is None else bias.to(dtype))
    paths.count(f"qmatmul.{tname}.prefill")
    limit = scratch_limit_elems(dtype)
    rows = max(1, min(n, limit // k))
    if rows < n:
        # a whole number of 64-row groups per chunk keeps cuBLAS on its good tile sizes
        rows = max(64, rows // 64 * 64) if n >= 64 else n
    scratch = _get_scratch(rows * k, dtype, x.device)
    interp = _interpret()
    if rows >= n:
        wd = scratch[: n * k].view(n, k)
        dequant.dequantize_into(w.raw, w.qtype, n, k, wd, interpret=interp)
        return F.linear(x, wd, None if bias is None else bias.to(dtype))
    out = torch.empty((x.shape[0], n), dtype=dtype, device=x.device)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        wd = scratch[: (r1 - r0) * k].view(r1 - r0, k)
        dequant.dequantize_into(w.raw[r0:r1], w.qtype, r1 - r0, k, wd, interpret=interp)
        torch.matmul(x, wd.t(), out=out[:, r0:r1])
    if bias is not None:
        out += bias.to(dtype)
    return out


def linear(x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, K) @ W (N, K)^T + bias (N,) -> (T, N) in x's dtype."""
    check_supported(w)
    n, k = w.shape
    if x.shape[-1] != k:
        raise MinferError(f"tensor '{w.name}': input has {x.shape[-1]} features, the weight expects {k}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    tname = dequant.type_name(w.qtype)
    m = x.shape[0]
    if m <= paths.env_int("MINFER_GEMV_MAX_M", 32):
        path = f"qmatmul.{tname}.decode"
        if paths.enabled("MINFER_GEMV"):
            paths.count(path)
            return gemv.gemv(x, w.raw, w.qtype, n, k, bias=bias, interpret=_interpret())
        paths.switched_off(path, "MINFER_GEMV")
    return _prefill(x, w, bias, tname)
