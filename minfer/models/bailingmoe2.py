"""inclusionAI Ling 2.0 (Ling-mini-2.0, Ling-flash-2.0, Ring-mini-2.0; HF BailingMoeV2ForCausalLM): the GGUF arch
`bailingmoe2`.

    x_0 = E[tokens]                                                     token_embd (V, D); output (V, D)
    for each layer l < n_layer (= block_count - nextn_predict_layers):
        q, k, v = split(W_qkv n(x))                                     n = RMSNorm(attn_norm); rows q, k, v
        q, k = rope(qn(q)), rope(kn(k))                                 qn, kn: RMSNorm of each head
        x = x + W_o attn(q, k, v)
        h = n'(x)                                                       n' = RMSNorm(ffn_norm)
        x = x + W_down(silu(W_gate h) * W_up h)                         l < leading_dense_block_count
        x = x + moe(h) + W_down_s(silu(W_gate_s h) * W_up_s h)          the other layers
    logits = W_out RMSNorm(x; output_norm)

glm4moe's / dots1's graph with a fused q/k/v. Each rule and its source (llama.cpp src/models/bailingmoe2.cpp:
load_arch_hparams, load_arch_tensors, the graph; conversion/bailingmoe.py BailingMoeV2Model, whose unset keys
conversion/base.py TextModel.set_gguf_parameters writes: expert_count, expert_used_count, expert_group_count (HF
n_group), expert_group_used_count (topk_group), expert_gating_func (score_function)):
- q/k/v from one matrix `attn_qkv` (H Dh + 2 Hkv Dh, D), rows q, then k, then v (HF attention.query_key_value, which
  the converter stores unpermuted; load_arch_tensors creates wqkv only, with flag 0: separate attn_q/k/v are not a
  bailingmoe2 file). The loader sizes it {n_embd, n_embd + 2 n_embd_gqa}, i.e. H Dh = D in the releases; minfer
  takes any H Dh. No biases (the loader creates none; the graph's wo_b is never loaded): a bias tensor in the file
  is refused by name (llama.cpp would refuse the file's unused tensors).
- Per-head RMSNorms attn_q_norm / attn_k_norm (HF query_layernorm / key_layernorm; both required) before rope.
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_BAILINGMOE2 -> NEOX) on the first rope.dimension_count dims of each head,
  the rest passed: the converter writes head_dim * partial_rotary_factor (its default 0.5; Ling 2.0: 64 of 128), HF's
  rotate_half on q[..., :rotary_dim]. Scale 1/sqrt(head_dim).
- The FFN's norm is `ffn_norm` (HF post_attention_layernorm, the pre-MLP norm).
- The first leading_dense_block_count layers (HF first_k_dense_replace; absent: 0) a SwiGLU MLP of
  feed_forward_length; the others build_moe_ffn's MoE (src/llama-graph.cpp), ops.moe_ffn / reference.route:
      p    = sigmoid(W_r h)           ffn_gate_inp (E, D); expert_gating_func (required by the loader; 2 = sigmoid,
                                      HF score_function; softmax files are accepted as build_moe_ffn runs them)
      s    = p + b_sel                exp_probs_b.bias (E,) (HF mlp.gate.expert_bias; TENSOR_NOT_REQUIRED: absent,
                                      s = p); s only chooses, the weights come from p
      groups: with expert_group_count G > 1 the E experts form G groups, each scored by the sum of its two best s;
      only the expert_group_used_count best groups stay eligible (HF group_limited_topk)
      top  = the K best eligible s (K = expert_used_count); w = p[top]
      w    = w / max(sum(w), 2^-14)   when expert_weights_norm (HF norm_topk_prob; absent: false)
      w    = w * expert_weights_scale (HF routed_scaling_factor, 2.5 in Ling 2.0; absent or 0: 1)
      moe(h) = sum_k w_k W_down[e_k](silu(W_gate[e_k] h) * W_up[e_k] h)
  plus the shared expert (no gate), width (expert_shared_feed_forward_length, else expert_feed_forward_length) *
  expert_shared_count, as the loader sizes ffn_{gate,up,down}_shexp (created with flag 0: a count of 0 is refused).
- NextN / MTP layers (HF num_nextn_predict_layers): the converter counts them in block_count and writes
  nextn_predict_layers; the trunk graph runs block_count - nextn_predict_layers layers and skips the rest
  (TENSOR_SKIP): ModelConfig's n_layers, and those blocks are never loaded here.
Where llama.cpp and HF differ this follows llama.cpp: the renormalization's clamped denominator (HF: + 1e-20).
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.chatglm import ChatGLMBlock
from minfer.models.glm4moe import Glm4MoeModel, load_moe_layer
from minfer.models.layers import BlockTensors, head_norm, load_head, merge_heads, rope_write_attend
from minfer.weights import load_qweight

# tensors llama.cpp's bailingmoe2 loader does not create (its graph has no place for them): refused by name
_REFUSED = ("attn_qkv.bias", "attn_q.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias")


class BailingMoe2Model(Glm4MoeModel):
    arch = "bailingmoe2"
    rope_style = "neox"                 # llama_model_rope_type: LLM_ARCH_BAILINGMOE2 -> NEOX
    qkv_bias = False
    qk_norm = True
    ffn_norm_tensor = "ffn_norm.weight"
    qk_norm_required = True
    select_bias_optional = True         # ffn_exp_probs_b: TENSOR_NOT_REQUIRED
    # load_arch_hparams: expert_shared_count and expert_gating_func with get_key (required), expert_feed_forward_length
    # get_key_or_arr (required); expert_count / expert_used_count asserted > 0
    expert_keys = ("expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_count",
                   "expert_gating_func")
    # feed_forward_length: llama_model::load_hparams reads it as optional; needed only by the dense lead layers
    # (checked in from_gguf, as glm4moe's)
    ffn_key_optional = True

    @classmethod
    def check_moe(cls, gf, cfg: ModelConfig) -> tuple:
        """glm4moe's checks; the shared expert's width as llama.cpp sizes it: (n_ff_shexp or n_ff_exp) *
        n_expert_shared."""
        cfg, _ = super().check_moe(gf, cfg)
        if cfg.expert_shared_count <= 0:
            raise MinferError(f"{gf.path}: {cls.arch}.expert_shared_count={cfg.expert_shared_count}: expected > 0 "
                              "(llama.cpp's loader requires the shared expert's tensors)")
        return cfg, (cfg.expert_shared_ffn or cfg.expert_ffn) * cfg.expert_shared_count

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "BailingMoe2Model":
        from tqdm import tqdm

        cfg = cfg or ModelConfig.from_gguf(gf)
        a = cls.arch
        for key in cls.expert_keys:
            if f"{a}.{key}" not in gf.metadata:
                raise MinferError(f"{gf.path}: metadata key '{a}.{key}' is missing (needed to build the {a} model)")
        cfg, Fs = cls.check_moe(gf, cfg)
        V, D, Dh, E, Fe = cfg.vocab, cfg.d_model, cfg.head_dim, cfg.n_experts, cfg.expert_ffn
        if cfg.ffn <= 0 and cfg.leading_dense_blocks > 0:
            raise MinferError(f"{gf.path}: metadata key '{a}.feed_forward_length' is missing (the width of the dense "
                              f"layers' ffn_gate/ffn_up/ffn_down; {a}.leading_dense_block_count="
                              f"{cfg.leading_dense_blocks})")
        if cfg.tied_output:
            raise MinferError(f"{gf.path}: tensor 'output.weight' is missing ({a}'s lm head is its own: "
                              "llama.cpp's loader requires it)")
        bar = tqdm(total=cfg.n_layers + 2, desc=f"loading {gf.path.name}", unit="layer",
                   disable=not progress, leave=False)
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=False, dtype=dtype)
        blocks, moe = [], []
        for i in range(cfg.n_layers):
            t = BlockTensors(gf, cfg, i, device, dtype)
            for name in _REFUSED:
                if t.has(name):
                    raise MinferError(f"{gf.path}: tensor '{t.p}{name}' is not supported for {a} (llama.cpp's "
                                      "bailingmoe2 loader takes one attn_qkv matrix and no attention biases)")
            dense = not cls.moe_layer(gf, cfg, i)
            F = cfg.ffn
            blk = ChatGLMBlock(
                attn_norm=t.v("attn_norm.weight", D), attn_q=None, attn_k=None, attn_v=None,
                attn_output=t.w("attn_output", (D, t.q_out)), ffn_norm=t.v(cls.ffn_norm_tensor, D),
                ffn_gate=t.w("ffn_gate", (F, D)) if dense else None,
                ffn_up=t.w("ffn_up", (F, D)) if dense else None,
                ffn_down=t.w("ffn_down", (D, F)) if dense else None,
                attn_q_norm=t.v("attn_q_norm.weight", Dh), attn_k_norm=t.v("attn_k_norm.weight", Dh))
            blk.attn_qkv = t.w("attn_qkv", (t.q_out + 2 * t.kv_out, D))
            blocks.append(blk)
            moe.append(None if dense else load_moe_layer(gf, t.p, E, D, Fe, Fs, device, dtype,
                                                         select_bias_optional=cls.select_bias_optional))
            bar.update()
        output_norm, output = load_head(gf, cfg, token_embd, device, dtype)
        bar.update()
        bar.close()
        m = cls(cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.moe = moe
        m.weights_norm = bool(cfg.expert_weights_norm)       # llama.cpp: false when the key is absent
        return m

    def _attention(self, h: torch.Tensor, blk: ChatGLMBlock, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """Block i's attention of the normed input h (T, D) -> (T, D): the fused q/k/v split (q, k, v rows), the
        per-head norms, NEOX rope on the first n_rot dims, the cache, W_o."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear(h, blk.attn_qkv, None, ctx).split((H * Dh, Hkv * Dh, Hkv * Dh), dim=-1)
        q = head_norm(q.reshape(T, H, Dh), blk.attn_q_norm, c.rms_eps)
        k = head_norm(k.reshape(T, Hkv, Dh), blk.attn_k_norm, c.rms_eps)
        o = rope_write_attend(cache, i, q, k, v.reshape(T, Hkv, Dh), step, c.rope, ctx)
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)

