"""Ternary types: TQ1_0 (1.6875 bpw) and TQ2_0 (2.0625 bpw), BitNet b1.58's weights (x = d * t, t in {-1, 0, 1}).

Layouts: ggml-common.h block_tq1_0 / block_tq2_0; formulas: ggml-quants.c dequantize_row_tq1_0 /
dequantize_row_tq2_0 and quantize_row_tq1_0_ref / quantize_row_tq2_0_ref (llama.cpp PR #8151). A code c in
{0, 1, 2} stands for t = c - 1 (TQ2_0's 2-bit field may also hold 3, which decodes to 2 * d, as in ggml).

TQ2_0 (256 values, 66 B):  qs[64] | d f16 at 64
    value 128 j + 32 l + m (j < 2, l < 4, m < 32): bits 2l..2l+1 of qs[32 j + m]
TQ1_0 (256 values, 54 B):  qs[48] | qh[4] | d f16 at 52; five trits per byte, stored as the byte
    ceil(v * 256 / 243) of their base-3 value v (first trit most significant), so trit n of byte b is
    ((uint8)(b * 3^n) * 3) >> 8:
    value 32 n + m        (n < 5, m < 32):  trit n of qs[m]
    value 160 + 16 n + m  (n < 5, m < 16):  trit n of qs[32 + m]
    value 240 + 4 n + j   (n < 4, j < 4):   trit n of qh[j] (four trits, shifted up one place)
The quantizers take d = max |x| per block and t = lroundf(x / d) (round half away from zero), which is exact
for a block of ternary values times one scale: the converter's BitNet weights (conversion/bitnet.py).
Dequantization and quantization are bit-exact against gguf.quants (tests/quants/test_tquants.py).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from .base import QK_K, QuantType, f16_to_f32, f32_to_f16_bytes, register

_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def _trits(b: np.ndarray, n: int) -> np.ndarray:
    """Bytes (..., k) uint8 -> their first n trits (..., n, k) int8 in -1..1 (ggml's (uint8)(b * 3^i) * 3 >> 8)."""
    q = (b[..., None, :] * _POW3[:n, None]).astype(np.uint8)          # uint8 product wraps mod 256, as in C
    return ((q.astype(np.uint16) * 3) >> 8).astype(np.int8) - np.int8(1)


def _lroundf(x: np.ndarray) -> np.ndarray:
    """C lroundf elementwise on float32: half away from zero, exactly (floor(a) + floor(2 (a - floor(a))), as
    gguf.quants.np_roundf; floor(a + 0.5) would round 0.49999997 up)."""
    a = np.abs(x)
    f = np.floor(a)
    return (np.sign(x) * (f + np.floor(2 * (a - f)))).astype(np.int8)


def _codes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 256) float32 -> (d (n, 1) float32 = max |x|, codes (n, 256) uint8 = lroundf(x / d) + 1)."""
    d = np.abs(x).max(axis=-1, keepdims=True).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    return d, (_lroundf(x * inv) + np.int8(1)).astype(np.uint8)


def _pack_trits(c: np.ndarray) -> np.ndarray:
    """codes (..., n, k) uint8 in 0..2 -> (..., k) bytes: ceil(v * 256 / 243), v their base-3 value, trit 0 first
    (and shifted up to five places when n = 4)."""
    w = np.array([81, 27, 9, 3, 1], dtype=np.uint16)[:c.shape[-2]]
    v = (c.astype(np.uint16) * w[:, None]).sum(axis=-2, dtype=np.uint16)
    return ((v * 256 + 242) // 243).astype(np.uint8)


@register
class TQ2_0(QuantType):
    qtype = GGMLQuantizationType.TQ2_0
    block_size, type_size = QK_K, 66
    f16_offsets = (64,)            # d
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks, out=None):
        n = blocks.shape[0]
        d = f16_to_f32(blocks[:, 64:66])                                  # (n, 1)
        qs = blocks[:, :64].reshape(n, 2, 1, 32)
        t = ((qs >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 3).astype(np.int8) - np.int8(1)
        return np.multiply(t.reshape(n, QK_K).astype(np.float32), d, out=out)

    @classmethod
    def quantize_blocks(cls, x):
        n = x.shape[0]
        d, c = _codes(x)
        c = c.reshape(n, 2, 4, 32) << np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
        qs = (c[:, :, 0] | c[:, :, 1] | c[:, :, 2] | c[:, :, 3]).reshape(n, 64)
        return np.concatenate([qs, f32_to_f16_bytes(d)], axis=1)


@register
class TQ1_0(QuantType):
    qtype = GGMLQuantizationType.TQ1_0
    block_size, type_size = QK_K, 54
    f16_offsets = (52,)            # d
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks, out=None):
        n = blocks.shape[0]
        d = f16_to_f32(blocks[:, 52:54])                                  # (n, 1)
        t = np.concatenate([_trits(blocks[:, 0:32], 5).reshape(n, 160), _trits(blocks[:, 32:48], 5).reshape(n, 80),
                            _trits(blocks[:, 48:52], 4).reshape(n, 16)], axis=1)
        return np.multiply(t.astype(np.float32), d, out=out)

    @classmethod
    def quantize_blocks(cls, x):
        n = x.shape[0]
        d, c = _codes(x)
        qs0 = _pack_trits(c[:, :160].reshape(n, 5, 32))
        qs1 = _pack_trits(c[:, 160:240].reshape(n, 5, 16))
        qh = _pack_trits(c[:, 240:].reshape(n, 4, 4))
        return np.concatenate([qs0, qs1, qh, f32_to_f16_bytes(d)], axis=1)
