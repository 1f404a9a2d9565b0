"""Gemma 4's MoE feed-forward (the 26B-A4B form), on both backends through ops.moe_ffn.

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

ops.moe_ffn takes it with gemma4's options: act "geglu", router_in (the router's input above, which
differs from the experts' h2), down_scale (s), and the fused gate_up tensor passed as gate_exps with
up_exps None. The router is kept as a float32 (E, D) matrix (qwen3moe's gate_inp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from minfer import ops
from minfer.errors import MinferError
from minfer.models.qwen3moe import load_experts
from minfer.weights import QWeight, load_vector

@dataclass
class Gemma4Moe:
    router: torch.Tensor             # (E, D) float32
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
        return [w for w in (self.gate_exps, self.up_exps, self.gate_up_exps, self.down_exps) if w is not None]


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
        router=load_vector(gf, p + "ffn_gate_inp.weight", device, E * D).view(E, D),
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


EXPERT_ACT = "geglu"     # gelu_tanh(gate) * up (llama.cpp LLM_FFN_GELU with a gate; HF gelu_pytorch_tanh)


def router_input(r: torch.Tensor, moe: Gemma4Moe, eps: float) -> torch.Tensor:
    """The router's input (T, D) float32: rms(r) / sqrt(D) * router_scale (gemma4.cpp: ggml_rms_norm of
    attn_out, ggml_scale by 1/sqrt(n_embd), ggml_mul by ffn_gate_inp_s)."""
    D = r.shape[1]
    ones = torch.ones(D, dtype=torch.float32, device=r.device)
    return ops.rms_norm(r.float(), ones, eps) * (moe.router_scale.float() / math.sqrt(D))


def moe_branch(r: torch.Tensor, moe: Gemma4Moe, k: int, Fe: int, eps: float, ctx=None,
               act: torch.dtype | None = None) -> torch.Tensor:
    """The experts' normed output (T, D) float32 for the residual r (T, D) float32: ops.moe_ffn on the
    experts' input h2 (in act, the model's matmul dtype, when given) with the router reading
    router_input(r), then post_ffw_norm_2. Fe is the expert width (the weights carry it)."""
    h2 = ops.rms_norm(r, moe.pre_norm_2, eps)
    if act is not None:
        h2 = h2.to(act)
    fused = moe.gate_up_exps is not None
    out = ops.moe_ffn(h2, moe.router, moe.gate_up_exps if fused else moe.gate_exps, None if fused else moe.up_exps,
                      moe.down_exps, k, True, ctx, act=EXPERT_ACT, router_in=router_input(r, moe, eps),
                      down_scale=moe.down_scale)
    return ops.rms_norm(out.float(), moe.post_norm_2, eps)
