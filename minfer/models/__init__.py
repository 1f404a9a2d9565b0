"""Model architectures by GGUF `general.architecture`."""

from __future__ import annotations

from minfer.errors import MinferError
from minfer.models.llama import LlamaModel
from minfer.models.qwen2 import Qwen2Model

ARCHITECTURES = {
    "llama": LlamaModel,
    "qwen2": Qwen2Model,
}


def model_class(arch: str):
    if arch not in ARCHITECTURES:
        raise MinferError(f"architecture '{arch}' is not supported (supported: {', '.join(ARCHITECTURES)})")
    return ARCHITECTURES[arch]


def load_model(gf, device="cpu", dtype=None, progress: bool = True):
    """The model of a GGUFFile, its weights on `device`."""
    import torch

    from minfer.config import ModelConfig

    cfg = ModelConfig.from_gguf(gf)
    return model_class(cfg.arch).from_gguf(gf, cfg, device=device, dtype=dtype or torch.float32,
                                           progress=progress)
