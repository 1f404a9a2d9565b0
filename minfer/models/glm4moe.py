"""GLM-4.5 / GLM-4.5-Air / GLM-4.6 (HF Glm4MoeForCausalLM), Solar Open (SolarOpenForCausalLM): the GGUF arch `glm4moe`.

    x_0 = E[tokens]                                                     token_embd (V, D)
    for each layer l < n_layer (= block_count - nextn_predict_layers):
        q, k, v = W_q n(x) + b_q, W_k n(x) + b_k, W_v n(x) + b_v        n  = RMSNorm(attn_norm)
        q, k = qn(q), kn(k)           per head, when the file has attn_{q,k}_norm (GLM-4.5 355B)
        x = x + W_o attn(rope(q), rope(k), v)
        h = n'(x)                                                       n' = RMSNorm(post_attention_norm)
        x = x + W_down(silu(W_gate h) * W_up h)                         l < leading_dense_block_count
        x = x + moe(h) + W_down_s(silu(W_gate_s h) * W_up_s h)          the other layers
    logits = W_out RMSNorm(x; output_norm)                              output (V, D), or tied

Each rule and its source (llama.cpp src/models/glm4-moe.cpp: load_arch_hparams,
load_arch_tensors, the graph; conversion/glm.py Glm4MoeModel; HF transformers
models/glm4_moe/modeling_glm4_moe.py):
- Pre-norm blocks. The FFN's norm is `post_attention_norm` (LLM_TENSOR_ATTN_POST_NORM: HF's
  post_attention_layernorm, the pre-MLP norm; no norm of the branch outputs, unlike glm4).
- q/k/v biases (HF attention_bias; create_tensor_qkv loads them when present, so they are
  optional here too) and optional per-head q/k RMSNorms (HF use_qk_norm; TENSOR_NOT_REQUIRED),
  no o bias. Attention scale 1/sqrt(head_dim).
- RoPE NEOX (halves) on the first rope.dimension_count dims of each head, the rest passed through
  (llama_model_rope_type: LLM_ARCH_GLM4_MOE -> NEOX without M-RoPE; the converter writes
  head_dim * partial_rotary_factor and leaves q/k unpermuted; HF rotate_half on q[..., :rotary_dim]).
  M-RoPE files (rope.dimension_sections) are refused by name.
- The first leading_dense_block_count layers (HF first_k_dense_replace; llama.cpp default 0) have a
  SwiGLU MLP of width feed_forward_length (ffn_gate/ffn_up/ffn_down); the others a MoE
  (build_moe_ffn; HF Glm4MoeTopkRouter, Glm4MoeMoE):
      p    = sigmoid(W_r h)                     ffn_gate_inp (E, D); expert_gating_func 2 (sigmoid,
                                                llama.cpp's default for glm4moe when the key is absent)
      s    = p + b_sel                          exp_probs_b.bias (E,): HF e_score_correction_bias
      with expert_group_count G > 1: the experts form G groups, each scored by the sum of its two
      best s; only the expert_group_used_count best groups stay eligible (HF n_group/topk_group)
      top  = the K largest s (K = expert_used_count); weights w = p[top] (p, not s)
      w    = w / sum(w)  when expert_weights_norm (llama.cpp default false when the key is absent;
                         HF's norm_topk_prob defaults to true, the converter writes it)
      w    = w * expert_weights_scale           HF routed_scaling_factor (0 or absent: none)
      moe(h) = sum_k w_k W_down[e_k](silu(W_gate[e_k] h) * W_up[e_k] h)
  plus a shared expert, no gate, width expert_feed_forward_length * expert_shared_count
  (ffn_{gate,up,down}_shexp; none when the count is 0). The routing is ops.moe_ffn's (reference.route).
- Solar Open (HF SolarOpenForCausalLM; conversion/glm.py SolarOpenModel(Glm4MoeModel) writes glm4moe): every layer
  MoE and no dense width in its config, so the file has no feed_forward_length (nor leading_dense_block_count):
  llama.cpp reads the key as optional (llama_model::load_hparams get_key_or_arr(..., false)) and needs it only for
  the dense layers' ffn_{gate,up,down}; here too (ffn_key_optional; a dense layer without it is refused by name).
  Its YaRN (HF rope_parameters yarn, factor 2 over 65536; the converter writes rope.scaling.{type, factor,
  original_context_length}): mistral3.yarn_setup's frequencies with the truncated correction range (ggml
  rope_yarn_corr_dims; HF truncate) and the cos/sin factor c = get_mscale(f, 1) (llama-context.cpp
  yarn_attn_factor; HF yarn attention_factor) applied as q * c^2 after rope. Its full rotation comes from
  rope.dimension_count = head_dim (partial_rotary_factor 1 in the config; the converter's default is 0.5).
- NextN / MTP layers: the converter counts them in block_count and writes nextn_predict_layers;
  llama.cpp's trunk graph runs n_layer() = block_count - nextn_predict_layers layers and only its
  MTP graph uses the rest (blk.{n_layer}.nextn.*). minfer runs the trunk and never loads them.
Where llama.cpp and HF differ, this follows llama.cpp: the absent-key defaults above, and the
renormalization's denominator (clamped to at least 2^-14 instead of HF's + 1e-20).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, attention_branch, ffn_branch, head_norm, load_head, merge_heads, rope_and_write
from minfer.models.qwen3moe import MoeBlock, Qwen3MoeModel, load_experts
from minfer.weights import load_qweight, load_vector


@dataclass
class Glm4MoeBlock(MoeBlock):
    """A MoE layer's router, experts, selection bias and (ungated) shared expert."""

    exp_probs_b: torch.Tensor | None = None     # (E,) float32: added to the scores for the choice only


def load_moe_layer(gf, p: str, E: int, D: int, Fe: int, Fs: int, device, dtype,
                   select_bias_optional: bool = False) -> Glm4MoeBlock:
    """Layer prefix p's router (E, D), experts (E, Fe, D) / (E, D, Fe), selection bias exp_probs_b (E,)
    (select_bias_optional: None when the file has none) and, when Fs > 0, the ungated shared expert
    of width Fs (the tensor names llama.cpp's loaders give these MoE layers: glm4moe, ernie4_5-moe)."""
    e = Glm4MoeBlock(
        gate_inp=load_vector(gf, p + "ffn_gate_inp.weight", device, E * D).view(E, D),
        gate_exps=load_experts(gf, p + "ffn_gate_exps.weight", device, (E, Fe, D), dtype),
        up_exps=load_experts(gf, p + "ffn_up_exps.weight", device, (E, Fe, D), dtype),
        down_exps=load_experts(gf, p + "ffn_down_exps.weight", device, (E, D, Fe), dtype),
        exp_probs_b=(None if select_bias_optional and p + "exp_probs_b.bias" not in gf.tensors
                     else load_vector(gf, p + "exp_probs_b.bias", device, E)))
    if Fs > 0:
        e.gate_shexp = load_qweight(gf, p + "ffn_gate_shexp.weight", device, (Fs, D), dtype=dtype)
        e.up_shexp = load_qweight(gf, p + "ffn_up_shexp.weight", device, (Fs, D), dtype=dtype)
        e.down_shexp = load_qweight(gf, p + "ffn_down_shexp.weight", device, (D, Fs), dtype=dtype)
    return e


class Glm4MoeModel(Qwen3MoeModel):
    arch = "glm4moe"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_GLM4_MOE -> NEOX (no M-RoPE)
    qkv_bias = True           # optional per tensor (create_tensor_qkv: TENSOR_NOT_REQUIRED)
    qk_norm = True            # optional per tensor (TENSOR_NOT_REQUIRED)
    expert_gatings = ("sigmoid", "softmax")   # build_moe_ffn takes the file's expert_gating_func
    expert_keys = ("expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_count")
    ffn_norm_tensor = "post_attention_norm.weight"   # the FFN's norm (LLM_TENSOR_ATTN_POST_NORM here)
    qk_norm_required = False                        # dots1: both per-head norms required
    select_bias_optional = False                    # dots1: exp_probs_b.bias TENSOR_NOT_REQUIRED
    # feed_forward_length optional (ModelConfig: cfg.ffn 0 when absent; Solar Open has none), checked in from_gguf
    # against the dense layers; and YaRN read from the file (config.YARN_ARCHITECTURES). glm4moe's own: a subclass
    # (dots1, laguna, ...) keeps the required key and its own rope unless it declares them (__init_subclass__)
    ffn_key_optional = True
    reads_yarn = True
    yarn_rope = None          # the YaRN rope of the attention (None: cfg.rope, the fused paths)
    yarn_q_scale = 1.0        # c^2: q's factor after rope with YaRN

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        for name in ("ffn_key_optional", "reads_yarn"):
            setattr(cls, name, cls.__dict__.get(name, False))

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Glm4MoeModel":
        from tqdm import tqdm

        cfg = cfg or ModelConfig.from_gguf(gf)
        md, a = gf.metadata, cls.arch
        for key in cls.expert_keys:
            if f"{a}.{key}" not in md:
                raise MinferError(f"{gf.path}: metadata key '{a}.{key}' is missing (needed to build the {a} model)")
        cfg, Fs = cls.check_moe(gf, cfg)
        V, D, Dh, E, Fe = cfg.vocab, cfg.d_model, cfg.head_dim, cfg.n_experts, cfg.expert_ffn
        if cfg.ffn <= 0 and any(not cls.moe_layer(gf, cfg, i) for i in range(cfg.n_layers)):
            raise MinferError(f"{gf.path}: metadata key '{a}.feed_forward_length' is missing (the width of the dense "
                              f"layers' ffn_gate/ffn_up/ffn_down; {a}.leading_dense_block_count="
                              f"{cfg.leading_dense_blocks})")
        q_out, kv_out = cfg.n_heads * Dh, cfg.n_kv_heads * Dh
        bar = tqdm(total=cfg.n_layers + 2, desc=f"loading {gf.path.name}", unit="layer",
                   disable=not progress, leave=False)
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        blocks, moe = [], []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."

            def w(name, shape):
                return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

            def opt_vec(name, n, wanted):     # a TENSOR_NOT_REQUIRED vector: None when the file has none
                return load_vector(gf, p + name, device, n) if wanted and p + name in gf.tensors else None

            dense = not cls.moe_layer(gf, cfg, i)
            F = cfg.ffn
            blocks.append(Block(
                attn_norm=load_vector(gf, p + "attn_norm.weight", device, D),
                attn_q=w("attn_q", (q_out, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
                attn_output=w("attn_output", (D, q_out)),
                ffn_norm=load_vector(gf, p + cls.ffn_norm_tensor, device, D),
                ffn_gate=w("ffn_gate", (F, D)) if dense else None,
                ffn_up=w("ffn_up", (F, D)) if dense else None,
                ffn_down=w("ffn_down", (D, F)) if dense else None,
                attn_q_bias=opt_vec("attn_q.bias", q_out, cls.qkv_bias),
                attn_k_bias=opt_vec("attn_k.bias", kv_out, cls.qkv_bias),
                attn_v_bias=opt_vec("attn_v.bias", kv_out, cls.qkv_bias),
                attn_q_norm=opt_vec("attn_q_norm.weight", Dh, cls.qk_norm),
                attn_k_norm=opt_vec("attn_k_norm.weight", Dh, cls.qk_norm)))
            if cls.qk_norm_required and blocks[-1].attn_q_norm is None:
                raise MinferError(f"{gf.path}: tensor '{p}attn_q_norm.weight' is missing")
            if (blocks[-1].attn_q_norm is None) != (blocks[-1].attn_k_norm is None):
                have, miss = ("attn_q_norm", "attn_k_norm") if blocks[-1].attn_k_norm is None \
                    else ("attn_k_norm", "attn_q_norm")
                raise MinferError(f"{gf.path}: tensor '{p}{miss}.weight' is missing ('{p}{have}.weight' is present)")
            moe.append(None if dense else load_moe_layer(gf, p, E, D, Fe, Fs, device, dtype,
                                                         select_bias_optional=cls.select_bias_optional))
            bar.update()
        output_norm, output = load_head(gf, cfg, token_embd, device, dtype)
        bar.update()
        bar.close()
        m = cls(cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.moe = moe
        m.weights_norm = bool(cfg.expert_weights_norm)       # llama.cpp: false when the key is absent
        if cls.reads_yarn and md.get(f"{a}.rope.scaling.type") == "yarn":      # Solar Open (module docstring)
            from minfer.models.mistral3 import yarn_setup

            m.yarn_rope, m.yarn_q_scale = yarn_setup(gf, a, cfg)
        return m

    @classmethod
    def check_moe(cls, gf, cfg: ModelConfig) -> tuple:
        """The MoE keys checked (after expert_keys' presence): (the config the graph runs, the shared
        expert's width; 0: none)."""
        md, a, E, Fe = gf.metadata, cls.arch, cfg.n_experts, cfg.expert_ffn
        if f"{a}.rope.dimension_sections" in md:
            raise MinferError(f"{gf.path}: metadata key '{a}.rope.dimension_sections' (M-RoPE, the vision "
                              "variant) is not supported")
        if E <= 0 or not 0 < cfg.n_experts_used <= E or Fe <= 0 or cfg.expert_shared_count < 0:
            raise MinferError(f"{gf.path}: {a}.expert_count={E}, expert_used_count={cfg.n_experts_used}, "
                              f"expert_feed_forward_length={Fe}, expert_shared_count={cfg.expert_shared_count}: "
                              "expected 0 < used <= count, a positive length and a shared count >= 0")
        gating = cfg.expert_gating if f"{a}.expert_gating_func" in md else "sigmoid"
        # cfg.n_layers is the trunk (ModelConfig: block_count - nextn_predict_layers, llama.cpp's n_layer())
        return replace(cfg, expert_gating=gating), Fe * cfg.expert_shared_count

    @classmethod
    def moe_layer(cls, gf, cfg: ModelConfig, i: int) -> bool:
        """Whether layer i's FFN is the MoE (else the dense ffn_gate/up/down): past the dense lead."""
        return i >= cfg.leading_dense_blocks

    def ffn(self, h: torch.Tensor, e: Glm4MoeBlock, ctx) -> torch.Tensor:
        """A MoE layer's FFN of the normed input h (T, D) -> (T, D): the routed experts plus the
        shared expert (glm4-moe.cpp: ggml_add(routed_out, shared_out))."""
        c = self.cfg
        routed = ops.moe_ffn(h, e.gate_inp, e.gate_exps, e.up_exps, e.down_exps, c.n_experts_used, self.weights_norm,
                             ctx, gating=c.expert_gating, select_bias=e.exp_probs_b, n_group=c.expert_groups,
                             topk_group=c.expert_groups_used, weights_scale=c.expert_weights_scale)
        if e.gate_shexp is None:
            return routed
        return (routed.float() + self.shared_expert(h, e, ctx).float()).to(h.dtype)

    def _attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """Block i's attention branch (layers.attention_branch); laguna, mimo2 and exaone_moe replace it with
        their own and keep this forward."""
        if self.yarn_rope is None:
            return attention_branch(h, blk, self.cfg, cache, i, step, ctx)
        # YaRN (Solar Open): layers.attention_heads' steps with the YaRN rope, then q * c^2 (mistral3's)
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v),
                                  (blk.attn_q_bias, blk.attn_k_bias, blk.attn_v_bias), ctx)
        q, k = q.view(T, H, Dh), k.view(T, Hkv, Dh)
        if blk.attn_q_norm is not None:
            q, k = head_norm(q, blk.attn_q_norm, c.rms_eps), head_norm(k, blk.attn_k_norm, c.rms_eps)
        q = rope_and_write(cache, i, q, k, v.view(T, Hkv, Dh), step, self.yarn_rope, ctx)
        if self.yarn_q_scale != 1.0:
            q = q * self.yarn_q_scale
        return ops.linear(merge_heads(cache.attend(i, q, step, ctx)), blk.attn_output, None, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd)                 # (T, D) float32
        h = ops.rms_norm(x, self.blocks[0].attn_norm, eps).to(act)
        for i, (blk, e) in enumerate(zip(self.blocks, self.moe)):
            x, h = ops.add_rms_norm(x, self._attention(h, blk, i, cache, step, ctx), blk.ffn_norm, eps, act, ctx)
            f = ffn_branch(h, blk, ctx) if e is None else self.ffn(h, e, ctx)      # (T, D)
            if i + 1 < len(self.blocks):
                x, h = ops.add_rms_norm(x, f, self.blocks[i + 1].attn_norm, eps, act, ctx)
        x, f = step.rows(x), step.rows(f)                          # (R, D)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)      # (R, V)
