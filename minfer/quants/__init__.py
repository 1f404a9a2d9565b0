"""ggml quantization formats, numpy only. TEMPORARY stub: the quants helper replaces this file."""

from __future__ import annotations

import numpy as np


def dequantize(data: np.ndarray, qtype, shape) -> np.ndarray:
    import gguf.quants

    out = gguf.quants.dequantize(np.asarray(data, dtype=np.uint8), gguf.GGMLQuantizationType(int(qtype)))
    return np.asarray(out, dtype=np.float32).reshape(shape)
