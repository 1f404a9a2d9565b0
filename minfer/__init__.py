"""minfer: GGUF language models from Python, on the CPU (reference) and NVIDIA GPUs (Triton)."""

from minfer.errors import MinferError

__version__ = "0.1.0"

__all__ = ["MinferError", "__version__"]
