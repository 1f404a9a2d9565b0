"""Gemma 4's MoE feed-forward (the 26B-A4B form), the CPU float32 reference only.

Each MoE layer runs the dense MLP and the experts side by side on the attention's residual r
(llama.cpp src/models/gemma4.cpp, the is_moe_layer branch; HF Gemma4TextDecoderLayer, Gemma4TextRouter):

    mlp = RMSNorm(W_down(gelu_tanh(W_gate n'(r)) * W_up n'(r)); post_ffw_norm_1)      n' = ffn_norm
    l   = W_router (rms(r) / sqrt(D) * router_scale)          ffn_gate_inp.weight (E, D), ffn_gate_inp.scale (D,)
    p   = softmax(l); the k = expert_used_count largest, divided by their sum, times s_e
                                                              s = ffn_down_exps.scale (E,)
    moe = RMSNorm(sum_k p_k W_down_e(gelu_tanh(W_gate_e h2) * W_up_e h2); post_ffw_norm_2)   h2 = RMSNorm(r; pre_ffw_norm_2)
    then (mlp + moe) goes through post_ffw_norm and the residual as the dense MLP's output does.

Experts: ffn_gate_up_exps (E, 2 Fe, D), gate rows first (HF gate_up_proj .chunk(2)), or ffn_gate_exps and
ffn_up_exps (E, Fe, D) apart; ffn_down_exps (E, D, Fe). The routing's order (softmax, top-k, the sum
clamped to 2^-14 as ops.reference.route, then the per-expert scale) is build_moe_ffn's.

ops.moe_ffn has no GELU experts and no router input apart from the experts', so there is no CUDA
path: a CUDA load is refused by name (Gemma4Model.from_gguf).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from minfer import ops
from minfer.errors import MinferError
from minfer.models.qwen3moe import load_experts
from minfer.ops import reference
from minfer.weights import QWeight, load_qweight, load_vector

NORM_SUM_MIN = 6.103515625e-5     # ops.reference.route's clamp of the weights' sum (llama.cpp build_moe_ffn)


@dataclass
class Gemma4Moe:
    router: QWeight                  # (E, D)
    router_scale: torch.Tensor       # (D,)
    gate_exps: QWeight | None        # (E*Fe, D) apart, or None with gate_up_exps
    up_exps: QWeight | None
    gate_up_exps: QWeight | None     # (E*2Fe, D): expert e's gate rows, then its up rows
    down_exps: QWeight               # (E*D, Fe)
    down_scale: torch.Tensor         # (E,)
    pre_norm_2: torch.Tensor         # (D,)
    post_norm_1: torch.Tensor        # (D,)
    post_norm_2: torch.Tensor        # (D,)

    def matrices(self) -> list[QWeight]:
        return [w for w in (self.router, self.gate_exps, self.up_exps, self.gate_up_exps, self.down_exps)
                if w is not None]


def load_moe(gf, cfg, i: int, device, dtype) -> Gemma4Moe | None:
    """Layer i's MoE weights, None for a dense layer (no blk.i.ffn_gate_inp.weight)."""
    p = f"blk.{i}."
    if p + "ffn_gate_inp.weight" not in gf.tensors:
        return None
    E, k, Fe, D = cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn, cfg.d_model
    for key, v in (("expert_count", E), ("expert_used_count", k), ("expert_feed_forward_length", Fe)):
        if not v:
            raise MinferError(f"{gf.path}: metadata key '{cfg.arch}.{key}' is missing (needed by the MoE layer "
                              f"{p}ffn_gate_inp.weight)")
    if k > E:
        raise MinferError(f"{gf.path}: {cfg.arch}.expert_used_count={k} exceeds expert_count={E}")
    fused = p + "ffn_gate_up_exps.weight" in gf.tensors
    if not fused and p + "ffn_gate_exps.weight" not in gf.tensors:
        raise MinferError(f"{gf.path}: tensor '{p}ffn_gate_up_exps.weight' is missing (or '{p}ffn_gate_exps.weight' "
                          f"and '{p}ffn_up_exps.weight' apart): the experts of the MoE layer {i}")
    return Gemma4Moe(
        router=load_qweight(gf, p + "ffn_gate_inp.weight", device, (E, D), dtype=dtype),
        router_scale=load_vector(gf, p + "ffn_gate_inp.scale", device, D),
        gate_exps=None if fused else load_experts(gf, p + "ffn_gate_exps.weight", device, (E, Fe, D), dtype),
        up_exps=None if fused else load_experts(gf, p + "ffn_up_exps.weight", device, (E, Fe, D), dtype),
        gate_up_exps=load_experts(gf, p + "ffn_gate_up_exps.weight", device, (E, 2 * Fe, D), dtype) if fused else None,
        down_exps=load_experts(gf, p + "ffn_down_exps.weight", device, (E, D, Fe), dtype),
        # required here (llama.cpp takes it as optional; the converter writes HF's per_expert_scale into it,
        # except for NVFP4 files, which fold it into the weights and which minfer does not read)
        down_scale=load_vector(gf, p + "ffn_down_exps.scale", device, E),
        pre_norm_2=load_vector(gf, p + "pre_ffw_norm_2.weight", device, D),
        post_norm_1=load_vector(gf, p + "post_ffw_norm_1.weight", device, D),
        post_norm_2=load_vector(gf, p + "post_ffw_norm_2.weight", device, D),
    )


def expert_act(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up (llama.cpp LLM_FFN_GELU with LLM_FFN_PAR; HF gelu_pytorch_tanh)."""
    return reference.geglu(gate, up)


def route(r: torch.Tensor, moe: Gemma4Moe, k: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights (T, k) float32 and expert ids (T, k) of the residual r (T, D)."""
    D = r.shape[1]
    ones = torch.ones(D, dtype=torch.float32, device=r.device)
    z = ops.rms_norm(r.float(), ones, eps) * (moe.router_scale.float() / math.sqrt(D))
    logits = ops.linear(z, moe.router, None).float()                             # (T, E)
    p = torch.softmax(logits, dim=-1)
    w, idx = torch.topk(p, k, dim=-1)
    w = w / w.sum(-1, keepdim=True).clamp_min(NORM_SUM_MIN)
    return w * moe.down_scale.float()[idx], idx


def moe_branch(r: torch.Tensor, moe: Gemma4Moe, k: int, Fe: int, eps: float) -> torch.Tensor:
    """The experts' normed output (T, D) float32 for the residual r (T, D) float32."""
    T, D = r.shape
    w, idx = route(r, moe, k, eps)
    h2 = ops.rms_norm(r, moe.pre_norm_2, eps)
    out = torch.zeros(T, D, dtype=torch.float32, device=r.device)
    for e in idx.unique().tolist():
        tok, slot = (idx == e).nonzero(as_tuple=True)
        x = h2[tok]
        if moe.gate_up_exps is not None:
            gu = reference._expert_mm(moe.gate_up_exps, e, 2 * Fe, x)
            gate, up = gu[:, :Fe], gu[:, Fe:]
        else:
            gate = reference._expert_mm(moe.gate_exps, e, Fe, x)
            up = reference._expert_mm(moe.up_exps, e, Fe, x)
        y = reference._expert_mm(moe.down_exps, e, D, expert_act(gate, up)).float()
        out.index_add_(0, tok, y * w[tok, slot, None])
    return ops.rms_norm(out, moe.post_norm_2, eps)
