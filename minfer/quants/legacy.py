"""The original ggml block quants: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32 values per block).

Layouts and formulas: ggml-common.h (block_q4_0 ...) and ggml-quants.c
(dequantize_row_q4_0, quantize_row_q4_0_ref, ...). Values j and j+16 of a block share byte j
of `qs`: value j in the low nibble, value j+16 in the high nibble.

Bit-exactness: every output is one float32 product (plus one add for the `_1` types) of the
f16 scale and a small integer, in the same order as gguf.quants, so the results match it bit
for bit whatever the scale (subnormal, negative, zero, 65504).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from .base import QuantType, f16_to_f32, f32_to_f16_bytes, register, signed_absmax

QK = 32

# Speed note (measured on the 2-core dev box): building the small integers with uint8 shifts
# and masks, then one `np.multiply(q_int8, d, dtype=float32)`, runs ~4x faster than gathering
# float lookup tables or casting to float first. The product is the same single rounding.
_SHIFT8 = np.arange(8, dtype=np.uint8).reshape(1, 1, 8)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(..., 16) uint8 -> (..., 32) uint8: [low nibbles, high nibbles] (values j and j+16)."""
    q = np.empty(qs.shape[:-1] + (32,), dtype=np.uint8)
    np.bitwise_and(qs, np.uint8(0x0F), out=q[..., :16])
    np.right_shift(qs, np.uint8(4), out=q[..., 16:])
    return q


def _high_bits16(qh: np.ndarray) -> np.ndarray:
    """(n, 4) uint8 (a little-endian u32, bit j for value j) -> (n, 32) uint8 in {0, 16}."""
    return (((qh[:, :, None] >> _SHIFT8) & np.uint8(1)) << np.uint8(4)).reshape(qh.shape[0], 32)


def _scaled(q: np.ndarray, d: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """(n, 32) small ints times (n, 1) float32 -> (n, 32) float32, one rounding per value."""
    return np.multiply(q, d, out=out, dtype=np.float32)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(..., 32) uint8 in 0..15 (low 4 bits used) -> (..., 16) bytes: value j low, j+16 high."""
    return (q[..., :16] & np.uint8(0x0F)) | (q[..., 16:] << np.uint8(4))


def _pack_high_bits(q: np.ndarray) -> np.ndarray:
    """(n, 32) uint8 in 0..31 -> (n, 4) bytes holding bit 4 of value j at bit j (u32 LE)."""
    return np.packbits((q >> np.uint8(4)) & np.uint8(1), axis=-1, bitorder="little")


def _inverse(d: np.ndarray) -> np.ndarray:
    """`d ? 1.0f/d : 0.0f` in float32."""
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _trunc_u8(v: np.ndarray, hi: int) -> np.ndarray:
    """`MIN(hi, (int8_t)v)` for v >= ~0: C's float->int cast truncates toward zero."""
    return np.clip(np.trunc(v), 0, hi).astype(np.uint8)


@register
class Q4_0(QuantType):
    """4-bit, symmetric: x = d * (q - 8).

    block (18 bytes, 32 values):
        0      2                              18
        | d f16 | qs[16]: lo nibble = q[j], hi nibble = q[j+16] |
    """

    qtype = GGMLQuantizationType.Q4_0
    block_size, type_size = QK, 18
    f16_offsets = (0,)            # d
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks, out=None):
        d = f16_to_f32(blocks[:, 0:2])  # (n, 1)
        q = _nibbles(blocks[:, 2:]).view(np.int8)
        q -= np.int8(8)
        return _scaled(q, d, out)

    @classmethod
    def quantize_blocks(cls, x):
        # ggml-quants.c quantize_row_q4_0_ref: d = max / -8, q = MIN(15, (int8)(x/d + 8.5))
        d, q = _quantize_signed(x, 8)
        return np.concatenate([f32_to_f16_bytes(d), _pack_nibbles(q)], axis=1)


def _quantize_signed(x: np.ndarray, half: int):
    """Q4_0/Q5_0 (quantize_row_q4_0_ref / q5_0_ref): d = (the signed value of largest
    magnitude) / -half, q = trunc(x / d + half + 0.5) capped at 2 * half - 1. Returns (d, q)."""
    d = signed_absmax(x) / np.float32(-half)
    q = _trunc_u8(x * _inverse(d) + np.float32(half + 0.5), 2 * half - 1)
    return d, q


def _quantize_with_min(x: np.ndarray, levels: int):
    """Q4_1/Q5_1 (ggml-quants.c quantize_row_q4_1_ref / q5_1_ref): per block d = (max - min) /
    levels, q = trunc((x - min) / d + 0.5) capped at levels. Returns (d, min, q), each (n, .)."""
    lo = x.min(axis=1, keepdims=True)
    hi = x.max(axis=1, keepdims=True)
    d = (hi - lo) / np.float32(levels)
    q = _trunc_u8((x - lo) * _inverse(d) + np.float32(0.5), levels)
    return d, lo, q


@register
class Q4_1(QuantType):
    """4-bit with minimum: x = d * q + m.

    block (20 bytes, 32 values):
        0      2      4                     20
        | d f16 | m f16 | qs[16] (as Q4_0) |
    """

    qtype = GGMLQuantizationType.Q4_1
    block_size, type_size = QK, 20
    f16_offsets = (0, 2)          # d, m
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks, out=None):
        d = f16_to_f32(blocks[:, 0:2])
        m = f16_to_f32(blocks[:, 2:4])
        out = _scaled(_nibbles(blocks[:, 4:]), d, out)
        out += m  # (d * q) + m, the gguf/ggml order
        return out

    @classmethod
    def quantize_blocks(cls, x):
        # quantize_row_q4_1_ref: d = (max - min) / 15, q = MIN(15, (int8)((x - min)/d + 0.5))
        d, lo, q = _quantize_with_min(x, 15)
        return np.concatenate([f32_to_f16_bytes(d), f32_to_f16_bytes(lo), _pack_nibbles(q)], axis=1)


@register
class Q5_0(QuantType):
    """5-bit, symmetric: x = d * (q - 16), q = nibble | (bit << 4).

    block (22 bytes, 32 values):
        0      2             6                     22
        | d f16 | qh u32 LE: bit j = bit 4 of q[j] | qs[16] (as Q4_0) |
    """

    qtype = GGMLQuantizationType.Q5_0
    block_size, type_size = QK, 22
    f16_offsets = (0,)            # d
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks, out=None):
        d = f16_to_f32(blocks[:, 0:2])
        q = (_nibbles(blocks[:, 6:]) | _high_bits16(blocks[:, 2:6])).view(np.int8)
        q -= np.int8(16)
        return _scaled(q, d, out)

    @classmethod
    def quantize_blocks(cls, x):
        # quantize_row_q5_0_ref: d = max / -16, q = MIN(31, (int8)(x/d + 16.5))
        d, q = _quantize_signed(x, 16)
        return np.concatenate([f32_to_f16_bytes(d), _pack_high_bits(q), _pack_nibbles(q)], axis=1)


@register
class Q5_1(QuantType):
    """5-bit with minimum: x = d * q + m, q = nibble | (bit << 4).

    block (24 bytes, 32 values):
        0      2      4          8                     24
        | d f16 | m f16 | qh u32 | qs[16] (as Q4_0) |
    """

    qtype = GGMLQuantizationType.Q5_1
    block_size, type_size = QK, 24
    f16_offsets = (0, 2)          # d, m
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks, out=None):
        d = f16_to_f32(blocks[:, 0:2])
        m = f16_to_f32(blocks[:, 2:4])
        out = _scaled(_nibbles(blocks[:, 8:]) | _high_bits16(blocks[:, 4:8]), d, out)
        out += m
        return out

    @classmethod
    def quantize_blocks(cls, x):
        # quantize_row_q5_1_ref: d = (max - min) / 31, q = (uint8)((x - min)/d + 0.5)
        d, lo, q = _quantize_with_min(x, 31)
        return np.concatenate(
            [f32_to_f16_bytes(d), f32_to_f16_bytes(lo), _pack_high_bits(q), _pack_nibbles(q)], axis=1
        )


def _roundf(v: np.ndarray) -> np.ndarray:
    """C roundf: half away from zero (np.rint would round half to even)."""
    t = np.trunc(v)
    frac = np.abs(v - t)  # exact in float32
    return np.where(frac >= np.float32(0.5), t + np.sign(v), t)


@register
class Q8_0(QuantType):
    """8-bit, symmetric: x = d * q, q int8.

    block (34 bytes, 32 values):
        0      2                 34
        | d f16 | qs[32] int8 |
    """

    qtype = GGMLQuantizationType.Q8_0
    block_size, type_size = QK, 34
    f16_offsets = (0,)            # d
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks, out=None):
        d = f16_to_f32(blocks[:, 0:2])
        return _scaled(blocks[:, 2:].view(np.int8), d, out)

    @classmethod
    def quantize_blocks(cls, x):
        # quantize_row_q8_0_ref: d = amax / 127, q = roundf(x / d)
        d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
        q = _roundf(x * _inverse(d)).astype(np.int8)
        return np.concatenate([f32_to_f16_bytes(d), q.view(np.uint8)], axis=1)
