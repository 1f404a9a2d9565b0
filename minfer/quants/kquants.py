"""The k-quants, dequantization: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256 values per super-block).

Layouts: ggml-common.h (block_q2_K ... block_q6_K); formulas: ggml-quants.c
dequantize_row_q2_K ... dequantize_row_q6_K. Value order inside a super-block follows the C
loops; the docstrings draw which bits feed value v.

Bit-exactness with gguf.quants: the per-group scale is formed first in float32
(`d * sc`, `dmin * m`), then `scale * q - min`, the same operation order as gguf and ggml, so
the output is bit-identical for any f16 scale pattern.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from .base import QK_K, QuantType, f16_to_f32, register

# Integers are built with broadcast uint8 shifts/masks and turned into floats by one mixed-type
# multiply (see legacy.py's speed note); float lookup-table gathers were ~4x slower here.
_SH2 = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
_SH4 = np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
_SH1 = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)


def _crumbs(q: np.ndarray) -> np.ndarray:
    """(n, g, 32) bytes -> (n, g, 4, 32) uint8: field k = bits 2k..2k+1 of each byte."""
    return (q[:, :, None, :] >> _SH2) & np.uint8(3)


def _bits(q: np.ndarray) -> np.ndarray:
    """(n, 32) bytes -> (n, 8, 32) uint8: plane k = bit k of each byte."""
    return (q[:, None, :] >> _SH1) & np.uint8(1)


def _nibbles(q: np.ndarray) -> np.ndarray:
    """(n, g, L) bytes -> (n, g, 2, L) uint8: [low nibbles, high nibbles]."""
    return (q[:, :, None, :] >> _SH4) & np.uint8(15)


def _affine(q: np.ndarray, dl: np.ndarray, ml: np.ndarray | None, out: np.ndarray | None) -> np.ndarray:
    """dl * q - ml in float32 -> (n, 256): q (n, G, S) small ints, dl/ml (n, G, 1) float32.
    Two roundings in the gguf/ggml order; written into `out` (n, 256) when given."""
    n = q.shape[0]
    if out is None:
        out = np.empty((n, QK_K), dtype=np.float32)
    o = out.reshape(q.shape)  # a view: out is a C-contiguous chunk
    np.multiply(q, dl, out=o, dtype=np.float32)
    if ml is not None:
        np.subtract(o, ml, out=o)
    return out


def scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K packed 6-bit scales and mins, (n, 12) uint8 -> two (n, 8) uint8.

    ggml-quants.c get_scale_min_k4; bytes (capitals: scale bits, lower case: min bits):
         0..3:  S[j] & 63 in bits 0-5, S[j+4] >> 4 in bits 6-7          (j = 0..3)
         4..7:  M[j] & 63 in bits 0-5, M[j+4] >> 4 in bits 6-7
        8..11:  S[j+4] & 15 in bits 0-3, M[j+4] & 15 in bits 4-7
    """
    s = scales.reshape(-1, 3, 4)
    a, b, c = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=1)
    mn = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=1)
    return sc, mn


@register
class Q2_K(QuantType):
    """2-bit k-quant: x = (d * (sc & 15)) * q - (dmin * (sc >> 4)), 16 groups of 16.

    super-block (84 bytes, 256 values):
        0               16                80      82        84
        | scales[16] u8 | qs[64]          | d f16 | dmin f16 |
    value v = 128*h + 32*k + l (h = 0..1, k = 0..3, l = 0..31):
        q = (qs[32*h + l] >> 2k) & 3, group = v // 16, sc = scales[group]
    """

    qtype = GGMLQuantizationType.Q2_K
    block_size, type_size = QK_K, 84
    f16_offsets = (80, 82)        # d, dmin

    @classmethod
    def dequantize_blocks(cls, blocks, out=None):
        n = blocks.shape[0]
        sc = blocks[:, 0:16]
        d = f16_to_f32(blocks[:, 80:82])
        dmin = f16_to_f32(blocks[:, 82:84])
        dl = (d * (sc & np.uint8(15)).astype(np.float32)).reshape(n, 16, 1)
        ml = (dmin * (sc >> np.uint8(4)).astype(np.float32)).reshape(n, 16, 1)
        q = _crumbs(blocks[:, 16:80].reshape(n, 2, 32)).reshape(n, 16, 16)
        return _affine(q, dl, ml, out)


@register
class Q3_K(QuantType):
    """3-bit k-quant: x = (d * (sc - 32)) * (q - 4*(1 - hbit)), 16 groups of 16, 6-bit sc.

    super-block (110 bytes, 256 values):
        0             32        96             108     110
        | hmask[32]   | qs[64]  | scales[12]   | d f16 |
    value v = 128*h + 32*k + l:  low = (qs[32*h + l] >> 2k) & 3,
        hbit = (hmask[l] >> (4*h + k)) & 1, q = low - (hbit ? 0 : 4)
    6-bit scale j (0..15): low 4 bits = j < 8 ? scales[j] & 15 : scales[j-8] >> 4,
        high 2 bits = (scales[8 + j%4] >> 2*(j//4)) & 3
    """

    qtype = GGMLQuantizationType.Q3_K
    block_size, type_size = QK_K, 110
    f16_offsets = (108,)          # d

    @classmethod
    def dequantize_blocks(cls, blocks, out=None):
        n = blocks.shape[0]
        hmask = blocks[:, 0:32]
        qs = blocks[:, 32:96].reshape(n, 2, 32)
        raw = blocks[:, 96:108]
        d = f16_to_f32(blocks[:, 108:110])
        low4 = np.concatenate([raw[:, 0:8] & np.uint8(15), raw[:, 0:8] >> np.uint8(4)], axis=1)
        high2 = _crumbs(raw[:, None, 8:12]).reshape(n, 16)  # index j = 4*(j//4) + j%4
        sc = (low4 | (high2 << np.uint8(4))).astype(np.int8) - np.int8(32)
        dl = (d * sc.astype(np.float32)).reshape(n, 16, 1)
        q = (_crumbs(qs).reshape(n, 8, 32) | (_bits(hmask) << np.uint8(2))).view(np.int8)  # plane 4h+k
        q -= np.int8(4)  # low - (hbit ? 0 : 4)
        return _affine(q.reshape(n, 16, 16), dl, None, out)


def _k4_group_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K header (d f16 | dmin f16 | scales[12]) -> per-group (n, 8, 1) float32
    d*sc and dmin*m, multiplied in that order as ggml does (bit-exactness depends on it)."""
    n = blocks.shape[0]
    d = f16_to_f32(blocks[:, 0:2])
    dmin = f16_to_f32(blocks[:, 2:4])
    sc, mn = scale_min_k4(blocks[:, 4:16])
    return (d * sc.astype(np.float32)).reshape(n, 8, 1), (dmin * mn.astype(np.float32)).reshape(n, 8, 1)


@register
class Q4_K(QuantType):
    """4-bit k-quant: x = (d * sc) * q - (dmin * m), 8 groups of 32, 6-bit sc and m.

    super-block (144 bytes, 256 values):
        0      2         4             16              144
        | d f16 | dmin f16 | scales[12] | qs[128]     |
    value v = 64*j + 32*s + l (j = 0..3, s = 0..1): q = s ? qs[32j+l] >> 4 : qs[32j+l] & 15,
        group = 2j + s; scales packing: see scale_min_k4
    """

    qtype = GGMLQuantizationType.Q4_K
    block_size, type_size = QK_K, 144
    f16_offsets = (0, 2)          # d, dmin

    @classmethod
    def dequantize_blocks(cls, blocks, out=None):
        n = blocks.shape[0]
        dl, ml = _k4_group_scales(blocks)
        q = _nibbles(blocks[:, 16:144].reshape(n, 4, 32)).reshape(n, 8, 32)
        return _affine(q, dl, ml, out)


@register
class Q5_K(QuantType):
    """5-bit k-quant: x = (d * sc) * q - (dmin * m), q = nibble + 16 * hbit, 8 groups of 32.

    super-block (176 bytes, 256 values):
        0      2         4             16         48              176
        | d f16 | dmin f16 | scales[12] | qh[32]   | qs[128]      |
    value v = 64*j + 32*s + l: nibble as Q4_K, hbit = (qh[l] >> (2j + s)) & 1
    """

    qtype = GGMLQuantizationType.Q5_K
    block_size, type_size = QK_K, 176
    f16_offsets = (0, 2)          # d, dmin

    @classmethod
    def dequantize_blocks(cls, blocks, out=None):
        n = blocks.shape[0]
        dl, ml = _k4_group_scales(blocks)
        low = _nibbles(blocks[:, 48:176].reshape(n, 4, 32)).reshape(n, 8, 32)
        q = low | (_bits(blocks[:, 16:48]) << np.uint8(4))
        return _affine(q, dl, ml, out)


@register
class Q6_K(QuantType):
    """6-bit k-quant: x = (d * sc) * (q - 32), 16 groups of 16, int8 sc.

    super-block (210 bytes, 256 values):
        0            128        192              208     210
        | ql[128]    | qh[64]   | scales[16] i8  | d f16 |
    value v = 128*h + 32*k + l (h = 0..1, k = 0..3, l = 0..31):
        low 4 bits = ql[64h + 32*(k%2) + l] >> 4*(k//2) & 15,
        high 2 bits = (qh[32h + l] >> 2k) & 3, group = v // 16
    """

    qtype = GGMLQuantizationType.Q6_K
    block_size, type_size = QK_K, 210
    f16_offsets = (208,)          # d

    @classmethod
    def dequantize_blocks(cls, blocks, out=None):
        n = blocks.shape[0]
        sc = blocks[:, 192:208].view(np.int8).astype(np.float32)
        d = f16_to_f32(blocks[:, 208:210])
        dl = (d * sc).reshape(n, 16, 1)
        low = _nibbles(blocks[:, 0:128].reshape(n, 2, 64)).reshape(n, 2, 128)  # [h, 64*(k//2) + ...]
        high = _crumbs(blocks[:, 128:192].reshape(n, 2, 32)).reshape(n, 2, 128)
        q = (low | (high << np.uint8(4))).view(np.int8)
        q -= np.int8(32)
        return _affine(q.reshape(n, 16, 16), dl, None, out)
