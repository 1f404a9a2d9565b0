"""Embedding lookup on CUDA: decode only the requested rows of the raw table."""

from __future__ import annotations

import torch

from minfer.ops import paths
from minfer.ops.cuda import dequant
from minfer.ops.cuda.dequant import interpret


def embedding(ids: torch.Tensor, w, dtype=torch.float32) -> torch.Tensor:
    """ids (T,) int64 -> (T, D) rows of the table w (QWeight (vocab, D)), decoded to `dtype`.

    float32 by default, like the reference: the residual stream starts here and its dtype is
    the model's choice (it casts).
    """
    from minfer.ops.cuda.qmatmul import check_supported

    check_supported(w)
    paths.count(f"embedding.{dequant.type_name(w.qtype)}")
    n = ids.shape[0]
    d = w.shape[1]
    out = torch.empty((n, d), dtype=dtype, device=ids.device)
    ids = ids.to(device=w.raw.device, dtype=torch.int64).contiguous()
    dequant.dequantize_into(w.raw, w.qtype, n, d, out, idx=ids, interpret=interpret())
    return out
