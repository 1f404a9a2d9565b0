"""The library entry point: `minfer.load(model) -> Engine`.

    import minfer
    eng = minfer.load("qwen2.5-coder-0.5b-instruct")
    print(eng.complete("The capital of France is", max_tokens=16, temperature=0))
"""

from __future__ import annotations


def load(model: str = "qwen2.5-coder-0.5b-instruct", device: str | None = None, ctx: int | None = None,
         dtype=None, progress: bool = True):
    """An Engine for `model` (catalog name or .gguf path) on `device` ('cpu' or 'cuda';
    None = cuda when present and its backend exists, else cpu)."""
    from minfer.runtime.engine import Engine

    if device is None:
        import torch

        device = "cpu"
        if torch.cuda.is_available():
            from minfer.errors import MinferError
            from minfer.weights import cuda_backend

            try:
                cuda_backend()
                device = "cuda"
            except MinferError:
                pass
    return Engine.load(model, device=device, ctx=ctx, dtype=dtype, progress=progress)
