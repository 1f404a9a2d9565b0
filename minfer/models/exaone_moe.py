"""LG K-EXAONE (HF ExaoneMoeForCausalLM; llama.cpp LLM_ARCH_EXAONE_MOE): the GGUF arch `exaone-moe`.

    x_0 = E[tokens]                                                     token_embd (V, D); output (V, D), or tied
    for each layer l < n_layer (= block_count - nextn_predict_layers):
        h = n(x)                                                        n = RMSNorm(attn_norm)
        q, k = qn(W_q h), kn(W_k h)                                     qn, kn: RMSNorm of each head (Dh,)
        x = x + W_o attn_l(r_l(q), r_l(k), W_v h)
        h = n'(x)                                                       n' = RMSNorm(ffn_norm)
        x = x + W_down(silu(W_gate h) * W_up h)                         l < leading_dense_block_count
        x = x + moe(h) + W_down_s(silu(W_gate_s h) * W_up_s h)          the other layers
    logits = W_out RMSNorm(x; output_norm)
    layer l local  -> attention over the last W keys, r_l = rope
    layer l global -> attention over every key,      r_l = identity (no rope)

EXAONE 4's attention (exaone4.py: per-head q/k norms, rope on the window layers only) in pre-norm blocks
around DeepSeek-V3's MoE (glm4moe.py / dots1.py through ops.moe_ffn). Each rule and its source (llama.cpp
src/models/exaone-moe.cpp: load_arch_hparams, load_arch_tensors, the graph; conversion/exaone.py
ExaoneMoEModel (Exaone4Model's window keys); HF transformers models/exaone_moe/modeling_exaone_moe.py):
- Pre-norm blocks: attn_norm before the attention, ffn_norm before the FFN (graph: build_norm(inpL,
  attn_norm) / build_norm(ffn_inp, ffn_norm); HF input_layernorm / post_attention_layernorm, the pre-MLP
  norm); no post-norms (unlike exaone4). One eps, attention.layer_norm_rms_epsilon.
- q/k RMSNorm per head, weights (head_dim,), both required (flag 0), before rope (graph; HF q_norm /
  k_norm). q/k/v biases taken when present (create_tensor_qkv: TENSOR_NOT_REQUIRED; HF has none); a fused
  attn_qkv (which create_tensor_qkv would also take; the converter never writes it) refused by name.
- The window: `exaone-moe.attention.sliding_window` W is required (load_arch_hparams: get_key without
  `false`; refused by name when absent or not positive) and always used (swa_type STANDARD); the layers
  `attention.sliding_window_pattern` marks (per-layer flags from HF layer_types, or an integer P: l local
  when (l + 1) % P != 0, load_swa_pattern(ml, 4)'s default 4) are local: a query at p sees keys
  p - W < j <= p (HF create_sliding_window_causal_mask).
- Rope only on the local layers, none on the global ones (graph: `if (is_local_layer) ggml_rope_ext`;
  HF: `if self.sliding_window is None or self.is_sliding`, the sliding window always set in a file that
  llama.cpp loads). NEOX (llama_model_rope_type: LLM_ARCH_EXAONE_MOE -> NEOX; q/k unpermuted), on the
  whole head (the graph asserts n_rot == head_dim), the file's freq_base and, when present,
  rope_freqs.weight (Llama-3 factors; model.get_rope_factors); the graph passes the context's freq_base,
  so rope.freq_base_swa changes nothing. Scale 1/sqrt(head_dim).
- The first leading_dense_block_count layers (HF first_k_dense_replace / mlp_layer_types "dense"): a SwiGLU
  MLP of feed_forward_length. The others, the MoE of glm4moe.py (build_moe_ffn; HF ExaoneMoeTopkRouter):
  p = sigmoid(W_r h), choice on p + exp_probs_b.bias (optional, TENSOR_NOT_REQUIRED: without it on p)
  within the expert_group_used_count best of expert_group_count groups (each scored by its two best),
  weights p[top], renormalized when expert_weights_norm (HF norm_topk_prob; absent: false), times
  expert_weights_scale (HF routed_scaling_factor; 0 or absent: 1).
- expert_gating_func: llama.cpp's loader requires it, the converter writes it only from a config.json
  scoring_func (HF's ExaoneMoeConfig has none: its router is sigmoid only). Absent -> sigmoid here.
- The shared expert, no gate, always present (ffn_{gate,up,down}_shexp flag 0), of width
  expert_shared_feed_forward_length, or expert_feed_forward_length when that is absent or 0
  (load_arch_tensors: n_ff_shexp > 0 ? n_ff_shexp : n_ff_exp; the converter writes
  moe_intermediate_size * num_shared_experts, HF's shared MLP width).
- NextN / MTP layers (nextn_predict_layers, counted in block_count): skipped, as llama.cpp's trunk graph.
"""

from __future__ import annotations

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.exaone4 import qk_norm_window_attention
from minfer.models.gemma3 import swa_layers
from minfer.models.glm4moe import Glm4MoeModel

DEFAULT_SWA_PATTERN = 4     # llama_model_exaone_moe::load_arch_hparams: load_swa_pattern(ml, 4)


class ExaoneMoeModel(Glm4MoeModel):
    arch = "exaone-moe"
    rope_style = "neox"                 # llama_model_rope_type: LLM_ARCH_EXAONE_MOE -> NEOX
    qkv_bias = True                     # optional (create_tensor_qkv)
    qk_norm = True
    qk_norm_required = True             # exaone-moe.cpp: attn_q_norm / attn_k_norm flag 0
    select_bias_optional = True         # exaone-moe.cpp: ffn_exp_probs_b TENSOR_NOT_REQUIRED
    ffn_norm_tensor = "ffn_norm.weight"
    expert_keys = ("expert_count", "expert_used_count", "expert_feed_forward_length")

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "ExaoneMoeModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        a, md = cls.arch, gf.metadata
        key = f"{a}.attention.sliding_window"
        if key not in md:
            raise MinferError(f"{gf.path}: metadata key '{key}' is missing (llama.cpp's exaone-moe loader "
                              "requires it)")
        if cfg.sliding_window <= 0:
            raise MinferError(f"{gf.path}: metadata '{key}' = {cfg.sliding_window}: expected a positive window")
        for i in range(cfg.n_layers):
            if f"blk.{i}.attn_qkv.weight" in gf.tensors:
                raise MinferError(f"{gf.path}: tensor 'blk.{i}.attn_qkv.weight' (a fused q/k/v) is not supported "
                                  f"for {a} (the converter writes separate attn_q/attn_k/attn_v)")
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {a}.rope.dimension_count={cfg.rope.n_rot}, expected the head size "
                              f"{cfg.head_dim} (exaone-moe.cpp asserts n_rot == head size)")
        pattern = cfg.swa_pattern if cfg.swa_pattern is not None else DEFAULT_SWA_PATTERN
        is_local = swa_layers(cfg.n_layers, cfg.sliding_window, pattern)
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.window, m.is_local = cfg.sliding_window, is_local
        m.use_rope = is_local           # the graph: rope where is_swa(il), nowhere else
        return m

    @classmethod
    def check_moe(cls, gf, cfg: ModelConfig) -> tuple:
        """Glm4MoeModel's checks; the shared expert's width from expert_shared_feed_forward_length
        (absent or 0: expert_feed_forward_length), always present."""
        cfg, _ = super().check_moe(gf, cfg)
        fs = int(gf.metadata.get(f"{cls.arch}.expert_shared_feed_forward_length", 0) or 0)
        if fs < 0:
            raise MinferError(f"{gf.path}: {cls.arch}.expert_shared_feed_forward_length={fs}: expected >= 0")
        return cfg, (fs if fs > 0 else cfg.expert_ffn)

    _attention = qk_norm_window_attention    # exaone4's: rope and the window on a local layer, neither on a global one
