"""The CPU load's memory check (Engine.load, before any weight is read): a model whose weights
cannot fit in the memory available is one MinferError naming the file, the GiB needed and
available, and what to do, instead of the kernel's OOM kill (or swapping) part-way through the
load. The KV cache has its own check (commands/preflight.py check_ctx).

What a CPU load holds (models/*.py from_gguf, ops/cpu_quant.py prepare_model): every matrix
dequantized to a dense copy of the load's dtype (float32 by default) -- the untied token
embedding excepted, whose rows are decoded from the file's blocks -- and 1-D tensors in float32.
Stacked MoE experts get no dense copy at the load: with MINFER_CPU_QUANT each expert is packed
from its blocks (ops/cpu_experts.py: int4 0.625 bytes a weight, int8 1 byte); without it (the
float32 reference) they are then made dense, one tensor at a time (cpu_experts.densify_experts).
With MINFER_CPU_QUANT the dense copies are packed (int4/int8) one at a time after the load
(cpu_load_bytes walks that order). The estimate takes the default split's forms (int4 for the
ffn_ matrices, the experts and the vocabulary); a load whose calibration refuses int4 repacks
them in int8, one tensor at a time, up to 0.375 bytes a weight larger (not known before the
load: the check runs on the model). The file itself is memory-mapped: its pages are the page
cache's, counted in the available memory and not here. Measured on a 4-layer Qwen3-30B-A3B
geometry (docs/perf-log.md "CPU MoE experts"): estimate 4.95 GiB with the switch, 11.85 without;
peak RSS less the mapped file 4.7 and 10.6 GiB.
"""

from __future__ import annotations

import torch

from minfer.errors import MinferError


# The process before any weight (python, torch, minfer; measured 0.22 GiB) and the calibration's
# activations: a floor under every estimate.
BASE_BYTES = 256 << 20
# pack4's temporaries a weight while it packs a matrix: the uint8 codes (1) and their int32 copy for
# torch's packing call (4); its outputs (the kernel's layout, the plain nibbles, the scales: 1.125
# bytes a weight, and the vocabulary's int8 refinement rows) are counted as the packed form.
PACK4_TEMP_PER_WEIGHT = 5


def cpu_load_bytes(gf, cpu_quant: bool, dtype=torch.float32) -> int:
    """The estimated peak of the memory a CPU load of GGUFFile gf allocates (bytes): after the load
    every dense copy at once (the calibration's float32 pass runs then); with cpu_quant, then the
    packing in the model's order (the embedding, each layer's matrices, the output), where a
    matrix being packed holds its dense copy, its packed form and pack4's temporaries while those
    before it are packed and those after it still dense."""
    elem = torch.finfo(dtype or torch.float32).bits // 8
    forms = _forms(gf, cpu_quant, elem)
    cur = BASE_BYTES + sum(f[0] for f in forms)
    peak = cur
    for dense, packed, temp in forms:
        peak = max(peak, cur + packed + temp)
        cur += packed - dense
    return peak


def expert_bytes(gf, cpu_quant: bool, dtype=torch.float32) -> int:
    """What the stacked expert tensors hold after the load: packed, or float32 (dtype) dense."""
    elem = torch.finfo(dtype or torch.float32).bits // 8
    return sum(_form(gf, name, t, cpu_quant, elem)[1 if cpu_quant else 0] for name, t in _ordered(gf)
               if _experts(name, t))


def _forms(gf, cpu_quant: bool, elem: int) -> list[tuple[int, int, int]]:
    """(bytes right after the load, bytes packed, packing temporaries) of each tensor, in the
    order prepare_model packs them."""
    return [_form(gf, name, t, cpu_quant, elem) for name, t in _ordered(gf)]


def _form(gf, name: str, t, cpu_quant: bool, elem: int) -> tuple[int, int, int]:
    from minfer.ops import cpu_experts
    from minfer.ops import cpu_quant as cq

    n = t.n_elements
    if len(t.shape) < 2:
        return 4 * n, 4 * n, 0                                  # norms, biases: float32, kept
    if _experts(name, t):
        int4 = name.split(".")[-2].startswith(cq.INT4_MATRICES)
        packed = cpu_experts.packed_bytes(t.shape, int4)
        return (0, packed, 0) if cpu_quant else (n * elem, n * elem, 0)
    if name == "token_embd.weight" and "output.weight" in gf.tensors:
        return 0, 0, 0                                          # untied embedding: rows decoded from blocks
    if not cpu_quant or len(t.shape) != 2:                      # (3-D: deepseek2's attn_k_b / attn_v_b, kept dense)
        return n * elem, n * elem, 0
    N, K = t.shape
    output = name == "output.weight" or (name == "token_embd.weight" and "output.weight" not in gf.tensors)
    kind = "output" if output else name.split(".")[-2]
    int8 = n + 2 * N
    if kind.startswith(cq.INT4_MATRICES) and cq.int4_fits((N, K)):
        packed = n + n // 8 + (int8 if output else 0)          # layout + nibbles + scales (+ refinement)
        return n * elem, packed, PACK4_TEMP_PER_WEIGHT * n
    return n * elem, int8, 0


def _ordered(gf):
    """gf's tensors in prepare_model's order: the embedding, the layers by index, the rest."""
    def key(item):
        name = item[0]
        if name.startswith("token_embd."):
            return (0, 0)
        if name.startswith("blk."):
            part = name.split(".")[1]
            return (1, int(part) if part.isdigit() else 0)
        return (2, 0)
    return sorted(gf.tensors.items(), key=key)


def _experts(name: str, t) -> bool:
    # the routed experts and grovemoe's chunk ("adjugate") experts, both packed as experts by the loader
    return len(t.shape) == 3 and ("_exps." in name or "_chexps." in name)


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
