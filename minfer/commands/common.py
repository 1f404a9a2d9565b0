"""Arguments shared by the commands that run a model."""

from __future__ import annotations

import argparse

DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"


def add_model_arg(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("-m", "--model", default=None if required else DEFAULT_MODEL, required=required,
                   help="path to a .gguf file or a catalog name (`minfer list`); a catalog model "
                   f"is pulled on first use (default: {DEFAULT_MODEL})" if not required else
                   "path to a .gguf file or a catalog name (`minfer list`)")


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                   help="where to run: cuda (the default when a GPU is present) or cpu")


def resolve_device(name: str | None) -> str:
    """The device to run on: the one asked for, else cuda when present, else cpu."""
    import torch

    from minfer.errors import MinferError

    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise MinferError("--device cuda was asked for, but torch sees no CUDA GPU on this machine "
                          f"(torch {torch.__version__}); use --device cpu")
    return name
