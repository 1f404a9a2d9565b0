"""GroveMoE (inclusionAI GroveMoE-Inst / GroveMoE-Base; HF GroveMoeForCausalLM, remote code): the GGUF arch `grovemoe`.

    x_0 = E[tokens]                                         token_embd (V, D); output, or the embedding when absent
    for each layer l:
        x = x + W_o attn(rope(qn(W_q n(x))), rope(kn(W_k n(x))), W_v n(x))    Qwen3-MoE's attention (qwen3moe.py)
        h = n'(x);  l = W_r h (E,);  p = softmax(l)         n' = RMSNorm(ffn_norm); ffn_gate_inp (E, D)
        top = the K largest l;  w = p[top] / max(sum, 2^-14)                   K = expert_used_count
        m = sum_k w_k W_down[top_k](silu(W_gate[top_k] h) * W_up[top_k] h)     ffn_{gate,up,down}_exps
        c_k = top_k // G;  a = p[c_k] / max(sum_k p[c_k], 2^-14)              G = experts_per_group
        adj = sum_k a_k C_down[c_k](silu(C_gate[c_k] m) * C_up[c_k] m)        ffn_{gate,up,down}_chexps, E / G of them
        x = x + m + s * adj                                 s = expert_group_scale
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/grovemoe.cpp: load_arch_hparams, load_arch_tensors, the graph; its
build_moe_ffn in src/llama-graph.cpp; conversion/grovemoe.py GroveMoeModel):
- Attention: Qwen3-MoE's (q/k/v without biases, per-head RMSNorms attn_q_norm / attn_k_norm before rope, NEOX rope
  over the whole head: llama_model_rope_type LLM_ARCH_GROVEMOE -> NEOX, and the graph asserts n_rot == head size).
  A fused attn_qkv or attention biases (create_tensor_qkv would take them; the converter writes none: the release has
  attention_bias false) are refused by name, as is the release's mlp.expert_bias (the converter drops it).
- Routed experts: build_moe_ffn(..., norm_w = true, expert_weights_scale, SOFTMAX, probs = W_r h): p = softmax(l)
  over all E experts; build_moe_ffn chooses for GROVEMOE on sigmoid(l) (the same order as p; ops.moe_ffn chooses on
  p); w = p[top] renormalized with the sum clamped at 2^-14. The loader reads neither expert_weights_norm (always
  normalized here) nor expert_weights_scale (hparams keeps 0: none; a file's other value is refused, as smallthinker).
- Adjugate ("chunk") experts: E / G of them (G = experts_per_group, required; the converter writes 2), width
  expert_chunk_feed_forward_length (optional: the head size when absent; the converter writes head_dim). A second
  build_moe_ffn on the same router logits with n_expert = E / G and n_expert_used = min(K, E / G):
  * its input is m, the routed experts' output (grovemoe.cpp: `cur = moe_out` before the call), not h;
  * the choice: the same top of the E experts, each slot's id replaced by id / G truncated (the GROVEMOE branch of
    build_moe_ffn: ggml_cast(ggml_scale(sel, 1 / G), I32));
  * its weights: get_rows(probs, chunk ids) on the E-expert softmax, i.e. p of EXPERT NUMBER c_k (not of the slot's
    routed expert), renormalized over the K slots (norm_w = true, the same clamp); two slots of one group give their
    chunk expert twice;
  * its output scaled by expert_group_scale (required; the converter writes 0.05) and added to m.
  modeling_grove_moe.py (and mlx-lm's port) differs: its chunk experts read h and are weighted by the routed w_k;
  this follows llama.cpp, whose logits the fixture checks (tools/gen_grovemoe_fixture.py measures the difference).
- Refused: experts_per_group that does not divide expert_count (the chunk ids would pass the last chunk expert),
  expert_used_count > expert_count / experts_per_group (build_moe_ffn then sums expert_used_count slots of a
  min(K, E / G)-slot result), expert_group_count > 1 (group-limited routing: the chunk call's group reshape is
  inconsistent), a missing chunk tensor or key (by name).
How it runs: the routed experts and the chunk experts are two ops.moe_ffn calls (CPU: reference.moe_ffn; CUDA:
ops/cuda/moe.py, whichever of its moe.gather / moe.gather.q8 / moe.grouped paths the shapes take). The chunk
call's routing is computed here in torch ops with no host value (CUDA-graph safe): the choice from reference.route
(the call a pinned test can steer), the weights a above summed per chunk expert (S_c), then handed to ops.moe_ffn as
router_in = log S_c (a large negative number for unchosen chunks) with an identity router and gating
"topk_softmax", which returns S_c / sum S; the output is then multiplied by sum S (1 unless the clamp acted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.layers import refuse_expert_weights_scale
from minfer.models.qwen3moe import MoeBlock, Qwen3MoeModel, load_experts
from minfer.ops import reference
from minfer.weights import QWeight

CLAMP = 6.103515625e-5    # build_moe_ffn: the weight sum clamped to the smallest f16 normal
UNCHOSEN = -1e30          # router_in of a chunk expert no slot chose: exp() of it is 0, and 0 * it is finite
# tensors llama.cpp's grovemoe loader does not create (or the converter never writes): refused by name
_REFUSED = ("attn_qkv.weight", "attn_qkv.bias", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
            "exp_probs_b.bias")


@dataclass
class GroveMoeBlock(MoeBlock):
    """qwen3moe's MoE weights plus the layer's stacked chunk (adjugate) experts."""

    gate_chexps: QWeight | None = None     # (Ec*Fc, D)
    up_chexps: QWeight | None = None       # (Ec*Fc, D)
    down_chexps: QWeight | None = None     # (Ec*D, Fc)

    def matrices(self) -> list[QWeight]:
        return super().matrices() + [self.gate_chexps, self.up_chexps, self.down_chexps]


def _key(gf, arch: str, suffix: str, required: bool = True):
    key = f"{arch}.{suffix}"
    if key not in gf.metadata:
        if required:
            raise MinferError(f"{gf.path}: metadata key '{key}' is missing (needed to build the {arch} model)")
        return None
    return gf.metadata[key]


def _positive_int(gf, arch: str, suffix: str, v) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise MinferError(f"{gf.path}: metadata key '{arch}.{suffix}' is {v!r}: expected a positive integer")
    return v


class GroveMoeModel(Qwen3MoeModel):
    """Qwen3-MoE's loader and forward; the FFN adds the adjugate experts' branch."""

    arch = "grovemoe"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_GROVEMOE -> NEOX
    qk_norm = True            # load_arch_tensors: attn_q_norm / attn_k_norm with flag 0
    weights_norm = True       # grovemoe.cpp: build_moe_ffn(..., LLM_FFN_SILU, true, ...) for both calls
    # load_arch_hparams: expert_feed_forward_length (get_key_or_arr), expert_group_scale and experts_per_group
    # (get_key: required); expert_count / expert_used_count asserted > 0 by load_arch_tensors
    expert_keys = ("expert_count", "expert_used_count", "expert_feed_forward_length", "expert_group_scale",
                   "experts_per_group")

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "GroveMoeModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        a = cls.arch
        for key in cls.expert_keys:
            _key(gf, a, key)
        refuse_expert_weights_scale(gf, a)
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {a}.rope.dimension_count={cfg.rope.n_rot}, expected the head size "
                              f"{cfg.head_dim} (grovemoe.cpp asserts n_rot == head size)")
        if cfg.expert_groups > 1:
            raise MinferError(f"{gf.path}: {a}.expert_group_count={cfg.expert_groups} is not supported (llama.cpp's "
                              "grovemoe graph has no group-limited routing for its chunk experts)")
        E, K = cfg.n_experts, cfg.n_experts_used
        G = _positive_int(gf, a, "experts_per_group", _key(gf, a, "experts_per_group"))
        if E % G:
            raise MinferError(f"{gf.path}: {a}.experts_per_group={G} does not divide {a}.expert_count={E}")
        Ec = E // G
        if K > Ec:
            raise MinferError(f"{gf.path}: {a}.expert_used_count={K} > expert_count / experts_per_group = {Ec}: not "
                              "supported (llama.cpp's chunk-expert call would sum more slots than it chose)")
        fc = _key(gf, a, "expert_chunk_feed_forward_length", required=False)
        Fc = cfg.head_dim if fc is None or fc == 0 else _positive_int(gf, a, "expert_chunk_feed_forward_length", fc)
        scale = _key(gf, a, "expert_group_scale")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise MinferError(f"{gf.path}: metadata key '{a}.expert_group_scale' is {scale!r}: expected a finite number")
        for i in range(cfg.n_layers):
            for name in _REFUSED:
                if f"blk.{i}.{name}" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{name}' is not supported for {a} (llama.cpp's "
                                      "grovemoe loader takes attn_q/attn_k/attn_v without biases and no expert bias)")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        D = cfg.d_model
        for i, e in enumerate(m.moe):
            p = f"blk.{i}."
            m.moe[i] = GroveMoeBlock(
                **{f.name: getattr(e, f.name) for f in fields(MoeBlock)},
                gate_chexps=load_experts(gf, p + "ffn_gate_chexps.weight", device, (Ec, Fc, D), dtype),
                up_chexps=load_experts(gf, p + "ffn_up_chexps.weight", device, (Ec, Fc, D), dtype),
                down_chexps=load_experts(gf, p + "ffn_down_chexps.weight", device, (Ec, D, Fc), dtype))
        m.weights_norm = True     # the graph passes norm_w = true; the loader reads no expert_weights_norm
        m.experts_per_group, m.group_scale = G, float(scale)
        m.chunk_router = torch.eye(Ec, dtype=torch.float32, device=device)   # router_in passes straight through
        return m

    def head_weights(self) -> list:
        return super().head_weights() + [w for e in self.moe for w in (e.gate_chexps, e.up_chexps, e.down_chexps)]

    def chunk_weights(self, h: torch.Tensor, e: GroveMoeBlock) -> torch.Tensor:
        """(T, Ec) float32: each chunk expert's total weight S_c over the K slots (0 where none chose it)."""
        K, G, Ec = self.cfg.n_experts_used, self.experts_per_group, self.chunk_router.shape[0]
        _, top = reference.route(h, e.gate_inp, K, False)                    # the routed choice (softmax order)
        p = torch.softmax(h.float() @ e.gate_inp.float().t(), dim=-1)      # (T, E)
        c = torch.div(top, G, rounding_mode="floor")                         # (T, K) chunk of each slot
        a = p.gather(1, c)                                                   # p of expert number c (build_moe_ffn)
        a = a / a.sum(-1, keepdim=True).clamp(min=CLAMP)
        return torch.zeros(h.shape[0], Ec, dtype=torch.float32, device=h.device).scatter_add_(1, c, a)

    def ffn(self, h: torch.Tensor, e: GroveMoeBlock, ctx) -> torch.Tensor:
        """The layer's FFN of the normed input h (T, D) -> (T, D): m + s * adj(m) (module docstring)."""
        K = self.cfg.n_experts_used
        m = ops.moe_ffn(h, e.gate_inp, e.gate_exps, e.up_exps, e.down_exps, K, self.weights_norm, ctx)
        S = self.chunk_weights(h, e)                                         # (T, Ec)
        total = S.sum(-1, keepdim=True)
        log_s = torch.where(S > 0, S.clamp(min=1e-38).log(), torch.full_like(S, UNCHOSEN))
        adj = ops.moe_ffn(m, self.chunk_router, e.gate_chexps, e.up_chexps, e.down_chexps, K, False, ctx,
                          gating="topk_softmax", router_in=log_s)
        return (m.float() + (self.group_scale * total) * adj.float()).to(h.dtype)
