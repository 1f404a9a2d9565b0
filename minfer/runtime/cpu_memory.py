"""The CPU load's memory check (Engine.load, before any weight is read): a model whose weights
cannot fit in the memory available is one MinferError naming the file, the GiB needed and
available, and what to do, instead of the kernel's OOM kill (or swapping) part-way through the
load. The KV cache has its own check (commands/preflight.py check_ctx).

What a CPU load holds (models/*.py from_gguf, ops/cpu_quant.py prepare_model): every matrix
dequantized to a dense copy of the load's dtype (float32 by default) -- the untied token
embedding excepted, whose rows are decoded from the file's blocks -- and 1-D tensors in float32.
With MINFER_CPU_QUANT the dense copies are packed (int4/int8) one at a time after the load, so
the peak is still all of them, plus the largest matrix's int32 codes while pack4 runs. Stacked
MoE experts get no dense copy at the load: with MINFER_CPU_QUANT each expert is packed from its
blocks (ops/cpu_experts.py: int4 0.625 bytes a weight, int8 1 byte); without it (the float32
reference) they are then made dense, one tensor at a time (cpu_experts.densify_experts). The estimate takes the default split's forms (int4 for the ffn_ matrices and
experts); a load whose calibration refuses int4 repacks them in int8, one tensor at a time, which
ends up to 0.375 bytes a weight larger (not known before the load: the check runs on the model). The file itself is memory-mapped: its pages are the page cache's, counted in
the available memory and not here.
"""

from __future__ import annotations

import torch

from minfer.errors import MinferError


# The process before any weight (python, torch, minfer; measured 0.22 GiB) and the calibration's
# activations: a floor under every estimate.
BASE_BYTES = 256 << 20
# Temporaries while pack4 packs the largest matrix, per weight: its int32 codes for torch's packing
# call (4), the uint8 codes (1), the plain nibbles and the kernel's layout (0.5 + 0.5); the
# vocabulary's int8 refinement rows (1) come on top. Measured on a 4-layer Qwen3-30B-A3B geometry
# (docs/perf-log.md "CPU MoE experts"): peak RSS less the mapped file 4.5 GiB, this estimate 4.8.
PACK_TEMP_PER_WEIGHT = 7


def cpu_load_bytes(gf, cpu_quant: bool, dtype=torch.float32) -> int:
    """The estimated peak of the memory a CPU load of GGUFFile gf allocates (bytes)."""
    from minfer.ops import cpu_experts
    from minfer.ops import cpu_quant as cq

    elem = torch.finfo(dtype or torch.float32).bits // 8
    total = BASE_BYTES
    for name, t in gf.tensors.items():
        if _experts(name, t):
            kind = name.split(".")[-2]
            total += (cpu_experts.packed_bytes(t.shape, kind.startswith(cq.INT4_MATRICES)) if cpu_quant
                      else t.n_elements * elem)
        elif len(t.shape) >= 2:
            if not _untied_embedding(gf, name):
                total += t.n_elements * elem
        else:
            total += t.n_elements * 4
    return total + (pack_overhead(gf) if cpu_quant else 0)


def pack_overhead(gf) -> int:
    """The packing's temporaries (PACK_TEMP_PER_WEIGHT of the largest dense matrix)."""
    sizes = [t.n_elements for name, t in gf.tensors.items()
             if len(t.shape) == 2 and not _experts(name, t) and not _untied_embedding(gf, name)]
    return PACK_TEMP_PER_WEIGHT * max(sizes, default=0)


def _experts(name: str, t) -> bool:
    return len(t.shape) == 3 and "_exps." in name


def _untied_embedding(gf, name: str) -> bool:
    """The token embedding of a model with its own output matrix: kept as blocks (rows decoded)."""
    return name == "token_embd.weight" and "output.weight" in gf.tensors


def check_cpu_memory(gf, cpu_quant: bool, dtype=None, available: int | None = None) -> None:
    """A MinferError when cpu_load_bytes exceeds the available memory (available: None reads
    MemAvailable; no figure, no check)."""
    from minfer.device import available_memory

    free = available_memory("cpu") if available is None else available
    if free is None:
        return
    need = cpu_load_bytes(gf, cpu_quant, dtype)
    if need <= free:
        return
    other = cpu_load_bytes(gf, not cpu_quant, dtype)
    if cpu_quant:
        alt = f"MINFER_CPU_QUANT=0 (the float32 reference) would need about {_gib(other)}"
    else:
        alt = f"MINFER_CPU_QUANT=1 (the default: int4/int8 matrices) would need about {_gib(other)}"
    how = (f"{alt}{'' if other <= free else ', also too much'}; or load it on a GPU (device='cuda', "
           "--device cuda), free memory, or use a smaller model or quantization")
    raise MinferError(f"{gf.path}: loading this model on the CPU needs about {_gib(need)} of memory but "
                      f"{_gib(free)} is available; {how}")


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
