"""The CUDA backend of minfer.ops: Triton kernels over raw GGUF blocks, plus thin wrappers.

Same functions as the CPU reference (docs/interfaces.md), chosen by minfer.ops on the
device of the input tensor. Weights stay as their raw blocks on the GPU (QWeight.raw,
uint8 (N, row_bytes)); nothing is pre-expanded, so weight memory is the file's tensor bytes.
Fast paths read their off-switches from the ops context (minfer.ops.context.Context: the
engine's Switches) and their buffers from the engine's Workspace (workspace.py); the table of
switches is `minfer switches` (generated from minfer/switches.py).

Launch paths (MINFER_DEBUG_PATHS=1 prints the counts at exit):
  qmatmul.<type>.decode          GEMV on the raw blocks, M <= gemv_max_m        (gemv)
  qmatmul.<type>.decode.one_pass the same for one row with K <= 1024: one K tile, no split-K reduce launch
  qmatmul.group<n>.decode.raw[.one_pass]  a decode group left in raw blocks (q/k/v, gate/up: Q5_0 / Q8_0 ...)
                                 as one GEMV over its rows stacked at load (gemv.fuse_raw_group)
  qmatmul.<type>.decode.repacked GEMV on the Q4_K/Q6_K planes made at load     (gemv_repack; gemv_repack.py)
  qmatmul.<type>.decode.q8       one row with its int8 form: dp4a GEMV on the planes (gemv_q8; gemv_q8.py)
  qmatmul.group<n>.decode.q8 / .repacked  a decode group (q/k/v, gate/up) as one GEMV over shared planes
  gemv_q8.gluon / gemv_q8.triton  which kernel a q8 GEMV launch took (gemv_q8_gluon.py: the shapes of its table)
  gemv_q8.l2_prefetch            a q8 GEMV launch that fetches later weights into L2 (l2_prefetch.py, off)
  qmatmul.<type>.qgemm           batched decode rows, GEMM on the planes       (qgemm_repack, default off; qgemm_repack.py)
  qmatmul.group<n>.qgemm         the same over a declared group's planes (q/k/v, gate/up): one launch
  qmatmul.<type>.prefill         dequantize into a scratch + cuBLAS
  qmatmul.<type>.cublas_direct   float weights already in the activation dtype
  qmatmul.group<n>.prefill       a declared group (q/k/v): one scratch, one GEMM (fuse_groups)
  prefetch.hit / .miss           next group dequantized on the side stream      (prefetch)
  embedding.<type>               decode of the requested rows only
  rms_norm.triton, rope.triton, swiglu.triton
  layer_norm.triton              LayerNorm without bias (command-r, cohere2; layer_norm.py)
  rope_kv.triton                 rope(q), rope(k) and the KV cache append in one kernel (fused_rope_kv)
  qmatmul.qkv_rope               one decode row's q/k/v GEMV that also rotates q and k and writes the KV
                                 row (qkv_rope; gemv_q8_gluon_rope.py): gemv_q8.rope, or its fallback
                                 (the GEMV, then rope_kv)
  add_rms_norm.triton            residual add + RMSNorm + cast in one kernel    (fused_add_norm)
  add_rms_norm.q8, swiglu.q8     one decode row: the same kernel also writes the row's int8 form (gemv_q8)
  add_rms_norm.into_gemv         that row left to the q/k/v GEMV (norm_into_gemv): gemv_q8.norm_prologue
  add_rms_norm.into_raw_gemv     that row (s and h) left to the raw group GEMV that reads it (gemv_raw_norm,
                                 off): gemv.raw_norm, its programs make h, program 0 stores s and h
  qmatmul.residual_norm          the residual add and its sums of squares in the down GEMV's epilogue
                                 (gemv_q8.residual_sumsq; norm_into_gemv = 2), the norm left to q/k/v
  gemv_q8.norm_tail              norm_into_gemv = 3: that GEMV's last row tile also makes the normed row
                                 and its q8 form (gemv_q8g_norm._norm_tail), no norm launch
  gemv_q8.residual_q8            norm_into_gemv = 4: the residual GEMV's tiles (down before q/k/v, o
                                 before gate/up) also make the q8 row of s * weight, rstd left out;
                                 gemv_q8.norm_scale: the next GEMV scales its row sums by rstd
  attention.prefill.cudnn        SDPA's cuDNN kernel from position 0, length bucketed (cudnn_attention)
  attention.prefill.flash        SDPA's FA2 kernel (cudnn off, or refused)
  attention.prefill.masked       after a cached prefix: the memory-efficient kernel, offset causal mask
  attention.decode.triton        split-K decode attention                        (decode_attention)
  attention.decode.rope          the same with rope(q), rope(k) and the KV append in it: no rope_kv
                                 launch (decode_attn_rope; .window / .softcap variants)
  attention.window.decode        the same kernel over the last `window` keys (gemma3 local layers)
  attention.window.masked        T > 1 on a sliding-window layer: the masked kernel, window in the mask
  attention.softcap[.window].decode  the decode kernel with gemma2's score soft-cap (its CAP variant)
  attention.softcap.torch        T > 1 with soft-capped scores: torch float32, query rows in chunks
                                 (no fused SDPA kernel takes a score soft-cap)
  attention.sinks.torch          T > 1 with attention sinks (gpt-oss): torch float32, query rows in chunks;
                                 one row takes the decode kernel's SINK variant (attention.decode.triton,
                                 attention.window.decode)
  geglu.triton                   gelu_tanh(gate) * up (gemma3)
  moe.gather / moe.grouped       MoE experts: row-gather decode / grouped GEMM (ops/cuda/moe.py)
  moe.gather.q8                  MoE decode: the int8 GEMV over the selected experts' repacked rows
  ssm.step.triton                the Mamba-2 mixer's decode rows: the causal conv ring + conv + SiLU and the
                                 selective state update of every head in one launch, the state rings in
                                 place (ssm_step.py; models/mamba2.py); prefill rows: ssm.conv.torch,
                                 ssm.scan.torch (torch ops)
  ssm.norm.triton                the Mamba-2 gate and group RMSNorm, every row (ssm_step.py ssm_gate_norm)
  ssm1.conv.triton               the Mamba-1 mixer's decode rows: the conv ring + conv + SiLU (ssm1_step.py;
                                 models/mamba1.py, jamba); prefill rows: ssm1.conv.torch, ssm1.scan.torch
  ssm1.scan.triton               the Mamba-1 decode rows' state update: dt's softplus, B/C's norms, the
                                 state rings in place, D and the z gate in one launch (ssm1_step.py)
  deltanet.step.triton           the gated DeltaNet mixer's decode rows (qwen35, qwen35moe, qwen3next): the
                                 conv ring + conv + SiLU, the q/k L2 norms, beta and the decay, the delta
                                 rule of every value head (state rings in place) and the gated RMSNorm in one
                                 launch (deltanet_step.py; models/deltanet.py); prefill rows:
                                 deltanet.conv.torch, deltanet.scan.torch (torch ops)
  deltanet.norm.triton           that gated RMSNorm as its own launch (deltanet_step's block_v < Dv)
  moe.act.triton                 the experts' activation with per-expert gate/up biases, silu or the
                                 clamped swiglu_oai (gpt-oss; ops/cuda/moe_act.py)
"""

from __future__ import annotations

from minfer.ops.cuda.attention import attention, decode_attention
from minfer.ops.cuda.decode_attn_rope import rope_attention
from minfer.ops.cuda.deltanet_step import deltanet_step
from minfer.ops.cuda.embedding import embedding
from minfer.ops.cuda.layer_norm import layer_norm
from minfer.ops.cuda.moe import moe_ffn
from minfer.ops.cuda.norm_rope_act import add_rms_norm, geglu, rms_norm, rms_norm_cast, rope, rope_kv_write, swiglu
from minfer.ops.cuda.qmatmul import linear, linear_add_rms_norm, linear_many, linear_qkv_rope, linear_swiglu
from minfer.ops.cuda.ssm1_step import ssm1_conv_step, ssm1_scan_step
from minfer.ops.cuda.ssm_step import ssm_gate_norm, ssm_step
from minfer.ops.cuda.workspace import Workspace

__all__ = ["linear", "linear_many", "linear_qkv_rope", "linear_swiglu", "linear_add_rms_norm", "embedding", "rms_norm", "rms_norm_cast", "add_rms_norm", "layer_norm", "rope", "rope_kv_write", "swiglu", "geglu", "moe_ffn",
           "attention",
           "decode_attention", "rope_attention", "deltanet_step", "ssm_step", "ssm_gate_norm", "ssm1_conv_step", "ssm1_scan_step", "prepare_weight", "memory_report", "Workspace"]


def prepare_weight(w) -> None:
    """Called once per QWeight after its raw blocks reached the GPU.

    Checks that the type has kernels (a clear MinferError naming the tensor otherwise) and
    that the raw bytes have the expected (N, row_bytes) layout; adds nothing, so the weight
    costs exactly its file bytes.
    """
    from minfer.errors import MinferError
    from minfer.ops.cuda import dequant, qmatmul

    qmatmul.check_supported(w)
    n, k = w.shape
    _, qk, ts = dequant.LAYOUT[w.qtype]
    if w.qtype in dequant.FLOAT_TYPES:
        # float rows are read in runs of 16 values with the last run masked per value (gemv.py,
        # dequant.py), so any width is taken: a row is k values
        want = (n, k * (ts // qk))
    elif k % qk:
        raise MinferError(f"tensor '{w.name}': {k} columns is not a multiple of the "
                          f"{dequant.type_name(w.qtype)} block size {qk}")
    else:
        want = (n, k // qk * ts)
    if tuple(w.raw.shape) != want or w.raw.stride(-1) != 1:
        raise MinferError(f"tensor '{w.name}': raw blocks have shape {tuple(w.raw.shape)}, expected {want} "
                          f"(rows of {dequant.type_name(w.qtype)} blocks, contiguous)")
    if w.raw.data_ptr() % 16:
        # the kernels read f16 scales through 2-byte pointers and want 16-byte row starts
        w.raw = w.raw.clone()


def memory_report(weights, workspace: Workspace, switches, dtype) -> str:
    """One line for the load message: weight bytes on the GPU and the planned prefill scratch."""
    from minfer.ops.cuda.gemv_repack import planes_of

    rp = sum(planes_of(w).nbytes() for w in weights if planes_of(w) is not None)
    wb = sum(w.nbytes() for w in weights) + rp            # QWeight.nbytes sees the raw blocks only
    how = f"Q4_K/Q6_K repacked for the decode GEMV: {rp / 2**30:.2f} GiB of planes" if rp else "raw GGUF blocks"
    return f"weights {wb / 2**30:.2f} GiB on the GPU ({how}), {workspace.plan_text(dtype, switches)}"
