"""Unquantized float types: F32, F16, BF16 (block size 1)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from .base import QuantType, register


@register
class F32(QuantType):
    """IEEE binary32, little endian.

    block (4 bytes):  [ f32 ]
    """

    qtype = GGMLQuantizationType.F32
    block_size, type_size = 1, 4
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out=None) -> np.ndarray:
        return blocks.reshape(-1).view(np.float32).reshape(-1, 1).copy()

    @classmethod
    def dequantize_all(cls, blocks: np.ndarray) -> np.ndarray:
        # One copy, no chunking: a view would alias the caller's (often mmapped) bytes.
        return np.ascontiguousarray(blocks).reshape(-1).view(np.float32).copy()

    @classmethod
    def quantize_blocks(cls, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x, dtype=np.float32).view(np.uint8).reshape(-1, 4)


@register
class F16(QuantType):
    """IEEE binary16, little endian.

    block (2 bytes):  [ f16 ]
    """

    qtype = GGMLQuantizationType.F16
    block_size, type_size = 1, 2
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out=None) -> np.ndarray:
        return blocks.reshape(-1).view(np.float16).astype(np.float32).reshape(-1, 1)

    @classmethod
    def dequantize_all(cls, blocks: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(blocks).reshape(-1).view(np.float16).astype(np.float32)

    @classmethod
    def quantize_blocks(cls, x: np.ndarray) -> np.ndarray:
        # numpy's float32 -> float16 cast rounds to nearest even, like GGML_FP32_TO_FP16.
        with np.errstate(over="ignore"):  # |x| > 65504 -> inf, as in ggml
            return x.astype(np.float16).view(np.uint8).reshape(-1, 2)


@register
class BF16(QuantType):
    """bfloat16: the top 16 bits of an IEEE binary32, little endian.

    block (2 bytes):  [ sign | 8-bit exponent | 7-bit mantissa ]
    """

    qtype = GGMLQuantizationType.BF16
    block_size, type_size = 1, 2
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out=None) -> np.ndarray:
        hi = blocks.reshape(-1).view(np.uint16).astype(np.uint32) << np.uint32(16)
        return hi.view(np.float32).reshape(-1, 1)

    @classmethod
    def dequantize_all(cls, blocks: np.ndarray) -> np.ndarray:
        return cls.dequantize_blocks(np.ascontiguousarray(blocks)).reshape(-1)

    @classmethod
    def quantize_blocks(cls, x: np.ndarray) -> np.ndarray:
        # ggml-impl.h ggml_compute_fp32_to_bf16: NaN -> quiet NaN keeping the sign and top
        # mantissa bits; everything else rounds to nearest even on the dropped 16 bits.
        n = np.ascontiguousarray(x, dtype=np.float32).reshape(-1).view(np.uint32)
        is_nan = (n & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        rounded = (n.astype(np.uint64) + (np.uint64(0x7FFF) + ((n >> np.uint32(16)) & np.uint32(1)))) >> np.uint64(16)
        quiet = (n >> np.uint32(16)) | np.uint32(64)
        out = np.where(is_nan, quiet, rounded).astype(np.uint16)
        return out.view(np.uint8).reshape(-1, 2)
