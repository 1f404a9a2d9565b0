"""Model weights on a device.

A 2-D weight is a QWeight: the raw ggml blocks as stored in the file (uint8, one row of
blocks per output row) plus, on the CPU, the dequantized dense matrix the reference matmul
uses. On CUDA the loader uploads the raw blocks and hands each QWeight to
`minfer.ops.cuda.prepare_weight(w)`, which checks its layout.

A QWeight compares and hashes by identity (eq=False): the CUDA workspace keys its weight
groups and prefetch sequence on the weight objects themselves.

1-D tensors (norm weights, biases, rope factors) are plain float32 torch tensors.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from minfer.errors import MinferError


@dataclass(eq=False)
class QWeight:
    name: str
    qtype: int                       # ggml type id
    shape: tuple[int, int]           # (N, K): N output rows, K inputs
    raw: torch.Tensor                # uint8 (N, row_bytes), the file's blocks, on the device
    dense: torch.Tensor | None = None  # (N, K) float, CPU reference (None: dequantize on demand)
    packed: Any = None               # CPU fast-path form (minfer.ops.cpu_quant.Int4Weight/Int8Weight) or None

    @property
    def device(self) -> torch.device:
        return self.raw.device

    def nbytes(self) -> int:
        """Bytes held on the device: raw blocks + dense + the CPU fast-path form."""
        n = self.raw.numel() * self.raw.element_size()
        if self.dense is not None and self.dense.data_ptr() != 0:
            n += self.dense.numel() * self.dense.element_size()
        if self.packed is not None:
            n += self.packed.nbytes()
        return n

    def dequantize_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Float32 rows `ids` (T,) -> (T, K), decoded from the raw blocks (rows are independent)."""
        from minfer.quants import dequantize

        rows = self.raw[ids.to(self.raw.device)].cpu().numpy()
        out = dequantize(rows.reshape(-1), self.qtype, (len(ids), self.shape[1]))
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))


def _raw_tensor(info) -> torch.Tensor:
    """The tensor's blocks as a (rows, row_bytes) uint8 CPU tensor viewing the memory map."""
    rows = info.shape[0] if len(info.shape) == 2 else 1
    arr = np.asarray(info.data).reshape(rows, -1)
    with warnings.catch_warnings():
        # the map is read-only and we never write through this view
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


def check_type(gf, name: str, info) -> None:
    """A tensor of a ggml type minfer cannot decode (IQ2_XXS, IQ1_S, I32, ...) is a one-line
    error naming the file and the tensor (it named the type alone)."""
    from minfer.quants import is_supported, supported_types, type_name

    if not is_supported(info.qtype):
        raise MinferError(f"{gf.path}: tensor '{name}' has ggml type {type_name(info.qtype)}, which minfer "
                          f"cannot run (supported: {', '.join(t.name for t in supported_types())})")


def load_dense(gf, name: str, dtype=torch.float32) -> torch.Tensor:
    """A tensor dequantized to a float CPU tensor of its numpy-order shape."""
    from minfer.quants import dequantize

    info = gf.tensor(name)
    check_type(gf, name, info)
    out = dequantize(info.data, info.qtype, info.shape, name)
    t = torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))
    return t if dtype == torch.float32 else t.to(dtype)


def load_vector(gf, name: str, device, expect: int) -> torch.Tensor:
    """A 1-D float32 tensor (norm weight, bias) checked against its expected length."""
    info = gf.tensor(name)
    if info.n_elements != expect:
        raise MinferError(f"{gf.path}: tensor '{name}' has {info.n_elements} values, expected {expect}")
    return load_dense(gf, name).reshape(expect).to(device)


def load_qweight(gf, name: str, device, shape: tuple[int, int], dense: bool = True,
                 dtype=torch.float32) -> QWeight:
    """A 2-D weight of the expected (N, K) shape; on the CPU also its dense float matrix."""
    info = gf.tensor(name)
    if tuple(info.shape) != tuple(shape):
        raise MinferError(f"{gf.path}: tensor '{name}' has shape {tuple(info.shape)}, expected {tuple(shape)}")
    check_type(gf, name, info)
    raw = _raw_tensor(info)
    device = torch.device(device)
    if device.type == "cpu":
        d = load_dense(gf, name, dtype) if dense else None
        return QWeight(name, info.qtype, tuple(shape), raw, d)
    from minfer.device import cuda_backend

    w = QWeight(name, info.qtype, tuple(shape), raw.to(device), None)
    cuda_backend().prepare_weight(w)
    return w
