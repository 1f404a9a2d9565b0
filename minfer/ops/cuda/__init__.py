"""The CUDA backend of minfer.ops: Triton kernels over raw GGUF blocks, plus thin wrappers.

Same functions as the CPU reference (docs/interfaces.md), chosen by minfer.ops on the
device of the input tensor. Weights stay as their raw blocks on the GPU (QWeight.raw,
uint8 (N, row_bytes)); nothing is pre-expanded, so weight memory is the file's tensor bytes.

Paths and switches (all read at call time; MINFER_DEBUG_PATHS=1 prints the counts at exit):
  qmatmul.<type>.decode     GEMV on the raw blocks, M <= MINFER_GEMV_MAX_M (32); MINFER_GEMV=0 off
  qmatmul.<type>.prefill    dequantize into a reused scratch + cuBLAS (MINFER_SCRATCH_MB caps it)
  qmatmul.<type>.cublas_direct  float weights already in the activation dtype
  qmatmul.group<n>.prefill  linear_many: n weights in one scratch, one GEMM; MINFER_FUSE_GROUPS=0 off
                            (MINFER_GROUP_GEMM=one|split|auto: one GEMM + column views, or one per slice)
  prefetch.hit / .miss      next group dequantized on a side stream during this GEMM; MINFER_PREFETCH=0 off
  embedding.<type>          decode of the requested rows only
  rms_norm.triton (MINFER_TRITON_NORM=0 -> torch), rope.triton, swiglu.triton
  add_rms_norm.triton       residual add + RMSNorm + cast in one kernel; MINFER_FUSED_ADD_NORM=0 off
  attention.prefill.cudnn.<gqa>  SDPA's cuDNN kernel from position 0 (MINFER_CUDNN_GQA=copy|native|repeat);
                            MINFER_PREFILL_ATTN=flash -> attention.prefill.flash (FA2, GQA unexpanded)
  attention.prefill.masked  after a cached prefix: the memory-efficient kernel, offset causal mask
  attention.decode.triton   (MINFER_DECODE_ATTN=0 -> SDPA)
"""

from __future__ import annotations

from minfer.ops.cuda.attention import attention, decode_attention
from minfer.ops.cuda.embedding import embedding
from minfer.ops.cuda.norm_rope_act import add_rms_norm, rms_norm, rope, swiglu
from minfer.ops.cuda.qmatmul import linear, linear_many, planned_scratch_bytes, scratch_bytes

__all__ = ["linear", "linear_many", "embedding", "rms_norm", "add_rms_norm", "rope", "swiglu", "attention", "decode_attention",
           "prepare_weight", "memory_report", "planned_scratch_bytes", "scratch_bytes"]


def prepare_weight(w) -> None:
    """Called once per QWeight after its raw blocks reached the GPU.

    Checks that the type has kernels (a clear MinferError naming the tensor otherwise) and
    that the raw bytes have the expected (N, row_bytes) layout; adds no planes (w.extra stays
    empty, so the weight costs exactly its file bytes). Records the size for the scratch plan.
    """
    from minfer.errors import MinferError
    from minfer.ops.cuda import dequant, qmatmul

    qmatmul.check_supported(w)
    n, k = w.shape
    _, qk, ts = dequant.LAYOUT[w.qtype]
    if k % qk:
        raise MinferError(f"tensor '{w.name}': {k} columns is not a multiple of the "
                          f"{dequant.type_name(w.qtype)} block size {qk}")
    want = (n, k // qk * ts)
    if tuple(w.raw.shape) != want or w.raw.stride(-1) != 1:
        raise MinferError(f"tensor '{w.name}': raw blocks have shape {tuple(w.raw.shape)}, expected {want} "
                          f"(rows of {dequant.type_name(w.qtype)} blocks, contiguous)")
    if w.raw.data_ptr() % 16:
        # the kernels read f16 scales through 2-byte pointers and want 16-byte row starts
        w.raw = w.raw.clone()
    qmatmul.note_weight(n * k, w.name)


def memory_report(weights) -> str:
    """One line for the load message: weight bytes on the GPU and the planned prefill scratch."""
    wb = sum(w.nbytes() for w in weights)
    from minfer.ops.cuda import qmatmul

    return f"weights {wb / 2**30:.2f} GiB on the GPU (raw GGUF blocks), {qmatmul.scratch_plan()}"
