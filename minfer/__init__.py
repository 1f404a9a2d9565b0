"""minfer: GGUF language models from Python, on the CPU (reference) and NVIDIA GPUs (Triton)."""

from minfer.api import load
from minfer.errors import MinferError

__version__ = "0.1.0"

__all__ = ["MinferError", "load", "__version__"]
