"""Registry of ggml tensor types and the shared machinery of every quant class.

A ggml tensor row is a run of fixed-size *blocks*: `block_size` values stored in
`type_size` bytes (ggml-common.h; the same table is gguf.constants.GGML_QUANT_SIZES).
Each class here turns an `(n_blocks, type_size)` uint8 array into `(n_blocks, block_size)`
float32 and, for the types that have a quantizer, back.

Dequantization is done in chunks of blocks so that the temporaries of one chunk stay in the
CPU cache; without chunking every numpy pass would stream the whole tensor through memory.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from minfer.errors import MinferError

QK_K = 256  # super-block size of the k-quants (ggml-common.h: QK_K)

# Output floats per dequantize chunk: 64K floats = 256 KiB, about an L2 cache.
_CHUNK_FLOATS = 1 << 16

_REGISTRY: dict[int, type["QuantType"]] = {}


def register(cls: type["QuantType"]) -> type["QuantType"]:
    """Class decorator: make `cls` the implementation of ggml type `cls.qtype`."""
    _REGISTRY[int(cls.qtype)] = cls
    return cls


def type_name(qtype) -> str:
    """'Q4_K' for 12 or GGMLQuantizationType.Q4_K; 'type 99' for an id gguf does not know."""
    try:
        return GGMLQuantizationType(int(qtype)).name
    except (ValueError, TypeError):
        return f"type {qtype!r}"


def lookup(qtype, name: str | None = None) -> type["QuantType"]:
    """The class for a ggml type id (int or gguf enum); MinferError if minfer has none."""
    try:
        key = int(qtype)
    except (ValueError, TypeError):
        key = None
    cls = _REGISTRY.get(key) if key is not None else None
    if cls is None:
        what = f"tensor {name!r}: " if name else ""
        supported = ", ".join(c.qtype.name for c in _REGISTRY.values())
        raise MinferError(
            f"{what}ggml type {type_name(qtype)} is not supported by minfer (supported: {supported})"
        )
    return cls


def supported_types() -> list[GGMLQuantizationType]:
    return [c.qtype for c in _REGISTRY.values()]


def f16_to_f32(raw: np.ndarray) -> np.ndarray:
    """Little-endian IEEE half bytes (..., 2) uint8 -> (..., 1) float32, exact (GGML_FP16_TO_FP32)."""
    return raw.view(np.float16).astype(np.float32)


def f32_to_f16_bytes(x: np.ndarray) -> np.ndarray:
    """float32 (..., 1) -> (..., 2) uint8, round to nearest even (GGML_FP32_TO_FP16).
    Values beyond 65504 become inf, as in ggml."""
    with np.errstate(over="ignore"):
        return x.astype(np.float16).view(np.uint8)


def signed_absmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """The value with the largest |v| along `axis` (kept, length 1), the first one on ties:
    ggml-quants.c's `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }`."""
    idx = np.expand_dims(np.abs(x).argmax(axis=axis), axis)
    return np.take_along_axis(x, idx, axis=axis)


def nearest_int(x: np.ndarray) -> np.ndarray:
    """ggml-quants.c nearest_int: adds 1.5*2^23 and reads the mantissa, i.e. round half to
    even for |x| <= 2^22, which is what np.rint does in float32."""
    with np.errstate(invalid="ignore"):  # callers mask out rows where x is not finite
        return np.rint(x).astype(np.int32)


class QuantType:
    """One ggml tensor type. Subclasses set the class attributes and implement
    `dequantize_blocks` and, where a quantizer exists, `quantize_blocks`."""

    qtype: GGMLQuantizationType
    block_size: int  # values per block
    type_size: int  # bytes per block
    f16_offsets: tuple[int, ...] = ()  # byte offsets of the block's f16 scales (d, dmin or m) in the drawn layout
    can_quantize: bool = False
    quantize_chunk: int = 1 << 14  # blocks per quantize chunk (bounds temporaries)

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """(n, type_size) uint8 -> (n, block_size) float32, written into `out` when given
        (saves one pass over the output; `out` must be C-contiguous)."""
        raise NotImplementedError

    @classmethod
    def quantize_blocks(cls, x: np.ndarray) -> np.ndarray:
        """(n, block_size) float32 -> (n, type_size) uint8."""
        raise MinferError(f"quantizing to {cls.qtype.name} is not implemented in minfer")

    @classmethod
    def dequantize_all(cls, blocks: np.ndarray) -> np.ndarray:
        """(n, type_size) uint8 -> (n * block_size,) float32, chunk by chunk (cache-sized)."""
        n = blocks.shape[0]
        out = np.empty((n, cls.block_size), dtype=np.float32)
        step = max(1, _CHUNK_FLOATS // cls.block_size)
        # inf/NaN f16 scales in the raw bits give inf/NaN outputs, as in ggml; no warnings.
        with np.errstate(invalid="ignore", over="ignore"):
            for s in range(0, n, step):
                cls.dequantize_blocks(blocks[s : s + step], out[s : s + step])
        return out.reshape(-1)

    @classmethod
    def quantize_all(cls, x: np.ndarray) -> np.ndarray:
        """(n, block_size) float32 -> (n, type_size) uint8, in chunks to bound temporaries."""
        n, chunk_blocks = x.shape[0], cls.quantize_chunk
        out = np.empty((n, cls.type_size), dtype=np.uint8)
        for s in range(0, n, chunk_blocks):
            out[s : s + chunk_blocks] = cls.quantize_blocks(x[s : s + chunk_blocks])
        return out
