"""ggml tensor formats in numpy: dequantize raw GGUF tensor bytes, quantize float32 to blocks.

Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
IQ4_XS, MXFP4 (these three: iquants.py), TQ1_0, TQ2_0 (BitNet's ternary types: tquants.py).
Dequantization is bit-exact against `gguf.quants.dequantize` (tests/quants). Every supported type
has a quantizer following llama.cpp's reference rounding (ggml-quants.c quantize_row_*_ref, the
no-imatrix path): F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 are bit-exact against
gguf.quants.quantize; the k-quants (Q2_K..Q6_K, see kquantize.py) are tested by error bounds;
MXFP4, TQ1_0 and TQ2_0 are bit-exact against gguf.quants.quantize, IQ4_NL / IQ4_XS (which gguf cannot quantize)
follow ggml's C reference and are tested by error bounds and gguf round trips.
Speeds on the dev box: bench/results/quants-cpu.md (python -m minfer.quants.bench_cpu).

    qtype: a ggml type id (int) or a gguf.GGMLQuantizationType
"""

from __future__ import annotations

import numpy as np

from minfer.errors import MinferError

from . import floats, iquants, kquants, kquantize, legacy, tquants  # noqa: F401  (register the classes)
from .base import lookup, supported_types, type_name

__all__ = [
    "dequantize",
    "quantize",
    "block_size",
    "type_size",
    "f16_offsets",
    "row_bytes",
    "type_name",
    "is_supported",
    "supported_types",
]


def is_supported(qtype) -> bool:
    try:
        lookup(qtype)
    except MinferError:
        return False
    return True


def block_size(qtype) -> int:
    """Values per block (32 for Q4_0, 256 for the k-quants, 1 for floats)."""
    return lookup(qtype).block_size


def type_size(qtype) -> int:
    """Bytes per block."""
    return lookup(qtype).type_size


def f16_offsets(qtype) -> tuple[int, ...]:
    """Byte offsets of the f16 scales inside one block (d, and dmin or m where the type has one);
    () for the float types. Benchmarks write finite scales there into random blocks."""
    return lookup(qtype).f16_offsets


def row_bytes(qtype, n_cols: int, name: str | None = None) -> int:
    """Bytes of one row of `n_cols` values; MinferError if n_cols is not a whole number of blocks."""
    cls = lookup(qtype, name)
    if n_cols % cls.block_size:
        what = f"tensor {name!r}: " if name else ""
        raise MinferError(
            f"{what}row length {n_cols} is not a multiple of the {cls.qtype.name} block size {cls.block_size}"
        )
    return n_cols // cls.block_size * cls.type_size


def dequantize(data, qtype, shape, name: str | None = None) -> np.ndarray:
    """Raw ggml blocks -> float32 ndarray of `shape` (row-major, last dim = one ggml row).

    data: uint8 array of any shape holding exactly the tensor's bytes, contiguous.
    """
    cls = lookup(qtype, name)
    shape = tuple(int(s) for s in shape)
    what = f"tensor {name!r}" if name else "tensor"
    n_cols = shape[-1] if shape else 1
    n_rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    expected = n_rows * row_bytes(qtype, n_cols, name)
    raw = np.ascontiguousarray(data)
    if raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    raw = raw.reshape(-1)
    if raw.size != expected:
        raise MinferError(
            f"{what}: {cls.qtype.name} data of shape {shape} needs {expected} bytes, got {raw.size}"
        )
    out = cls.dequantize_all(raw.reshape(-1, cls.type_size))
    return out.reshape(shape)


def quantize(x, qtype, name: str | None = None) -> np.ndarray:
    """float32 (rows, cols) or (cols,) -> uint8 (rows, row_bytes) of ggml blocks (1-D input: 1 row)."""
    cls = lookup(qtype, name)
    if not cls.can_quantize:
        raise MinferError(f"quantizing to {cls.qtype.name} is not implemented in minfer")
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise MinferError(f"quantize expects a 1-D or 2-D float array, got shape {arr.shape}")
    rows, cols = arr.shape
    nbytes = row_bytes(qtype, cols, name)
    blocks = np.ascontiguousarray(arr).reshape(-1, cls.block_size)
    return cls.quantize_all(blocks).reshape(rows, nbytes)
