"""Cohere2 MoE (HF Cohere2MoeForCausalLM, e.g. North-Mini-Code): the GGUF arch `cohere2moe`.

    x_0 = E[tokens]                                             token_embd (V, D); output (V, D), or tied
    for each layer l < n_layer (= block_count - nextn_predict_layers):
        h = n(x)                                                n: RMSNorm or LayerNorm (no bias), attn_norm
        a = W_o attn_l(r_l(W_q h), r_l(W_k h), W_v h)
        f = W_down(silu(W_gate h) * W_up h)                     l < leading_dense_block_count
        f = moe(h)                                              the other layers, no shared expert
        f = (moe(h) + W_down_s(silu(W_gate_s h) * W_up_s h)) / 2    with expert_shared_count > 0
        x = (f + x) + a                                         attention and FFN in parallel, one norm
    logits = logit_scale * (W_out n(x; output_norm))
    layer l local (sliding_window_pattern)  -> attention over the last W keys, r_l = rope
    layer l global                          -> attention over every key, r_l = rope for the dense prefix
                                               layers, identity (no rope) for the others

cohere2's parallel block and window layout (cohere2.py, command_r.py) with a MoE FFN. Each rule and its
source (llama.cpp src/models/cohere2moe.cpp: load_arch_hparams, load_arch_tensors, the graph;
conversion/command_r.py Cohere2MoeModel; HF transformers models/cohere2_moe/modular_cohere2_moe.py):
- The norm: RMSNorm when `cohere2moe.attention.layer_norm_rms_epsilon` is there and nonzero, else a
  LayerNorm without bias with `attention.layer_norm_epsilon` (load_arch_hparams reads both optionally,
  needs one; the graph: f_norm_rms_eps == 0 ? LLM_NORM : LLM_NORM_RMS, for attn_norm and output_norm; HF
  Cohere2MoeRMSNorm when config.rms_norm_eps is set, else Cohere2MoeLayerNorm). The converter writes the
  RMS key only when rms_norm_eps is set, the LayerNorm key always (HF's config always has
  layer_norm_eps): here the LayerNorm key is required, as for cohere2.
- One norm per layer feeds the attention and the FFN, whose outputs go to the residual together:
  cur = ffn + inpL, then + attn_out (the graph; HF Cohere2DecoderLayer: residual + attn + mlp).
- The window: `attention.sliding_window` W required (get_key without a default), always used
  (swa_type STANDARD); the local layers are `attention.sliding_window_pattern`'s: the converter writes one
  flag per layer from HF layer_types; an integer P takes load_swa_pattern(ml, 4, dense_first = true)'s
  rule -- layer l local when l % P != 0 (llama_hparams::set_swa_pattern), default P = 4. A query at p
  sees keys p - W < j <= p (HF sliding-window mask).
- RoPE on the local layers and on every dense-prefix layer (the graph: `if (is_swa || force_rope)`,
  force_rope = il < n_layer_dense_lead; HF Cohere2MoeAttention: `sliding_window is not None or
  force_rope`, force_rope for a dense layer when prefix_dense_sliding_window_pattern == 1, which the
  converter cannot record: files follow llama.cpp), none on the global MoE layers. NORM style, adjacent
  pairs (llama_model_rope_type: LLM_ARCH_COHERE2MOE -> NORM; q/k unpermuted: HF Cohere's interleaved
  rotate_half), on the whole head (the graph asserts n_rot == head size), the context's freq_base and
  rope_freqs.weight if any (rope.freq_base_swa, read by the loader, is not used by the graph).
  Attention scale 1/sqrt(head_dim).
- FFN: the first `leading_dense_block_count` layers (required key; HF mlp_layer_types "dense") a SwiGLU
  of `feed_forward_length` (HF prefix_dense_intermediate_size); the others a MoE of
  `expert_feed_forward_length`-wide SwiGLU experts (build_moe_ffn; HF Cohere2MoeTopKRouter):
      softmax gating (expert_gating_func 1): p = softmax(W_r h), the K largest, renormalized when
          expert_weights_norm -- HF: softmax over the K largest logits, the same weights;
      sigmoid gating (2, also when the key is absent: load_arch_hparams maps NONE to SIGMOID):
          p = sigmoid(W_r h), the K largest, w / sum(w) when expert_weights_norm (HF norm_topk_prob);
      times expert_weights_scale when not 0 or 1 (build_moe_ffn; the converter writes none).
  expert_weights_norm absent: false (llama.cpp's default). HF's softmax router renormalizes whatever
  norm_topk_prob says; a softmax file with expert_weights_norm false runs as llama.cpp (not renormalized).
  With `expert_shared_count` > 0 a shared
  SwiGLU of `expert_shared_feed_forward_length` (absent or 0: expert_feed_forward_length * count) whose
  output is averaged with the routed one: (routed + shared) * 0.5 (the graph; HF
  shared_expert_combination_strategy "average", the only one the converter accepts).
- logits * `cohere2moe.logit_scale` (required; a zero one not applied: `if (f_logit_scale)`).
- NextN / MTP layers (nextn_predict_layers, counted in block_count): not run, as llama.cpp's trunk graph.
- Refused by name (llama.cpp's loader has no such tensor, or the converter never writes it): q/k norms,
  attention biases (the converter drops HF's all-zero biases), a fused attn_qkv, fused ffn_gate_up_exps,
  a selection bias exp_probs_b.bias.
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.cohere2 import Cohere2Model
from minfer.models.command_r import CommandRModel, logit_scale
from minfer.models.glm4moe import load_moe_layer
from minfer.models.layers import Block, ffn_branch
from minfer.models.qwen3moe import stacked_experts
from minfer.weights import QWeight, load_qweight, load_vector

DEFAULT_SWA_PATTERN = 4     # llama_model_cohere2moe::load_arch_hparams: load_swa_pattern(ml, 4, true)
_REFUSED = (("attn_q_norm.weight", "q/k norms"), ("attn_k_norm.weight", "q/k norms"),
            ("attn_qkv.weight", "a fused q/k/v matrix"), ("attn_q.bias", "attention biases"),
            ("attn_k.bias", "attention biases"), ("attn_v.bias", "attention biases"),
            ("attn_output.bias", "attention biases"), ("ffn_gate_up_exps.weight", "fused gate/up experts"),
            ("exp_probs_b.bias", "an expert selection bias"))


def swa_layers_dense_first(n_layers: int, pattern) -> tuple[bool, ...]:
    """Which layers use the window: per-layer flags as given, or an integer P with llama.cpp's
    dense_first rule (llama_hparams::set_swa_pattern(P, true): l local when P == 0 or l % P != 0)."""
    if isinstance(pattern, (list, tuple)):
        if len(pattern) < n_layers:
            raise MinferError(f"cohere2moe.attention.sliding_window_pattern has {len(pattern)} entries, "
                              f"expected one per layer ({n_layers})")
        return tuple(bool(p) for p in pattern[:n_layers])
    p = int(pattern)
    return tuple(p == 0 or i % p != 0 for i in range(n_layers))


class Cohere2MoeModel(Cohere2Model):
    """cohere2's attention (rope / window per layer: CommandRModel._attention) in the parallel block,
    with a dense or MoE FFN per layer (self.moe[i]: None for a dense layer) and the file's norm kind."""

    arch = "cohere2moe"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_COHERE2MOE -> NORM
    norm_eps_key = "attention.layer_norm_epsilon"
    ffn_key_optional = True   # feed_forward_length: needed only with dense-prefix layers (checked below)
    expert_gatings = ("softmax", "sigmoid")
    logit_scale_required = True
    qk_norm_layers = 0
    shared_combine = 0.5      # cohere2moe.cpp: ggml_scale(moe_out + ffn_shexp, 0.5f) (HF "average")

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Cohere2MoeModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        a, md = cfg.arch, gf.metadata
        for suffix in ("logit_scale", "attention.sliding_window", "leading_dense_block_count", "expert_count",
                       "expert_used_count", "expert_feed_forward_length"):
            if f"{a}.{suffix}" not in md:
                raise MinferError(f"{gf.path}: metadata key '{a}.{suffix}' is missing (needed to build the {a} model)")
        E, K, Fe, n_dense = cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn, cfg.leading_dense_blocks
        if E <= 0 or not 0 < K <= E or Fe <= 0:
            raise MinferError(f"{gf.path}: {a}.expert_count={E}, expert_used_count={K}, "
                              f"expert_feed_forward_length={Fe}: expected 0 < used <= count and a positive length")
        if not 0 <= n_dense <= cfg.n_layers:
            raise MinferError(f"{gf.path}: {a}.leading_dense_block_count={n_dense}: expected 0..{cfg.n_layers}")
        if n_dense and cfg.ffn <= 0:
            raise MinferError(f"{gf.path}: metadata key '{a}.feed_forward_length' is missing or 0 (needed for the "
                              f"{n_dense} dense-prefix layers)")
        if cfg.sliding_window <= 0:
            raise MinferError(f"{gf.path}: metadata key '{a}.attention.sliding_window' is {cfg.sliding_window}, "
                              "expected a window > 0")
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {a}.rope.dimension_count={cfg.rope.n_rot}, expected the head size "
                              f"{cfg.head_dim} (cohere2moe.cpp asserts n_rot == head size)")
        for i in range(cfg.n_layers):
            for name, what in _REFUSED:
                if f"blk.{i}.{name}" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{name}': {what} are not supported for {a} "
                                      "(llama.cpp's cohere2moe loader / converter has none)")
        shared = cfg.expert_shared_count
        if shared < 0:
            raise MinferError(f"{gf.path}: {a}.expert_shared_count={shared}: expected >= 0")
        Fs = (cfg.expert_shared_ffn or Fe * shared) if shared > 0 else 0
        # LlamaModel.from_gguf (CommandRModel's refuses output.weight, which this loader takes) -> load_block
        m = super(CommandRModel, cls).from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress,
                                                act_dtype=act_dtype)
        m.moe = [None if i < n_dense else
                 load_moe_layer(gf, f"blk.{i}.", E, cfg.d_model, Fe, Fs, device, dtype, select_bias_optional=True)
                 for i in range(cfg.n_layers)]
        m.logit_scale = logit_scale(gf, a, True)
        rms = md.get(f"{a}.attention.layer_norm_rms_epsilon")
        m.rms_norm = bool(rms)          # the graph: f_norm_rms_eps == 0 -> LayerNorm
        m.norm_eps = float(rms) if m.rms_norm else cfg.rms_eps
        m.gating = cfg.expert_gating if f"{a}.expert_gating_func" in md else "sigmoid"
        m.weights_norm = bool(cfg.expert_weights_norm)      # llama.cpp: false when the key is absent
        m.window = cfg.sliding_window
        pattern = cfg.swa_pattern if cfg.swa_pattern is not None else DEFAULT_SWA_PATTERN
        m.is_local = swa_layers_dense_first(cfg.n_layers, pattern)
        m.use_rope = tuple(loc or i < n_dense for i, loc in enumerate(m.is_local))
        return m

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        """The attention weights; the dense SwiGLU for a dense-prefix layer (the MoE: from_gguf)."""
        p, D, Dh, H, Hkv = f"blk.{i}.", cfg.d_model, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads

        def w(name, shape) -> QWeight:
            return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

        dense, F = i < cfg.leading_dense_blocks, cfg.ffn
        return Block(attn_norm=load_vector(gf, p + "attn_norm.weight", device, D),
                     attn_q=w("attn_q", (H * Dh, D)), attn_k=w("attn_k", (Hkv * Dh, D)),
                     attn_v=w("attn_v", (Hkv * Dh, D)), attn_output=w("attn_output", (D, H * Dh)),
                     ffn_norm=None, ffn_gate=w("ffn_gate", (F, D)) if dense else None,
                     ffn_up=w("ffn_up", (F, D)) if dense else None, ffn_down=w("ffn_down", (D, F)) if dense else None)

    def layer_matrices(self, i: int) -> list[QWeight]:
        e = self.moe[i]
        return [] if e is None else e.matrices()

    def head_weights(self) -> list:
        return super().head_weights() + stacked_experts(self.moe)

    def _norm(self, x: torch.Tensor, w: torch.Tensor, act) -> torch.Tensor:
        if self.rms_norm:
            return ops.rms_norm(x, w, self.norm_eps).to(act)
        return ops.layer_norm(x, w, self.norm_eps, act)

    def _ffn(self, h: torch.Tensor, blk: Block, i: int, ctx) -> torch.Tensor:
        """Layer i's FFN of the normed input h (T, D) -> (T, D)."""
        e = self.moe[i]
        if e is None:
            return ffn_branch(h, blk, ctx)
        c = self.cfg
        routed = ops.moe_ffn(h, e.gate_inp, e.gate_exps, e.up_exps, e.down_exps, c.n_experts_used,
                             self.weights_norm, ctx, gating=self.gating, weights_scale=c.expert_weights_scale)
        if e.gate_shexp is None:
            return routed
        shared = ops.linear(ops.swiglu(ops.linear(h, e.gate_shexp, None, ctx), ops.linear(h, e.up_shexp, None, ctx)),
                            e.down_shexp, None, ctx)
        return (routed.float() + shared.float()) * self.shared_combine

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, last = self.act_dtype, len(self.blocks) - 1
        x = ops.embedding(tokens, self.token_embd)                           # (T, D) float32
        for i, blk in enumerate(self.blocks):
            h = self._norm(x, blk.attn_norm, act)                            # (T, D) act
            a = self._attention(h, blk, i, cache, step, ctx)
            if i == last:     # only the rows whose logits are wanted past the last attention
                x, h, a = step.rows(x), step.rows(h), step.rows(a)
            x = (self._ffn(h, blk, i, ctx).float() + x) + a.float()        # cohere2moe.cpp: (ffn + inpL) + attn
        h = self._norm(x, self.output_norm, act)                             # (R, D)
        logits = self.head(h, ctx)       # (R, V)
        return logits * self.logit_scale if self.logit_scale != 1.0 else logits
