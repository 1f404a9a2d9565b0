"""Codebook 4-bit types: IQ4_NL, IQ4_XS (non-linear 16-value grid) and MXFP4 (e2m1 + e8m0 scale).

Layouts: ggml-common.h (block_iq4_nl, block_iq4_xs, block_mxfp4; the tables kvalues_iq4nl and
kvalues_mxfp4); formulas: ggml-quants.c dequantize_row_iq4_nl / dequantize_row_iq4_xs /
dequantize_row_mxfp4 and, for the quantizers, quantize_row_iq4_nl_ref, quantize_iq4_xs (no
importance matrix) and quantize_row_mxfp4_ref; e8m0: ggml-impl.h ggml_e8m0_to_fp32_half.
In all three, value j of a 32-value group is the low nibble of byte j, value j+16 the high
nibble of byte j (as Q4_0), and a nibble indexes a table of 16 small integers.

Bit-exactness with gguf.quants: every output is one float32 product of the block's float32
scale (IQ4_XS: the group scale d * (ls - 32), formed first, as ggml does) and a table integer.
MXFP4's quantizer is bit-exact against gguf.quants.quantize; gguf has no IQ4 quantizers, so
those follow ggml's C reference step by step (sums accumulated in the C loop order) and are
tested by error bounds and by round trips through gguf's dequantizer.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from .base import QK_K, QuantType, f16_to_f32, f32_to_f16_bytes, nearest_int, register, signed_absmax
from .legacy import _inverse, _nibbles, _pack_nibbles

QK = 32
GROUP_MAX_EPS = np.float32(1e-15)  # ggml-quants.c: groups with a smaller |max| are all zeros

# ggml-common.h kvalues_iq4nl
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
# ggml-common.h kvalues_mxfp4 (= kvalues_fp4): the e2m1 values doubled; index 8 is -0 -> 0
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
_KV_NL_F32 = KVALUES_IQ4NL.astype(np.float32)


def e8m0_to_f32_half(e: np.ndarray) -> np.ndarray:
    """uint8 e8m0 exponents -> float32 2^(e - 128) (ggml-impl.h ggml_e8m0_to_fp32_half: half of
    the e8m0 value, because the codebook is the e2m1 values doubled). Exact; e = 0, 1 give the
    float32 subnormals 2^-128, 2^-127; no e gives inf or NaN (e = 255: 2^127)."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def best_index(x: np.ndarray) -> np.ndarray:
    """ggml-quants.c best_index_int8 over kvalues_iq4nl, elementwise: the index of the nearest
    table value; at or past the ends the end index; an exact midpoint goes to the upper one."""
    mu = np.searchsorted(_KV_NL_F32, x, side="right").clip(1, 15)  # val[mu-1] <= x < val[mu]
    lo, hi = _KV_NL_F32[mu - 1], _KV_NL_F32[mu]
    idx = np.where(x - lo < hi - x, mu - 1, mu)
    idx = np.where(x <= _KV_NL_F32[0], 0, np.where(x >= _KV_NL_F32[15], 15, idx))
    return idx.astype(np.uint8)


def _weighted_sums(x: np.ndarray, w: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sum_j w*q*x and sum_j w*q*q over the last axis, float32, accumulated in index order as the
    C loop does (numpy's pairwise sum would round differently). Returns two (..., 1) arrays."""
    sqx = np.zeros(x.shape[:-1], dtype=np.float32)
    sq2 = np.zeros(x.shape[:-1], dtype=np.float32)
    for j in range(x.shape[-1]):
        wq = w[..., j] * q[..., j]
        sqx += wq * x[..., j]
        sq2 += wq * q[..., j]
    return sqx[..., None], sq2[..., None]


def _iq4_groups(x: np.ndarray, ntry: int) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_iq4_nl_impl's per-32-group part without importance weights: x (..., 32)
    float32 -> (scale (..., 1) float32, codes (..., 32) uint8 of the first pass). Weights are
    x^2; d starts at max / kvalues[0] (ntry <= 0) or -max / kvalues[0], is refit by least
    squares, then each of the 2*ntry + 1 trial grids id = (itry + kvalues[0]) / max may win."""
    w = x * x
    mx = signed_absmax(x)
    dead = np.abs(mx) < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        d = mx / np.float32(-127) if ntry <= 0 else -mx / np.float32(-127)
        codes = best_index(x * (np.float32(1) / d))
        q = _KV_NL_F32[codes]
        sqx, sq2 = _weighted_sums(x, w, q)
        d = np.where(sq2 > 0, sqx / sq2, np.float32(0)).astype(np.float32)
        best = d * sqx
        for itry in range(-ntry, ntry + 1):
            idt = np.float32(itry - 127) / mx
            qt = _KV_NL_F32[best_index(x * idt)]
            tqx, tq2 = _weighted_sums(x, w, qt)
            win = (tq2 > 0) & (tqx * tqx > best * tq2)
            dt = np.where(win, tqx / np.where(win, tq2, 1), d).astype(np.float32)
            best = np.where(win, dt * tqx, best)
            d = dt
    d = np.where(dead, np.float32(0), d).astype(np.float32)
    codes = np.where(dead, np.uint8(8), codes)  # (ggml leaves them unset; d = 0 makes them 0 anyway)
    return d, codes


@register
class IQ4_NL(QuantType):
    """4-bit non-linear: x = d * kvalues_iq4nl[q].

    block (18 bytes, 32 values):
        0      2                              18
        | d f16 | qs[16]: lo nibble = q[j], hi nibble = q[j+16] |
    kvalues_iq4nl = -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113
    """

    qtype = GGMLQuantizationType.IQ4_NL
    block_size, type_size = QK, 18
    f16_offsets = (0,)            # d
    can_quantize = True
    quantize_chunk = 4096

    @classmethod
    def dequantize_blocks(cls, blocks, out=None):
        d = f16_to_f32(blocks[:, 0:2])  # (n, 1)
        k = KVALUES_IQ4NL[_nibbles(blocks[:, 2:])]
        return np.multiply(k, d, out=out, dtype=np.float32)

    @classmethod
    def quantize_blocks(cls, x):
        # quantize_row_iq4_nl_ref: quantize_row_iq4_nl_impl(QK4_NL, 32, ..., ntry = -1): no trial
        # grids, and the codes stay those of the first pass (made with d = max / -127)
        d, codes = _iq4_groups(x, ntry=-1)
        return np.concatenate([f32_to_f16_bytes(d), _pack_nibbles(codes)], axis=1)


@register
class IQ4_XS(QuantType):
    """4-bit non-linear with 6-bit group scales: x = (d * (ls - 32)) * kvalues_iq4nl[q],
    8 groups of 32.

    super-block (136 bytes, 256 values):
        0      2            4              8                        136
        | d f16 | scales_h u16 | scales_l[4] | qs[128]                |
    group g (values 32g..32g+31): ls = ((scales_l[g/2] >> 4*(g%2)) & 15) | (((scales_h >> 2g) & 3) << 4);
        value 32g + j: lo nibble of qs[16g + j], value 32g + 16 + j: hi nibble of it
    """

    qtype = GGMLQuantizationType.IQ4_XS
    block_size, type_size = QK_K, 136
    f16_offsets = (0,)            # d
    can_quantize = True
    quantize_chunk = 1024

    @classmethod
    def dequantize_blocks(cls, blocks, out=None):
        n = blocks.shape[0]
        d = f16_to_f32(blocks[:, 0:2])                                     # (n, 1)
        sh = blocks[:, 2:4].copy().view(np.uint16)                          # (n, 1) little-endian
        hi = (sh >> (2 * np.arange(8, dtype=np.uint16))) & np.uint16(3)     # (n, 8)
        sl = blocks[:, 4:8]
        lo = np.stack([sl & np.uint8(15), sl >> np.uint8(4)], axis=2).reshape(n, 8)  # group 2i, 2i+1
        ls = (lo.astype(np.int16) | (hi.astype(np.int16) << 4)) - np.int16(32)
        dl = (d * ls.astype(np.float32)).reshape(n, 8, 1)                  # d * (ls - 32), float32
        k = KVALUES_IQ4NL[_nibbles(blocks[:, 8:].reshape(n, 8, 16))]         # (n, 8, 32)
        if out is None:
            out = np.empty((n, QK_K), dtype=np.float32)
        np.multiply(k, dl, out=out.reshape(n, 8, 32), dtype=np.float32)
        return out

    @classmethod
    def quantize_blocks(cls, x):
        # quantize_iq4_xs without importance weights: quantize_row_iq4_nl_impl(QK_K, 32, ..., ntry 7)
        n = x.shape[0]
        xg = x.reshape(n, 8, 32)
        scales, _ = _iq4_groups(xg, ntry=7)                                 # (n, 8, 1)
        s = scales[..., 0]
        max_scale = signed_absmax(s)                                        # (n, 1), 0 if all 0
        d = -max_scale / np.float32(32)
        l_ = np.clip(nearest_int(_inverse(d) * s), -32, 31)                     # (n, 8)
        dl = d * l_.astype(np.float32)
        codes = best_index(xg * _inverse(dl)[..., None])                       # (n, 8, 32)
        l_ = (l_ + 32).astype(np.uint8)
        lo, hi = l_ & np.uint8(15), (l_ >> np.uint8(4)).astype(np.uint16)
        sh = (hi << (2 * np.arange(8, dtype=np.uint16))).sum(axis=1, dtype=np.uint16)
        sl = lo[:, 0::2] | (lo[:, 1::2] << np.uint8(4))
        return np.concatenate([f32_to_f16_bytes(d), sh.reshape(n, 1).view(np.uint8), sl,
                               _pack_nibbles(codes).reshape(n, 128)], axis=1)


@register
class MXFP4(QuantType):
    """OCP microscaling FP4: x = 2^(e - 128) * kvalues_mxfp4[q] (e2m1 values doubled, so the
    scale is half of 2^(e - 127)).

    block (17 bytes, 32 values):
        0        1                              17
        | e e8m0 | qs[16]: lo nibble = q[j], hi nibble = q[j+16] |
    kvalues_mxfp4 = 0 1 2 3 4 6 8 12 0 -1 -2 -3 -4 -6 -8 -12  (bit 3 = sign)
    """

    qtype = GGMLQuantizationType.MXFP4
    block_size, type_size = QK, 17
    f16_offsets = ()              # no f16 field: the e8m0 scale is never inf/NaN (e >= 253 times 12 overflows)
    can_quantize = True
    quantize_chunk = 2048

    @classmethod
    def dequantize_blocks(cls, blocks, out=None):
        d = e8m0_to_f32_half(blocks[:, 0:1])  # (n, 1)
        k = KVALUES_MXFP4[_nibbles(blocks[:, 1:])]
        return np.multiply(k, d, out=out, dtype=np.float32)

    @classmethod
    def quantize_blocks(cls, x):
        # quantize_row_mxfp4_ref: e = floor(log2(amax)) - 2 + 127 (0 for an all-zero block),
        # then each value to the table entry nearest to it at scale e8m0_half(e), the first on ties
        amax = np.abs(x).max(axis=1, keepdims=True)
        with np.errstate(divide="ignore"):
            e = np.where(amax > 0, np.floor(np.log2(amax)) - np.float32(2) + np.float32(127), 0)
        e = np.clip(e, 0, 255).astype(np.uint8)   # (the clip only guards |x| < 2^-125, out of C's range)
        d = e8m0_to_f32_half(e)                                            # (n, 1)
        err = np.abs(d[:, :, None] * KVALUES_MXFP4.astype(np.float32) - x[:, :, None])  # (n, 32, 16)
        codes = err.argmin(axis=2).astype(np.uint8)
        return np.concatenate([e, _pack_nibbles(codes)], axis=1)
