"""The CPU fast path for matmuls: weights requantized at load, the feed-forward and vocabulary
matrices to int4 in groups of 32 and the attention matrices to per-row int8, so a decode step
reads 5 (int4 + a bf16 scale and offset per 32) or 8 bits per weight instead of the reference's 32.

Why these formats (measured on the 2-core CI machine's kind with the 0.5B's shapes and file,
docs/perf-log.md "the CPU path"): a decode step is a chain of matrix-vector products. One
token's matmuls took int8 (`aten._weight_int8pack_mm`: bf16 activations, one bf16 scale per
row) 86 ms, int4 (`aten._weight_int4pack_mm_for_cpu`, group 32) 43 ms, fbgemm's dynamic int8
linear 58 ms (and deprecated), bf16 dense 136 ms. Both weight-only kernels take float32 inputs
only through a scalar loop, hence bf16 activations. int4 is a second, coarser rounding of the
file's Q5_0/Q6_K/Q4_K/Q8_0 blocks: with every matrix in int4 the 0.5B's perplexity rose 4.1%
over float32 (the attention matrices cost most of it), with this split 1.2%, int8 everywhere 0.1%.

    prepare_model(model)            # at load (Engine.load, switch MINFER_CPU_QUANT, on by default)
    y = linear(x, w.packed, bias)   # (T, K) float32 -> (T, N) float32

- T <= DECODE_MAX_M rows (decode, short prompts): the int4 or int8 kernel.
- more rows (prefill): the weights dequantized to bf16 and one bf16 GEMM (oneDNN), faster than
  the int8 kernel past ~32 rows and than float32 MKL at 512.
- the output (vocabulary) projection: its result comes back in bf16, too coarse for logits
  (a step of 0.125 at 16-32), so the REFINE_TOP largest logits of each row are recomputed in
  float32 from per-row int8 copies of its rows (an int4 vocabulary matrix keeps one, read only
  for those rows); greedy choices and the probability mass that matters are then those of int8
  weights in float32 arithmetic. Prefill's all-row logits (perplexity) use a float32 GEMM of the
  dequantized int8 rows.

The float32 reference (MINFER_CPU_QUANT=0) stays the path every kernel and golden is checked
against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

DECODE_MAX_M = 16   # rows up to which the int8 kernel beats dequantize + bf16 GEMM (measured crossover ~32)
REFINE_TOP = 64     # logits per row recomputed in float32 after the bf16 vocabulary projection
# Decode matmuls of at most this many weights run on one thread: with passive OpenMP waiting,
# waking the second thread cost ~100 us a call, more than a small matrix takes (one token,
# 2 threads vs 1, from memory: k/v 128x896 int8 130 vs 25 us, q/o 896x896 160 vs 95 us; the
# feed-forward's 4864x896 int4 350 vs 440 us, so those keep both threads). The kernels split
# the rows between threads, so the result is the same either way. set_num_threads is
# process-wide: an op another Python thread starts meanwhile also runs on one thread (speed only).
ONE_THREAD_MAX_WEIGHTS = 2_000_000
INT4_MATRICES = ("ffn_", "output")   # prepare_model's default: the int4 matrices (docstring above)
INT4_ROWS = 16      # _convert_weight_to_int4pack_for_cpu packs rows in blocks of 16
INT4_GROUP = 32     # inputs per int4 scale/offset: the blocks of Q4_0..Q8_0 and Q4_K's sub-blocks
# weights per step of pack/pack4 (_row_chunks): 1 MiB of float32. The 0.5B's int4 matrices (72
# feed-forward + the vocabulary with its int8 rows), 2 threads, 5 interleaved rounds on a busy
# 2-core machine: 4.6 s (cpu 4.2 s) against 9.0 s (cpu 8.7 s) for the whole-matrix code; 4 MiB
# chunks 4.2 s (cpu 4.4 s), the same within the noise.
PACK_CHUNK = 1 << 18


@dataclass(eq=False)
class Int8Weight:
    """Per-output-row int8 weights: w[n, k] ~= q[n, k] * scale[n]."""

    q: torch.Tensor            # (N, K) int8
    scale: torch.Tensor        # (N,) bfloat16, what the kernel multiplies by
    refine_top: int = 0        # > 0 on the vocabulary projection (see the module docstring)
    kernel: bool = True        # aten._weight_int8pack_mm takes it (int8_kernel_fits, decided by pack)

    def nbytes(self) -> int:
        return self.q.numel() + 2 * self.scale.numel()

    def numel(self) -> int:
        return self.q.numel()

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        return self.q.to(dtype) * self.scale.to(dtype)[:, None]


def pack(w, refine_top: int = 0) -> Int8Weight:
    """The int8 form of QWeight w, from its dense float32 matrix (or its blocks when it has none).

    The scale is rounded to bf16 first and q is computed against that rounded scale, so that
    q * scale (what the kernel computes with) is the closest int8 grid to the weights. A width K
    the int8 kernel cannot take is refused for it here, once (int8_kernel_refused)."""
    dense = _dense(w)
    q, scale = int8_rows(dense)
    return Int8Weight(q, scale, refine_top, not int8_kernel_refused(w.name, dense.shape[1]))


def int8_rows(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float32 -> q (N, K) int8, scale (N,) bfloat16: pack's per-row grid."""
    N, K = dense.shape
    q = torch.empty(N, K, dtype=torch.int8)
    scale = torch.empty(N, dtype=torch.bfloat16)
    for r0, r1 in _row_chunks(N, K):
        d = dense[r0:r1]
        sc = (d.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.bfloat16).tiny).to(torch.bfloat16)
        t = d / sc.float()[:, None]
        q[r0:r1] = t.round_().clamp_(-128, 127).to(torch.int8)
        scale[r0:r1] = sc
    return q, scale


@dataclass(eq=False)
class Int4Weight:
    """Groupwise asymmetric int4 weights for torch's CPU int4 kernel: within group j of row n
    (inputs j*group .. (j+1)*group - 1), w[n, k] ~= (q[n, k] - 8) * s[j, n] + z[j, n], q in 0..15
    (the formula of `aten._weight_int4pack_mm_for_cpu`, checked against float64 in
    tests/ops/test_cpu_quant.py)."""

    packed: torch.Tensor       # (N, K/2) uint8, the kernel's own layout (_convert_weight_to_int4pack_for_cpu)
    sz: torch.Tensor           # (K/group, N, 2) bfloat16: s, z
    nib: torch.Tensor          # (N, K/2) uint8, plain order: byte j = q[2j] | q[2j+1] << 4 (for dequantize)
    group: int
    refine: Int8Weight | None = None   # the vocabulary projection: its int8 rows (module docstring)

    @property
    def refine_top(self) -> int:
        return self.refine.refine_top if self.refine is not None else 0

    def numel(self) -> int:
        return 2 * self.nib.numel()

    def nbytes(self) -> int:
        n = self.packed.numel() + self.nib.numel() + 2 * self.sz.numel()
        return n + (self.refine.nbytes() if self.refine is not None else 0)

    def codes(self) -> torch.Tensor:
        """(N, K) uint8 q."""
        return torch.stack((self.nib & 15, self.nib >> 4), dim=-1).reshape(self.nib.shape[0], -1)

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        """(N, K): q * s + (z - 8 s), in float32 in place (prefill reads this once per matmul;
        4x faster than unpacking through stack + broadcasts), then cast."""
        N, half = self.nib.shape
        out = torch.empty(N, half, 2)
        out[..., 0] = self.nib & 15
        out[..., 1] = self.nib >> 4
        s = self.sz[..., 0].float().t().contiguous()[:, :, None]          # (N, K/group, 1)
        z = self.sz[..., 1].float().t().contiguous()[:, :, None]
        w = out.view(N, -1, self.group)
        w.mul_(s).add_(z - 8 * s)
        return out.view(N, 2 * half).to(dtype)


def pack4(w, group: int = INT4_GROUP, refine_top: int = 0) -> Int4Weight:
    """The int4 form of QWeight w: per group, the grid spans the group's [min, max] in 16 steps.
    s and z are rounded to bf16 (what the kernel reads) before q is chosen, so q is the nearest
    point of the grid the kernel computes with (clamped to 0..15 at the ends)."""
    dense = _dense(w)
    N, K = dense.shape
    if not int4_fits(w.shape, group):
        raise ValueError(f"{w.name}: int4 needs inputs in whole groups of {group} and rows in multiples "
                         f"of {INT4_ROWS}, not {N} x {K}")
    s = torch.empty(N, K // group, dtype=torch.bfloat16)
    z = torch.empty(N, K // group, dtype=torch.bfloat16)
    q = torch.empty(N, K, dtype=torch.uint8)
    for r0, r1 in _row_chunks(N, K):
        g = dense[r0:r1].reshape(r1 - r0, K // group, group)
        lo, hi = g.amin(-1), g.amax(-1)
        sc = ((hi - lo) / 15).clamp_min(torch.finfo(torch.bfloat16).tiny).to(torch.bfloat16)
        zc = (lo + 8 * sc.float()).to(torch.bfloat16)
        t = g - zc.float()[..., None]           # in place from here: the same float32 steps, fewer buffers
        q[r0:r1] = t.div_(sc.float()[..., None]).add_(8).round_().clamp_(0, 15).view(r1 - r0, K)
        s[r0:r1], z[r0:r1] = sc, zc
    nib = (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()
    # one call for the whole matrix: the kernel's layout interleaves rows in blocks whose size
    # depends on torch's CPU build (32-row chunks packed alone matched, 16 or 48 did not)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 2)
    sz = torch.stack((s.t(), z.t()), dim=-1).contiguous()
    refine = pack(w, refine_top) if refine_top else None
    return Int4Weight(packed, sz, nib, group, refine)


def _row_chunks(N: int, K: int):
    """Row ranges of about PACK_CHUNK weights: packing a matrix a chunk at a time keeps each
    step's temporaries in the cache instead of several fresh N x K float32 buffers (the
    151936 x 896 vocabulary: 545 MB each). Every value is computed by the same elementwise /
    per-row steps either way, so the bytes do not change."""
    step = max(1, PACK_CHUNK // max(K, 1))
    return [(r0, min(N, r0 + step)) for r0 in range(0, N, step)]


# torch 2.13's aten._weight_int8pack_mm reads past its rows when K is not a multiple of this with
# 4 or more rows: a segmentation fault (measured here: K 24 and 40 at M 4 and 8; K 32 and 48 fine).
# Such matrices (tiny test models; no released model's widths) take the dequantized bf16 matmul.
INT8_KERNEL_K = 16


def int8_kernel_fits(K: int) -> bool:
    """Whether aten._weight_int8pack_mm can take an input width K (INT8_KERNEL_K)."""
    return K % INT8_KERNEL_K == 0


def int8_kernel_refused(name: str, K: int) -> bool:
    """At pack time: whether tensor `name`'s input width K is one the int8 kernel cannot take; if so
    the refusal is recorded once, naming the tensor (paths.fallback, MINFER_DEBUG_PATHS's report),
    and its matmuls take the dequantized bf16 one (linear, cpu_experts.PackedExperts.linear)."""
    if int8_kernel_fits(K):
        return False
    from minfer.ops import paths

    paths.fallback("cpu.int8.decode", f"tensor '{name}' has an input width of {K}, not a multiple of "
                                      f"{INT8_KERNEL_K} (torch's _weight_int8pack_mm reads past its rows there)")
    return True


def int4_fits(shape, group: int = INT4_GROUP) -> bool:
    """Whether an (N, K) matrix has the int4 kernel's shape (its packing takes N in 16s)."""
    return shape[1] % group == 0 and shape[0] % INT4_ROWS == 0


def _dense(w) -> torch.Tensor:
    dense = w.dense if w.dense is not None else w.dequantize_rows(torch.arange(w.shape[0]))
    return dense.float()


def linear(x: torch.Tensor, p, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, K) float32 @ W^T + bias -> (T, N) float32, W the int8 or int4 form p."""
    from minfer.ops import paths

    T = x.shape[0]
    kind = "int4" if isinstance(p, Int4Weight) else "int8"
    if T > DECODE_MAX_M:
        if p.refine_top:      # all-row logits (perplexity): float32, as exact as the int8 rows allow
            paths.count(f"cpu.{kind}.logits_f32")
            rows = p.refine if kind == "int4" else p
            y = F.linear(x.float(), rows.dequantize(torch.float32))
        else:
            paths.count(f"cpu.{kind}.prefill_bf16")
            y = F.linear(x.to(torch.bfloat16), p.dequantize(torch.bfloat16)).float()
    elif kind == "int8" and not p.kernel:       # refused at pack time (int8_kernel_refused)
        paths.count("cpu.int8.unaligned_bf16")
        y = F.linear(x.to(torch.bfloat16), p.dequantize(torch.bfloat16)).float()
        if p.refine_top:
            y = _refine(x.float(), p, y)
    else:
        paths.count(f"cpu.{kind}.decode")
        n = torch.get_num_threads()
        one = n > 1 and p.numel() <= ONE_THREAD_MAX_WEIGHTS
        if one:
            torch.set_num_threads(1)
        try:
            xb = x.to(torch.bfloat16).contiguous()
            if kind == "int4":
                y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, p.packed, p.group, p.sz).float()
            else:
                y = torch.ops.aten._weight_int8pack_mm(xb, p.q, p.scale).float()
        finally:
            if one:
                torch.set_num_threads(n)
        if p.refine_top:
            y = _refine(x.float(), p.refine if kind == "int4" else p, y)
    if bias is not None:
        y = y + bias.float()
    return y


def _refine(x: torch.Tensor, p: Int8Weight, y: torch.Tensor) -> torch.Tensor:
    """Recompute each row's top logits in float32 from the int8 rows: (T, N) float32."""
    k = min(p.refine_top, y.shape[1])
    idx = y.topk(k, dim=1).indices                                   # (T, k)
    rows = p.q[idx].float() * p.scale[idx].float()[..., None]        # (T, k, K)
    exact = torch.bmm(rows, x[:, :, None]).squeeze(2)                # (T, k)
    return y.scatter(1, idx, exact)


def is_int4(p) -> bool:
    """Whether a packed form is int4 (a matrix's Int4Weight, or stacked experts packed in int4)."""
    return isinstance(p, Int4Weight) or getattr(p, "kind", None) == "int4"


def repack_int8(w):
    """The int8 form of an int4-packed QWeight, from its blocks (the calibration's refusal)."""
    if getattr(w, "n_experts", None):
        from minfer.ops.cpu_experts import pack_experts

        return pack_experts(w, int4=False)
    return pack(w, w.packed.refine_top)


def prepare_model(model, int4=INT4_MATRICES, refused: bool = False, step=None) -> int:
    """Pack every matrix of a CPU model that a matmul reads and drop its dense float32 copy (an
    embedding's rows are then decoded from the file's blocks, exactly, as an untied embedding's
    always are). An untied embedding table, only gathered from, is left alone. int4: the prefixes
    of the kinds of matrix that take the int4 form (the kind: the GGUF name's part before
    ".weight", e.g. "ffn_" for ffn_gate/up/down; "output" is the vocabulary projection, tied or
    not; "" every matrix; () int8 everywhere); the others, and matrices of other shapes, take int8.
    refused: the int4 matrices are packed in int8 from the file's blocks instead, the bytes the
    calibration's refusal repacks them to (runtime/cpu_calibration.py, whose cache skips the
    int4 form). step: called once per matrix (a progress bar's update). A stacked expert tensor
    (a QWeight with n_experts, models/qwen3moe.py load_experts) is packed expert by expert from
    its blocks (ops/cpu_experts.py: never a dense copy of the whole tensor), the same rule
    picking int4 or int8.
    Returns the bytes held by the packed forms. The vocabulary projection gets the float32
    refinement of its top logits."""
    output = getattr(model, "output", None)
    embd = getattr(model, "token_embd", None)
    total = 0
    for w in model.qweights():
        if step is not None:
            step()
        if w is embd and w is not output:
            continue
        top = REFINE_TOP if w is output else 0
        kind = "output" if w is output else w.name.split(".")[-2]      # blk.3.ffn_up.weight -> ffn_up
        if getattr(w, "n_experts", None):     # stacked experts: each packed alone, from its blocks
            from minfer.ops.cpu_experts import pack_experts

            w.dense = None
            w.packed = pack_experts(w, int4=any(kind.startswith(f) for f in int4) and not refused)
        elif any(kind.startswith(f) for f in int4) and int4_fits(w.shape):
            if refused:
                w.dense = None          # from the blocks, as the refusal's repack (no dense copy left then)
                w.packed = pack(w, top)
            else:
                w.packed = pack4(w, INT4_GROUP, top)
        else:
            w.packed = pack(w, top)
        w.dense = None
        total += w.packed.nbytes()
    return total
