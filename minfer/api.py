"""The library entry point: `minfer.load(model) -> Engine`.

    import minfer
    eng = minfer.load("qwen2.5-coder-0.5b-instruct")
    print(eng.complete("The capital of France is", max_tokens=16, temperature=0))
"""

from __future__ import annotations


def load(model: str = "qwen2.5-coder-0.5b-instruct", device: str | None = None, ctx: int | None = None,
         dtype=None, progress: bool = True, switches=None):
    """An Engine for `model` (catalog name or .gguf path) on `device` ('cpu' or 'cuda';
    None = cuda when torch sees a GPU, else cpu). A GPU whose backend cannot load is an
    error, never a silent fall back to the CPU (minfer.device.RULE). switches: a
    minfer.switches.Switches (default: Switches.from_env())."""
    from minfer.device import resolve_device
    from minfer.runtime.engine import Engine

    return Engine.load(model, device=resolve_device(device), ctx=ctx, dtype=dtype, progress=progress,
                       switches=switches)
