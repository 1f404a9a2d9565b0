"""Stacked MoE expert tensors on the CPU fast path (MINFER_CPU_QUANT): each expert packed on its
own in cpu_quant's int4 (groups of 32) or int8 (per row) form, the experts' tensors stacked, so
that moe_ffn runs one of cpu_quant's weight-only kernels per selected expert and matrix.

The loader keeps no dense float32 copy of an expert tensor (models/qwen3moe.py load_experts): a
Qwen3-30B-A3B Q4_K_M file (17 GB) is 120 GB of float32. pack_experts decodes one expert's rows
at a time from the file's blocks (a few MB), requantizes them exactly as cpu_quant.pack/pack4 do
a whole matrix (the same function: the same bytes), and drops them. The int4 form keeps only the
kernel's layout and the scales (0.625 bytes a weight): the plain-order nibbles an Int4Weight also
keeps for its bf16 prefill GEMM are left out, so an expert's matmul is the int4 kernel for any
number of tokens (docs/perf-log.md "CPU MoE experts": measured against the alternatives).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from minfer.ops import cpu_quant, reference


@dataclass(eq=False)
class PackedExperts:
    """E experts of N rows by K inputs, expert e's form in a[e], b[e]:
    int4: a (E, N, K/2) uint8 in the int4 kernel's layout, b (E, K/group, N, 2) bfloat16 s, z
    (cpu_quant.Int4Weight's packed and sz); int8: a (E, N, K) int8, b (E, N) bfloat16 scales
    (cpu_quant.Int8Weight's q and scale)."""

    kind: str                  # "int4" or "int8"
    a: torch.Tensor
    b: torch.Tensor
    shape: tuple[int, int]     # (N, K) of one expert
    group: int = cpu_quant.INT4_GROUP
    kernel: bool = True        # int8: aten._weight_int8pack_mm takes it (decided by pack_experts)

    @property
    def n_experts(self) -> int:
        return self.a.shape[0]

    @property
    def refine_top(self) -> int:     # as Int4Weight/Int8Weight (experts never refine)
        return 0

    def numel(self) -> int:
        return self.n_experts * self.shape[0] * self.shape[1]

    def nbytes(self) -> int:
        return self.a.numel() * self.a.element_size() + self.b.numel() * self.b.element_size()

    def linear(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """x (n, K) float32 @ expert e's W^T -> (n, N) float32 (bf16 activations, as cpu_quant)."""
        xb = x.to(torch.bfloat16).contiguous()
        if self.kind == "int4":
            return torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.a[e], self.group, self.b[e]).float()
        if not self.kernel:       # refused at pack time (cpu_quant.int8_kernel_refused)
            from minfer.ops import paths

            paths.count("cpu.int8.unaligned_bf16")
            return (xb @ (self.a[e].to(torch.bfloat16) * self.b[e].to(torch.bfloat16)[:, None]).t()).float()
        return torch.ops.aten._weight_int8pack_mm(xb, self.a[e], self.b[e]).float()

    def dequantize(self, e: int) -> torch.Tensor:
        """Expert e's (N, K) float32 weights as the kernel computes with them (tests; int4: read
        back through the kernel with the identity, so rounded to bf16 by its output)."""
        if self.kind == "int8":
            return self.a[e].float() * self.b[e].float()[:, None]
        K = self.shape[1]
        return self.linear(e, torch.eye(K)).t().contiguous()


def threads_for(p: PackedExperts):
    """The thread count for expert p's kernels, set once around moe_ffn's expert loop."""
    return _threads(p.shape[0] * p.shape[1])


@contextlib.contextmanager
def _threads(weights: int):
    """One thread while inside, for a matrix of at most cpu_quant.ONE_THREAD_MAX_WEIGHTS weights
    (cpu_quant.linear's rule: waking the second thread costs more than such a matrix takes, and
    on a busy machine far more; the kernels split rows between threads, so the values are the
    same either way); the count comes back after."""
    n = torch.get_num_threads()
    one = n > 1 and weights <= cpu_quant.ONE_THREAD_MAX_WEIGHTS
    if one:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if one:
            torch.set_num_threads(n)


class _Rows:
    """A stand-in QWeight holding one expert's float32 rows, for cpu_quant.pack/pack4."""

    def __init__(self, name: str, dense: torch.Tensor):
        self.name, self.dense, self.shape = name, dense, tuple(dense.shape)


def pack_experts(w, int4: bool) -> PackedExperts:
    """The packed form of stacked expert QWeight w (shape (E*N, K), w.n_experts = E), one expert
    at a time from its blocks: int4 when asked and the expert's shape fits the kernel, else int8
    (a width the int8 kernel cannot take refused for it here, once for the tensor)."""
    E = w.n_experts
    N, K = w.shape[0] // E, w.shape[1]
    int4 = int4 and cpu_quant.int4_fits((N, K))
    a = b = None
    with _threads(N * K):
        for e in range(E):
            a, b = _pack_one(w, e, N, int4, a, b)
    kernel = int4 or not cpu_quant.int8_kernel_refused(w.name, K)
    return PackedExperts("int4" if int4 else "int8", a, b, (N, K), kernel=kernel)


def _pack_one(w, e: int, N: int, int4: bool, a, b):
    """Pack expert e into a[e], b[e] (allocated (E, ...) at the first expert); returns a, b."""
    rows = _Rows(f"{w.name}[{e}]", reference._expert(w, e, N).float())
    if int4:
        p = cpu_quant.pack4(rows, cpu_quant.INT4_GROUP)
        pa, pb = p.packed, p.sz
    else:
        pa, pb = cpu_quant.int8_rows(rows.dense)
    if a is None:
        a = torch.empty((w.n_experts, *pa.shape), dtype=pa.dtype)
        b = torch.empty((w.n_experts, *pb.shape), dtype=pb.dtype)
    a[e], b[e] = pa, pb
    return a, b


def densify_experts(model, dtype=None) -> None:
    """Give every stacked expert QWeight of a CPU model its dense copy (dtype: default float32),
    decoded one expert at a time into it: the float32 reference's form (Engine.load with
    MINFER_CPU_QUANT=0). Decoding the selected experts from the blocks at each step instead
    (what _expert does for a weight with no dense copy) gives the same values but was 6x slower
    a decode step (docs/perf-log.md "CPU MoE experts")."""
    for w in model.qweights():
        E = getattr(w, "n_experts", None)
        if not E or w.dense is not None or w.raw.device.type != "cpu":
            continue
        N = w.shape[0] // E
        dense = torch.empty(w.shape, dtype=dtype or torch.float32)
        for e in range(E):
            dense[e * N:(e + 1) * N] = reference._expert(w, e, N)
        w.dense = dense


def packed_bytes(shape: tuple[int, int, int], int4: bool) -> int:
    """Bytes pack_experts gives an (E, N, K) expert tensor (the memory check's estimate)."""
    E, N, K = shape
    if int4 and cpu_quant.int4_fits((N, K)):
        return E * (N * K // 2 + 4 * N * (K // cpu_quant.INT4_GROUP))
    return E * (N * K + 2 * N)
