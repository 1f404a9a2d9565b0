"""Dequantize GGUF blocks with plain torch ops, on whatever device the bytes are on.

Used by the torch peer to turn the 7B's 4.4 GB of blocks into bf16 on the GPU in seconds
(numpy on the CPU takes minutes). Written from the block layouts (ggml-common.h, and
ggml-quants.c dequantize_row_*) independently of the engine's kernels; block sizes come from
minfer.quants (the one table of them); tests/bench compares it with the gguf package's decoder. Types not listed here fall back to
minfer.quants on the CPU.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from gguf import GGMLQuantizationType as T


def _f16(b: torch.Tensor) -> torch.Tensor:
    """(n, 2) uint8 little-endian halves -> (n, 1) float32."""
    return b.contiguous().view(torch.float16).float()


def _q8_0(b):   # block 34 B: d f16 | qs int8[32];  y = d * q
    return _f16(b[:, :2]) * b[:, 2:].contiguous().view(torch.int8).float()


def _q4_0(b):   # block 18 B: d f16 | qs[16];  y[j] = d*(lo_j - 8), y[j+16] = d*(hi_j - 8)
    qs = b[:, 2:]
    q = torch.cat([qs & 0xF, qs >> 4], dim=1).float() - 8
    return _f16(b[:, :2]) * q


def _q5_0(b):   # block 22 B: d f16 | qh u32 (bit j = 5th bit of value j) | qs[16]
    qh = b[:, 2:6].long()
    qh = qh[:, 0] | (qh[:, 1] << 8) | (qh[:, 2] << 16) | (qh[:, 3] << 24)          # (n,)
    bits = (qh[:, None] >> torch.arange(32, device=b.device)) & 1                  # (n, 32)
    qs = b[:, 6:]
    q = torch.cat([qs & 0xF, qs >> 4], dim=1).long() | (bits << 4)
    return _f16(b[:, :2]) * (q - 16).float()


def _q4_k(b):
    """block 144 B: d f16 | dmin f16 | scales[12] (8 6-bit scales + 8 6-bit mins) | qs[128].
    Sub-block j (32 values): y = d * sc[j] * q - dmin * m[j]; qs chunk c (32 bytes) holds
    sub-block 2c in its low nibbles and 2c+1 in its high nibbles."""
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    s = b[:, 4:16].long()
    # ggml-quants.c get_scale_min_k4
    sc = torch.cat([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], dim=1)   # (n, 8)
    m = torch.cat([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], dim=1)      # (n, 8)
    qs = b[:, 16:].reshape(-1, 4, 32)
    q = torch.stack([qs & 0xF, qs >> 4], dim=2).reshape(-1, 8, 32).float()                # (n, 8, 32)
    y = (d * sc.float())[:, :, None] * q - (dmin * m.float())[:, :, None]
    return y.reshape(-1, 256)


def _q6_k(b):
    """block 210 B: ql[128] (low 4 bits) | qh[64] (high 2 bits) | scales int8[16] | d f16.
    Per half h (128 values): ql bytes 64h.., qh bytes 32h..; value l + 32k of the half
    (k = 0..3) takes ql[l + 32*(k&1)] nibble (k>>1) and qh[l] bits 2k..2k+1; scale index
    8h + l//16 + 2k; y = d * scale * (q - 32)."""
    ql = b[:, :128].reshape(-1, 2, 2, 32)             # (n, half, k&1, l)
    qh = b[:, 128:192].reshape(-1, 2, 1, 32)          # (n, half, 1, l)
    sc = b[:, 192:208].contiguous().view(torch.int8).float().reshape(-1, 2, 8)   # (n, half, 8)
    d = _f16(b[:, 208:210])                           # (n, 1)
    lo = torch.cat([ql & 0xF, ql >> 4], dim=2)        # (n, half, k, l), k = 0..3
    shifts = torch.tensor([0, 2, 4, 6], device=b.device).reshape(1, 1, 4, 1)
    hi = (qh.long() >> shifts) & 3                    # (n, half, 4, l)
    q = (lo.long() | (hi << 4)).float() - 32
    idx = (torch.arange(32, device=b.device) // 16)[None, :] + 2 * torch.arange(4, device=b.device)[:, None]
    scale = sc[:, :, idx]                             # (n, half, 4, 32)
    return (d[:, :, None, None] * scale * q).reshape(-1, 256)


_DEQ = {T.Q8_0: _q8_0, T.Q4_0: _q4_0, T.Q5_0: _q5_0, T.Q4_K: _q4_k, T.Q6_K: _q6_k}


def supported(qtype: int) -> bool:
    return T(qtype) in _DEQ or T(qtype) in (T.F32, T.F16, T.BF16)


def dequantize_torch(raw: torch.Tensor, qtype: int, shape: tuple[int, ...],
                     chunk_blocks: int = 1 << 20) -> torch.Tensor:
    """raw uint8 (n_bytes,) on any device -> float32 `shape` on that device, chunked to
    bound the temporaries."""
    t = T(qtype)
    if t == T.F32:
        return raw.view(torch.float32).reshape(shape)
    if t == T.F16:
        return raw.view(torch.float16).float().reshape(shape)
    if t == T.BF16:
        return raw.view(torch.bfloat16).float().reshape(shape)
    from minfer.quants import block_size, type_size

    block, size = block_size(t), type_size(t)
    blocks = raw.reshape(-1, size)
    out = torch.empty((blocks.shape[0], block), dtype=torch.float32, device=raw.device)
    for s in range(0, blocks.shape[0], chunk_blocks):
        out[s:s + chunk_blocks] = _DEQ[t](blocks[s:s + chunk_blocks])
    return out.reshape(shape)


def load_dequantized(t, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """One GGUF TensorInfo -> `dtype` tensor on `device`: raw bytes uploaded and decoded there
    when the type is known here, else decoded on the CPU by minfer.quants."""
    if supported(t.qtype):
        with warnings.catch_warnings():  # the memory map is read-only; the bytes are only read
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.from_numpy(np.asarray(t.data)).to(device)
        return dequantize_torch(raw, t.qtype, t.shape).to(dtype)
    from minfer.quants import dequantize

    x = np.ascontiguousarray(dequantize(t.data, t.qtype, t.shape))
    return torch.from_numpy(x).to(dtype=dtype).to(device)
