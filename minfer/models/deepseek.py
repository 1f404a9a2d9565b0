"""DeepSeek v1 MoE (deepseek-moe-16b-base / -chat; HF DeepseekForCausalLM, remote code): the GGUF arch `deepseek`.

    x_0 = E[tokens]                                                     token_embd (V, D); output (V, D) or tied
    for each layer l:
        q, k, v = W_q n(x) + b_q, W_k n(x) + b_k, W_v n(x) + b_v        n = RMSNorm(attn_norm); biases optional
        x = x + W_o attn(rope(q), rope(k), v)
        h = n'(x)                                                       n' = RMSNorm(ffn_norm)
        x = x + W_down(silu(W_gate h) * W_up h)                         l < leading_dense_block_count
        x = x + moe(h) + W_down_s(silu(W_gate_s h) * W_up_s h)          the other layers
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/deepseek.cpp: load_arch_hparams, load_arch_tensors, the graph;
conversion/deepseek.py DeepseekModel):
- q/k/v: create_tensor_qkv with split attn_q / attn_k / attn_v (biases TENSOR_NOT_REQUIRED, added by build_qkv); the
  converter permutes q's and k's rows (and biases) for NORM rope (DeepseekModel.permute), so the file's rope is
  llama.cpp's NORM (llama_model_rope_type: LLM_ARCH_DEEPSEEK -> NORM) and equals HF's rotate_half. A fused attn_qkv
  (never written by the converter) is refused by name here; attn_output.bias, q/k norms and rope_freqs are never
  created by the loader (a file with them fails llama.cpp's tensor count), refused by name too.
- Heads: wq is {n_embd, n_embd} and the graph asserts n_embd_head == n_rot, so H * head_dim must be the embedding
  length and rope.dimension_count (the converter: hidden_size // heads) the head size; scores 1/sqrt(head_dim)
  (attention.scale is not read for deepseek).
- The first leading_dense_block_count layers (HF first_k_dense_replace) have a SwiGLU MLP of feed_forward_length
  (ffn_gate/ffn_up/ffn_down); the rest a MoE. HF's moe_layer_freq is not written by the converter: llama.cpp (and
  minfer) can only run its value 1, the released one.
- build_moe_ffn(..., LLM_FFN_SILU, norm_w=false, expert_weights_scale, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX): no
  selection bias (nor groups, below):  p = softmax(W_r h); top = the K best p (K = expert_used_count); w = p[top], NEVER
  renormalized (HF norm_topk_prob: false in the release; the converter writes no expert_weights_norm, and a file
  saying true is refused: llama.cpp's graph would ignore it); w = w * expert_weights_scale (optional key; the
  converter writes 1.0; 0 or 1 mean none).  The routed sum plus the shared experts: one ungated SwiGLU MLP of width
  expert_feed_forward_length * expert_shared_count (ffn_*_shexp, created with flag 0: required, so a count of 0 is
  refused; expert_shared_count and expert_feed_forward_length are get_key: required).
- expert_gating_func: the graph fixes softmax; the converter writes 1 (scoring_func softmax, the only one HF's v1
  accepts); any other value is refused by name (ModelConfig, expert_gatings). build_moe_ffn would limit the choice
  to expert groups from the generic expert_group_count: v1 has none (the converter writes none), refused when > 1.
- output.weight, or token_embd when the file has none (TENSOR_NOT_REQUIRED, then TENSOR_DUPLICATED).
- Any tensor the loader would not create (e.g. a router in a dense layer, a dense MLP in a MoE layer) is refused by
  name, as llama.cpp's loader refuses a file whose tensor count differs from what it created.
"""

from __future__ import annotations

from dataclasses import replace

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.glm4moe import Glm4MoeModel

_ATTN = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
         "attn_q.bias", "attn_k.bias", "attn_v.bias", "ffn_norm.weight")
_DENSE = ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
_MOE = ("ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
        "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight")
_WHY = {"attn_qkv.weight": "a fused q/k/v: the converter writes attn_q/attn_k/attn_v",
        "attn_qkv.bias": "a fused q/k/v: the converter writes attn_q/attn_k/attn_v",
        "attn_output.bias": "the loader creates no output bias",
        "attn_q_norm.weight": "the graph has no q/k norms", "attn_k_norm.weight": "the graph has no q/k norms",
        "exp_probs_b.bias": "the graph has no selection bias"}


class DeepseekModel(Glm4MoeModel):
    arch = "deepseek"
    rope_style = "normal"               # llama_model_rope_type: LLM_ARCH_DEEPSEEK -> NORM (converter permutes q/k)
    qkv_bias = True                     # create_tensor_qkv: q/k/v biases TENSOR_NOT_REQUIRED
    qk_norm = False
    ffn_norm_tensor = "ffn_norm.weight"
    expert_gatings = ("softmax",)       # the graph passes LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX
    # load_arch_hparams: expert_feed_forward_length get_key_or_arr, expert_shared_count get_key (both required);
    # load_arch_tensors: n_expert / n_expert_used > 0
    expert_keys = ("expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_count")
    ffn_key_optional = True             # llama_model::load_hparams reads feed_forward_length optionally; only the
    #                                     dense layers need it (Glm4MoeModel.from_gguf refuses it missing for them)
    select_bias_optional = True         # no exp_probs_b in this graph (one in the file is refused by check_moe)

    @classmethod
    def check_moe(cls, gf, cfg: ModelConfig) -> tuple:
        cfg, _ = super().check_moe(gf, cfg)
        a = cls.arch
        if cfg.expert_shared_count <= 0:
            raise MinferError(f"{gf.path}: {a}.expert_shared_count={cfg.expert_shared_count}: expected > 0 "
                              "(llama.cpp's deepseek loader requires the shared experts' tensors)")
        if cfg.expert_weights_norm:
            raise MinferError(f"{gf.path}: {a}.expert_weights_norm=true is not supported (llama.cpp's deepseek "
                              "graph never renormalizes the routed weights: build_moe_ffn norm_w=false)")
        if cfg.expert_groups > 1:
            raise MinferError(f"{gf.path}: {a}.expert_group_count={cfg.expert_groups} is not supported (DeepSeek v1 "
                              "routes over all experts; the converter writes no groups)")
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {a}.rope.dimension_count={cfg.rope.n_rot} differs from the head size "
                              f"{cfg.head_dim} (llama.cpp's deepseek graph asserts n_embd_head == n_rot)")
        if cfg.n_heads * cfg.head_dim != cfg.d_model:
            raise MinferError(f"{gf.path}: {a}.attention.head_count={cfg.n_heads} x head size {cfg.head_dim} != "
                              f"embedding_length {cfg.d_model} (llama.cpp's deepseek loader: attn_q and attn_output "
                              "are n_embd x n_embd)")
        expected = {"token_embd.weight", "output_norm.weight", "output.weight"}
        for i in range(cfg.n_layers):
            names = _ATTN + (_MOE if cls.moe_layer(gf, cfg, i) else _DENSE)
            expected |= {f"blk.{i}.{n}" for n in names}
        lead = f"{a}.leading_dense_block_count={cfg.leading_dense_blocks}"
        for name in gf.tensors:
            if name not in expected:
                suffix = name.split(".", 2)[-1] if name.startswith("blk.") else name
                why = _WHY.get(suffix, "llama.cpp's deepseek loader does not create it")
                if suffix in _DENSE:
                    why = f"a dense MLP in a MoE layer: {lead}"
                elif suffix in _MOE:
                    why = f"a MoE tensor in a dense layer: {lead}"
                raise MinferError(f"{gf.path}: tensor '{name}' is not supported for {a} ({why})")
        # the graph: softmax gating (whatever the file says), no renormalization
        cfg = replace(cfg, expert_gating="softmax", expert_weights_norm=False)
        return cfg, cfg.expert_ffn * cfg.expert_shared_count
