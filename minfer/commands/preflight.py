"""Checks made before any slow work: a download, a load, a KV cache allocation.

- A catalog model whose architecture minfer cannot run is refused before it is downloaded
  (the catalog knows the architecture; minfer.models.ARCHITECTURES knows what runs); an encoder's
  file (bert) before its load by a command that generates.
- A context whose KV cache cannot fit in the memory available is a one-line error, and one
  past the model's trained length is a warning.
"""

from __future__ import annotations

from minfer.errors import MinferError

DEFAULT_CTX_CAP = 4096   # the engine's default context: the model's trained length, at most this


def check_runnable(model_arg: str) -> None:
    """Refuse a catalog model whose architecture has no implementation, before any download."""
    from pathlib import Path

    from minfer.catalog import CATALOG, runnable_archs

    if Path(model_arg).expanduser().exists() or model_arg not in CATALOG:
        return   # a file is checked when its header is read (cheap); an unknown name fails later
    m = CATALOG[model_arg]
    archs = runnable_archs()
    if m.arch not in archs:
        raise MinferError(f"{model_arg}: architecture '{m.arch}' cannot run in minfer yet (runnable: "
                          f"{', '.join(sorted(archs))}); nothing was downloaded -- `minfer pull "
                          f"{model_arg}` and `minfer inspect -m {model_arg}` still work")


def check_generates(gf) -> None:
    """Refuse, before the load, an encoder's file (Model.causal False: bert, which has no lm head) for a command
    that needs logits (run, chat, perplexity, bench; serve's generation routes answer 400 instead)."""
    from minfer.models import ARCHITECTURES

    cls = ARCHITECTURES.get(gf.architecture)
    if cls is not None and not cls.causal:
        raise MinferError(f"{gf.path}: {gf.architecture} is an encoder (bidirectional attention, no lm head): it only "
                          "embeds; use `minfer embed`, Engine.embed or the server's /v1/embeddings")


def check_model(model_arg: str):
    """The open GGUFFile of a model minfer can run (catalog name or path), or a one-line
    MinferError: for commands that hand the model to code reading its hyper-parameters before
    Engine.load would check them (bench's ModelStats), which all generate (an encoder refused)."""
    from minfer.catalog import resolve_model
    from minfer.config import ModelConfig
    from minfer.gguf_file import GGUFFile
    from minfer.models import model_class

    check_runnable(model_arg)
    gf = GGUFFile(resolve_model(model_arg))
    try:
        model_class(gf.architecture)
    except MinferError as e:
        raise MinferError(f"{gf.path}: {e}") from None
    check_generates(gf)
    ModelConfig.from_gguf(gf)   # a missing or wrong hyper-parameter: one line naming the key
    return gf


def check_kv_fits(gf, n_ctx: int, device: str, what: str) -> None:
    """A one-line MinferError when a KV cache of n_ctx positions cannot fit in the memory
    available. `what` starts the message: the flags that set n_ctx ("-p/-n/-d: the longest test
    needs a context of")."""
    cfg = cache_config(gf)
    per, fixed = kv_bytes_per_token(cfg, device), state_bytes(cfg)
    free = available_bytes(device)
    if free is not None and n_ctx * per + fixed > free:
        raise MinferError(f"{what} {n_ctx} tokens, whose KV cache would need "
                          f"{_gib(n_ctx * per + fixed)} of {device} memory but {_gib(free)} is available; "
                          f"at most {max(free - fixed, 0) // per} tokens fit")


def available_bytes(device: str) -> int | None:
    """Memory a new allocation can take: free GPU memory on cuda, MemAvailable on the CPU
    (minfer.device.available_memory)."""
    from minfer.device import available_memory

    return available_memory(device)


def cache_config(gf):
    """The file's ModelConfig as the model's caches see it: with the per-layer geometry a model
    class declares (cache_config: gemma4's own head size and kv heads per layer, none for shared-KV
    layers; runtime/kv_cache.py kv_layers), else the header's config as read."""
    from minfer.config import ModelConfig
    from minfer.models import model_class

    cfg = ModelConfig.from_gguf(gf)
    declare = getattr(model_class(gf.architecture), "cache_config", None)
    return declare(gf, cfg) if declare is not None else cfg


def kv_bytes_per_token(cfg, device: str) -> int:
    """Keys + values of one position over all layers: float32 on the CPU (the reference), 2 bytes
    on CUDA (bf16 activations, unless MINFER_ACT_DTYPE=float32). Keys only where the values are a
    view of them (cfg.cache_v_in_k: deepseek2's latent cache); with per-layer geometry (cfg from
    cache_config) the sum over the layers that own a cache: runtime/kv_cache.py's
    kv_bytes_per_position, what the caches allocate."""
    from minfer.runtime.kv_cache import kv_bytes_per_position
    from minfer.switches import Switches

    elem = 4 if device != "cuda" or Switches.from_env().act_dtype in ("float32", "fp32") else 2
    return kv_bytes_per_position(cfg, elem)


def state_bytes(cfg) -> int:
    """The recurrent state one sequence keeps next to its rows, whatever the context (float32;
    granitehybrid's Mamba-2 layers: runtime/kv_cache.py state_bytes); 0 for other models."""
    from minfer.runtime.kv_cache import state_bytes as sb

    return sb(cfg)


def _gib(n: float) -> str:
    # MiB below a GiB: a small model's or a test's cache read "needs 0.0 GiB but 0.0 GiB is available"
    if n < 2**30:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**30:.1f} GiB" if n < 2**40 else f"{n / 2**40:.1f} TiB"


def check_ctx(gf, ctx: int | None, device: str, warn) -> int:
    """The context the engine will get (ctx, or the default) for the open GGUFFile gf; a one-line
    MinferError when it is not positive or its KV cache cannot fit; warn(msg) when it is past
    the trained length."""
    if ctx is not None and ctx < 1:
        raise MinferError(f"-c/--ctx {ctx}: expected a positive number of tokens")
    from minfer.models import model_class

    try:
        cls = model_class(gf.architecture)   # the models registry decides what runs
    except MinferError as e:
        raise MinferError(f"{gf.path}: {e}") from None
    cfg = cache_config(gf)
    n = ctx if ctx is not None else min(cfg.context_length, DEFAULT_CTX_CAP)
    need = n * kv_bytes_per_token(cfg, device) + state_bytes(cfg)
    free = available_bytes(device)
    if free is not None and need > free and getattr(cls, "causal", True):   # an encoder has no KV cache
        fits = max(free - state_bytes(cfg), 0) // kv_bytes_per_token(cfg, device)
        raise MinferError(f"-c/--ctx {n}: the KV cache would need {_gib(need)} of {device} memory but "
                          f"{_gib(free)} is available; use -c {min(fits, cfg.context_length)} or less")
    if ctx is not None and ctx > cfg.context_length and "position_embd.weight" in gf.tensors:
        # a learned position table (GPT-2, StarCoder) has no row past it: the load refuses such a
        # --ctx, so say so now rather than warn "may degrade" and fail later (serve: in the background)
        raise MinferError(f"{gf.path}: -c/--ctx {ctx} is past the model's learned position table "
                          f"(position_embd.weight, {gf.architecture}.context_length {cfg.context_length}): "
                          f"use --ctx {cfg.context_length} or less")
    if ctx is not None and ctx > cfg.context_length:
        warn(f"-c/--ctx {ctx} is past the {cfg.context_length} tokens {gf.path.name} was trained on; "
             "text beyond that length may degrade")
    return n


def _size(n: float) -> str:
    """Bytes as the size flags take them: 1.5G, 90M, 12K."""
    for unit, scale in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale:
            v = -(-n * 10 // scale) / 10   # rounded up: a size the user can pass back and that suffices
            return f"{v:g}{unit}"
    return f"{int(n)}"


def check_batch(gf, n_ctx: int, device: str, parallel: int, kv_memory: int | None,
                token_budget: int | None, warn=None) -> None:
    """`minfer serve -np N`'s paged KV pool and token budget, checked from the file's header before
    the load (they were refused only by the background load, after the server had started, or
    silently shrank what a sequence may hold). `parallel`: the -np the server will use (1: one
    request at a time, which has no pool; 0: as many as the memory holds)."""
    if parallel == 1:
        return
    from minfer.runtime.batch_engine import BLOCK_SIZE, DEFAULT_SLOTS

    bs = BLOCK_SIZE
    per_block = max(1, kv_bytes_per_token(cache_config(gf), device) * bs)   # PagedKVCache.bytes_per_block's floor
    ctx_blocks = -(-n_ctx // bs)
    # the slots the engine will make (BatchEngine.from_engine): on CUDA with -np 0 they come from
    # the free memory after the load, unknown here
    slots = parallel or (DEFAULT_SLOTS["cpu"] if device != "cuda" else None)
    blocks_of = f"KV blocks of {bs} positions ({per_block / 2**20:.2f} MiB each)"
    if kv_memory is not None:
        usable = kv_memory // per_block - 1    # block 0 pads block tables (block_manager.py)
        if usable < ctx_blocks:
            have = max(usable, 0)
            raise MinferError(f"--kv-memory {_size(kv_memory)} holds {have} {blocks_of} = {have * bs} tokens, "
                              f"but one sequence of the full context ({n_ctx} tokens, -c/--ctx) needs "
                              f"{ctx_blocks} blocks: give --kv-memory {_size((ctx_blocks + 1) * per_block)} or "
                              "more, or a smaller -c/--ctx")
        if slots is not None and slots > usable:
            raise MinferError(f"-np {slots}: --kv-memory {_size(kv_memory)} holds {usable} {blocks_of}, so at "
                              f"most {usable} sequences run at once even at one block each; give -np {usable} "
                              f"or less, or --kv-memory {_size((slots + 1) * per_block)} or more")
        if warn is not None and slots is not None and usable * 4 < slots * ctx_blocks:
            # below the engine's own default sizing (a quarter context per slot, batch_engine.py):
            # it runs, but full slots preempt and recompute each other
            warn(f"-np {slots} with --kv-memory {_size(kv_memory)}: {usable} blocks give each sequence "
                 f"{usable * bs // slots} positions on average, under a quarter of the {n_ctx}-token context; "
                 "when all slots are busy, the newest sequences are preempted and recomputed (lost work). "
                 f"--kv-memory {_size((slots * ctx_blocks // 4 + 1) * per_block)} gives a quarter context each")
    if token_budget is not None and slots is not None and token_budget < slots:
        raise MinferError(f"--token-budget {token_budget} is below -np {slots}: every step carries one "
                          f"decode token per running sequence; give --token-budget {slots} or more")
    pool = kv_memory if kv_memory is not None else (
        (slots * ctx_blocks + 1) * per_block if device != "cuda" else None)   # CUDA: sized after the load
    if pool is not None and slots is not None:
        pool += (slots + 1) * state_bytes(cache_config(gf))   # recurrent state slots (runtime/paged_state.py)
    free = available_bytes(device)
    if pool is not None and free is not None and pool > free:
        if kv_memory is not None:
            raise MinferError(f"--kv-memory {_size(kv_memory)}: the paged KV cache would need {_gib(pool)} of "
                              f"{device} memory but {_gib(free)} is available; give a smaller --kv-memory")
        fits = (free // per_block - 1) // ctx_blocks
        raise MinferError(f"-np {slots} full contexts of {n_ctx} tokens (the default pool without --kv-memory): "
                          f"the paged KV cache would need {_gib(pool)} of {device} memory but {_gib(free)} is "
                          f"available, which holds {fits}; give -np {fits} or less, a smaller -c/--ctx, or a "
                          "--kv-memory that fits (sequences past it are preempted and recomputed)")


def check_parallel_bench(gf, device: str, n_max: int, pp: int, tg: int, kv_memory: int | None) -> None:
    """`minfer bench --parallel`: the paged KV pool (--kv-memory, or the bench's default for the
    largest batch) holds one whole sequence and fits in the memory available, checked before the
    load (--parallel 100000 was a 69 GiB allocation's traceback after it)."""
    from minfer.bench.parallel import default_kv_memory
    from minfer.runtime.batch_engine import BLOCK_SIZE

    per_block = kv_bytes_per_token(cache_config(gf), device) * BLOCK_SIZE
    seq_blocks = -(-(pp + tg + 1) // BLOCK_SIZE)
    if kv_memory is not None and kv_memory // per_block - 1 < seq_blocks:
        raise MinferError(f"--kv-memory {_size(kv_memory)} holds {max(kv_memory // per_block - 1, 0)} KV blocks of "
                          f"{BLOCK_SIZE} positions, but one sequence of -p {pp} + -n {tg} needs {seq_blocks}: give "
                          f"--kv-memory {_size((seq_blocks + 1) * per_block)} or more")
    pool = kv_memory if kv_memory is not None else default_kv_memory(per_block, n_max, pp, tg)
    pool += (n_max + 1) * state_bytes(cache_config(gf))   # recurrent state slots (runtime/paged_state.py)
    free = available_bytes(device)
    if free is not None and pool > free:
        if kv_memory is not None:
            raise MinferError(f"--kv-memory {_size(kv_memory)}: the paged KV cache would need {_gib(pool)} of "
                              f"{device} memory but {_gib(free)} is available; give a smaller --kv-memory")
        fits = max(1, (free // per_block // 2 - 2) // seq_blocks)
        raise MinferError(f"--parallel {n_max}: the default KV pool ({n_max} sequences of -p {pp} + -n {tg}, "
                          f"twice) would need {_gib(pool)} of {device} memory but {_gib(free)} is available; "
                          f"give batch sizes up to about {fits}, or a --kv-memory that fits (sequences past "
                          "it are preempted and recomputed)")
