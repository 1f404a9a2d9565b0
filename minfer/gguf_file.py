"""Open and validate a GGUF file through llama.cpp's `gguf` package.

GGUFFile gives plain-Python metadata (str/int/float/bool/list) and a tensor table whose
entries carry the raw blocks as a memory-mapped uint8 array. Shapes are in torch/numpy
order: (rows, cols) = reversed ggml `ne` (ggml lists the fastest-varying dimension first).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from minfer.errors import MinferError


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: int              # ggml type id (gguf.GGMLQuantizationType value)
    shape: tuple[int, ...]  # numpy order: (rows, cols) for a 2-D weight
    n_elements: int
    n_bytes: int
    offset: int             # absolute byte offset in the file
    data: np.ndarray        # uint8, (n_bytes,), memory-mapped raw blocks

    @property
    def type_name(self) -> str:
        import gguf

        try:
            return gguf.GGMLQuantizationType(self.qtype).name
        except ValueError:
            return f"type{self.qtype}"


class GGUFFile:
    """A validated GGUF file: `metadata`, `tensors` (name -> TensorInfo), `architecture`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            raise MinferError(f"{self.path}: no such file")
        import gguf

        try:
            reader = gguf.GGUFReader(str(self.path), "r")
        except Exception as e:  # the gguf package raises ValueError/IndexError/... on bad bytes
            raise MinferError(f"{self.path}: not a readable GGUF file: {e}") from e
        self.metadata: dict[str, Any] = {}
        for name, field in reader.fields.items():
            if name.startswith("GGUF."):
                continue
            self.metadata[name] = field.contents()
        self.tensors: dict[str, TensorInfo] = {}
        for t in reader.tensors:
            shape = tuple(int(x) for x in reversed(t.shape.tolist()))
            data = np.asarray(t.data).reshape(-1).view(np.uint8)
            self.tensors[t.name] = TensorInfo(t.name, int(t.tensor_type), shape, int(t.n_elements),
                                              int(t.n_bytes), int(t.data_offset), data)

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture"))

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise MinferError(f"{self.path}: metadata key '{key}' is missing")
        return self.metadata[key]

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """`{architecture}.{suffix}`, e.g. arch_get('block_count')."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    def tensor(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise MinferError(f"{self.path}: tensor '{name}' is missing")
        return self.tensors[name]


def open_gguf(path: str | Path) -> GGUFFile:
    return GGUFFile(path)
