"""The MoE experts' activation with per-expert biases, one Triton launch (ops/cuda/moe.py):

    a[r] = act(g[r] + gate_bias[e_r], u[r] + up_bias[e_r])       e_r = expert of row r (device ids)

act 0 "silu": silu(g) * u; act 1 "swiglu_oai" (gpt-oss): g' = min(g, limit),
u' = clamp(u, -limit, limit), a = g' sigmoid(alpha g') (u' + 1) (llama.cpp
ggml_compute_forward_swiglu_oai_f32; HF GptOssExperts); act 2 "geglu" (gemma4's experts):
gelu_tanh(g) * u, gelu_tanh(a) = 0.5 a (1 + tanh(c)) = a sigmoid(2c), c = sqrt(2/pi) (a + 0.044715 a^3)
(ggml_gelu's tanh form, HF gelu_pytorch_tanh; llama.cpp build_moe_ffn LLM_FFN_GELU with a gate); act 3
"relu2" (nemotron_h_moe's ungated experts): relu(u)^2, g not read (build_moe_ffn LLM_FFN_RELU_SQR without a
gate: ggml_relu, ggml_sqr; HF NemotronHExperts with ACT2FN["relu2"]). Arithmetic in float32, stored in the
output dtype. The expert ids stay on the device (no host value: CUDA-graph capturable). The
reference is minfer.ops.reference.moe_act.                                      path moe.act.triton
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minfer.ops import paths

ACTS = {"silu": 0, "swiglu_oai": 1, "geglu": 2, "relu2": 3, "reglu": 4}   # 4: relu(g) * u (smallthinker)


@triton.jit
def _moe_act_kernel(g, u, rows_e, gb, ub, out, n, F, sg, su, alpha, limit,
                    HAS_GB: tl.constexpr, HAS_UB: tl.constexpr, ACT: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    r = o // F
    c = o - r * F
    if ACT == 3:                   # ungated: the gate is not read (g may be u)
        a = tl.zeros([BLOCK], dtype=tl.float32)
    else:
        a = tl.load(g + r * sg + c, mask=m, other=0.0).to(tl.float32)
    b = tl.load(u + r * su + c, mask=m, other=0.0).to(tl.float32)
    if HAS_GB or HAS_UB:
        e = tl.load(rows_e + r, mask=m, other=0).to(tl.int64)
        if HAS_GB:
            a += tl.load(gb + e * F + c, mask=m, other=0.0).to(tl.float32)
        if HAS_UB:
            b += tl.load(ub + e * F + c, mask=m, other=0.0).to(tl.float32)
    if ACT == 1:
        a = tl.minimum(a, limit)
        b = tl.minimum(tl.maximum(b, -limit), limit)
        y = a / (1.0 + tl.exp(-alpha * a)) * (b + 1.0)
    elif ACT == 2:
        c = 0.7978845608028654 * (a + 0.044715 * a * a * a)
        y = a / (1.0 + tl.exp(-2.0 * c)) * b
    elif ACT == 3:
        b = tl.maximum(b, 0.0)
        y = b * b
    elif ACT == 4:
        y = tl.maximum(a, 0.0) * b
    else:
        y = a / (1.0 + tl.exp(-a)) * b
    tl.store(out + o, y.to(out.dtype.element_ty), mask=m)


def moe_act(g: torch.Tensor, u: torch.Tensor, rows_e: torch.Tensor, gate_bias=None, up_bias=None,
            act: str = "silu", alpha: float = 1.702, limit: float = 7.0, out_dtype=None) -> torch.Tensor:
    """g, u (R, F) (row stride free, unit column stride), rows_e (R,) int64 expert of each row,
    biases (E, F) or None -> (R, F) in out_dtype (None: g's dtype). act "relu2": g None (ungated;
    u stands in for it), no gate bias."""
    if act not in ACTS:
        raise ValueError(f"moe_ffn: act {act!r} is not one of {tuple(ACTS)}")
    if act == "relu2":
        if gate_bias is not None:
            raise ValueError("moe_ffn: act 'relu2' (ungated experts) takes no gate_bias")
        g = u if g is None else g
    if g.stride(-1) != 1 or u.stride(-1) != 1:
        g, u = g.contiguous(), u.contiguous()
    R, F = g.shape
    out = torch.empty((R, F), dtype=out_dtype or g.dtype, device=g.device)
    gb = gate_bias.float().contiguous() if gate_bias is not None else g
    ub = up_bias.float().contiguous() if up_bias is not None else g
    paths.count("moe.act.triton")
    n = R * F
    block = 1024
    _moe_act_kernel[(triton.cdiv(n, block),)](g, u, rows_e.contiguous(), gb, ub, out, n, F, g.stride(0), u.stride(0),
                                              float(alpha), float(limit), HAS_GB=gate_bias is not None,
                                              HAS_UB=up_bias is not None, ACT=ACTS[act], BLOCK=block, num_warps=4)
    return out
