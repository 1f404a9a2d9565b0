"""Arcee Trinity (HF AfmoeForCausalLM; llama.cpp LLM_ARCH_AFMOE): the GGUF arch `afmoe`.

    x_0 = sqrt(D) E[tokens]                                             token_embd (V, D); output (V, D), or tied
    for each layer l:
        h = n(x)                                                        n = RMSNorm(attn_norm)
        q, k = qn(W_q h), kn(W_k h)                                     qn, kn: RMSNorm of each head (Dh,)
        o = attn_l(r_l(q), r_l(k), W_v h) * sigmoid(W_g h)              attn_gate (H*Dh, D), per element
        x = x + pn(W_o o)                                               pn = RMSNorm(post_attention_norm)
        h = n'(x)                                                       n' = RMSNorm(ffn_norm)
        x = x + pn'(ffn_l(h))                                           pn' = RMSNorm(post_ffw_norm)
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/afmoe.cpp: load_arch_hparams, load_arch_tensors, the graph;
conversion/afmoe.py AfmoeModel; HF transformers models/afmoe/modeling_afmoe.py):
- The embeddings times sqrt(D) (the graph's muP scaling, always; HF only with mup_enabled, which the
  released checkpoints set and the converter does not write).
- Pre and post norms around both branches (attn_norm / post_attention_norm, ffn_norm / post_ffw_norm, all
  required; HF input_layernorm / post_attention_layernorm, pre_mlp_layernorm / post_mlp_layernorm). One
  eps, attention.layer_norm_rms_epsilon.
- q/k RMSNorm per head (required), before rope; q/k/v biases taken when present (create_tensor_qkv; HF
  attention_bias, off in the releases); a fused attn_qkv refused by name (the converter writes q, k, v).
- The gate: sigmoid(W_g h) (attn_gate, required; HF gate_proj of the normed input) times the attention's
  output per element, before W_o (the graph: ggml_mul(cur, sigmoid(gate)), then wo).
- The window: attention.sliding_window W (optional; absent or 0: no window, swa_type NONE); the layers
  attention.sliding_window_pattern marks (flags, or an integer P with l local when l % P < P - 1;
  load_swa_pattern(ml, 4)'s default 4: three local, one global) see keys p - W < j <= p (HF
  create_sliding_window_causal_mask on layer_types' sliding layers, global_attn_every_n_layers 4).
- Rope: NEOX (llama_model_rope_type: LLM_ARCH_AFMOE -> NEOX; afmoe's converter skips LlamaModel's q/k
  permutation) on the whole head, on the layers with (l + 1) % 4 != 0 only (the graph's use_rope with
  hparams.n_no_rope_layer_step, 4 and read from no key; HF: rope on the sliding layers only, the same
  layers under the default pattern), base rope.freq_base_swa on a local layer (llama.cpp: the SWA base,
  freq_base when the key is absent), freq_base on a global one, the file's linear scale, no rope factors:
  the graph passes none, and a rope_freqs.weight (which llama.cpp's loader would not take) is refused.
  Scale 1/sqrt(head_dim).
- The first leading_dense_block_count layers (HF num_dense_layers; absent: 0) a SwiGLU MLP of
  feed_forward_length. The others, build_moe_ffn through ops.moe_ffn (glm4moe.py's MoE): scores by
  expert_gating_func (absent: sigmoid, the loader's default and HF's only router), the choice on score +
  exp_probs_b.bias (required), weights renormalized when expert_weights_norm (HF always; the converter
  writes route_norm), times expert_weights_scale (HF route_scale); no expert groups (the loader reads no
  group keys: a file's expert_group_count is ignored, as llama.cpp does). Plus the ungated shared SwiGLU
  expert of expert_feed_forward_length * expert_shared_count (required key; 0: none).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.gemma3 import swa_layers
from minfer.models.glm4moe import Glm4MoeModel
from minfer.models.layers import Block, ffn_branch, head_norm, merge_heads, rope_write_attend
from minfer.weights import QWeight, load_qweight, load_vector

DEFAULT_SWA_PATTERN = 4     # llama_model_afmoe::load_arch_hparams: load_swa_pattern(ml, 4)
NO_ROPE_LAYER_STEP = 4      # llama_hparams::n_no_rope_layer_step (no key sets it for afmoe)


class AfmoeModel(Glm4MoeModel):
    arch = "afmoe"
    rope_style = "neox"                 # llama_model_rope_type: LLM_ARCH_AFMOE -> NEOX
    qkv_bias = True                     # optional (create_tensor_qkv)
    qk_norm = True
    qk_norm_required = True             # afmoe.cpp: attn_q_norm / attn_k_norm flag 0
    select_bias_optional = False        # afmoe.cpp: ffn_exp_probs_b flag 0
    ffn_norm_tensor = "ffn_norm.weight"
    expert_keys = ("expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_count")

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "AfmoeModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        a, md = cls.arch, gf.metadata
        for i in range(cfg.n_layers):
            if f"blk.{i}.attn_qkv.weight" in gf.tensors:
                raise MinferError(f"{gf.path}: tensor 'blk.{i}.attn_qkv.weight' (a fused q/k/v) is not supported "
                                  f"for {a} (the converter writes separate attn_q/attn_k/attn_v)")
        if "rope_freqs.weight" in gf.tensors:
            raise MinferError(f"{gf.path}: tensor 'rope_freqs.weight' is not supported for {a} (llama.cpp's afmoe "
                              "graph passes no rope factors and its loader does not take the tensor)")
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {a}.rope.dimension_count={cfg.rope.n_rot}, expected the head size "
                              f"{cfg.head_dim} (afmoe rotates whole heads)")
        if cfg.sliding_window < 0:
            raise MinferError(f"{gf.path}: {a}.attention.sliding_window={cfg.sliding_window}: expected >= 0")
        # no expert groups: llama.cpp's afmoe loader reads no group keys
        cfg = replace(cfg, expert_groups=1, expert_groups_used=1)
        pattern = cfg.swa_pattern if cfg.swa_pattern is not None else DEFAULT_SWA_PATTERN
        is_local = swa_layers(cfg.n_layers, cfg.sliding_window, pattern)
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        D, q_out = cfg.d_model, cfg.n_heads * cfg.head_dim
        for i, b in enumerate(m.blocks):
            p = f"blk.{i}."
            b.attn_gate = load_qweight(gf, p + "attn_gate.weight", device, (q_out, D), dtype=dtype)
            b.attn_post_norm = load_vector(gf, p + "post_attention_norm.weight", device, D)
            b.ffn_post_norm = load_vector(gf, p + "post_ffw_norm.weight", device, D)
        m.window, m.is_local = cfg.sliding_window, is_local
        m.use_rope = tuple((i + 1) % NO_ROPE_LAYER_STEP != 0 for i in range(cfg.n_layers))
        swa_base = float(md.get(f"{a}.rope.freq_base_swa", cfg.rope.theta))
        m.rope_local = replace(cfg.rope, theta=swa_base)
        m.embed_scale = float(D) ** 0.5
        return m

    def layer_matrices(self, i: int) -> list[QWeight]:
        return super().layer_matrices(i) + [self.blocks[i].attn_gate]

    def _attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """The normed input h (T, D) -> W_o (attn(...) * sigmoid(W_g h)) (T, D): per-head q/k norms, rope
        where use_rope, the window on a local layer."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v),
                                  (blk.attn_q_bias, blk.attn_k_bias, blk.attn_v_bias), ctx)
        gate = ops.linear(h, blk.attn_gate, None, ctx)                          # (T, H*Dh)
        q, k, v = head_norm(q.view(T, H, Dh), blk.attn_q_norm, c.rms_eps), \
            head_norm(k.view(T, Hkv, Dh), blk.attn_k_norm, c.rms_eps), v.view(T, Hkv, Dh)
        window = self.window if self.is_local[i] else 0
        rope = (self.rope_local if self.is_local[i] else c.rope) if self.use_rope[i] else None
        o = rope_write_attend(cache, i, q, k, v, step, rope, ctx, window=window)      # (T, H, Dh)
        return ops.linear(self.gated(merge_heads(o), gate).to(h.dtype), blk.attn_output, None, ctx)

    @staticmethod
    def gated(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """The attention's output (T, H*Dh) times sigmoid of the gate projection, per element, float32."""
        return o.float() * torch.sigmoid(gate.float())

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd) * self.embed_scale         # (T, D) float32
        for i, (blk, e) in enumerate(zip(self.blocks, self.moe)):
            h = ops.rms_norm(x, blk.attn_norm, eps).to(act)
            a = ops.rms_norm(self._attention(h, blk, i, cache, step, ctx).float(), blk.attn_post_norm, eps)
            x, h = ops.add_rms_norm(x, a, blk.ffn_norm, eps, act, ctx)
            f = ffn_branch(h, blk, ctx) if e is None else self.ffn(h, e, ctx)  # (T, D)
            x = x + ops.rms_norm(f.float(), blk.ffn_post_norm, eps)
        h = ops.rms_norm(step.rows(x), self.output_norm, eps).to(act)          # (R, D)
        return self.head(h, ctx)  # (R, V)
