"""Cohere Command-R / Command-R+ (and Aya-23, Aya-Expanse): the GGUF arch `command-r`.

    x_0 = E[tokens]                                          token_embd (V, D), the lm head too
    for each layer l:
        h = LN(x; attn_norm)                                  LN: LayerNorm without bias
        a = W_o attn(rope(qn(W_q h)), rope(kn(W_k h)), W_v h)   qn, kn: per-head LayerNorms (R+), or none
        f = W_down(silu(W_gate h) * W_up h)
        x = x + f + a                                        attention and MLP in parallel, one norm
    logits = logit_scale * (W_E LN(x; output_norm))

Each rule and its source (llama.cpp src/models/command-r.cpp; HF modeling_cohere):
- One LayerNorm per layer feeds both branches, whose outputs are added to the residual together
  (command-r.cpp graph: ffn_inp = the attn_norm output, cur = ffn + inpL + attn_out; HF
  CohereDecoderLayer: residual + hidden_states_attention + hidden_states_mlp). No ffn_norm tensor.
- The norms are LayerNorms without bias: mean-centred, variance over the row, times the weight
  (build_norm LLM_NORM with a NULL bias; HF CohereLayerNorm, bias=False), eps from
  `command-r.attention.layer_norm_epsilon` (load_arch_hparams: LLM_KV_ATTENTION_LAYERNORM_EPS).
- q/k norms (Command-R+): blk.N.attn_q_norm (Dh, H) / attn_k_norm (Dh, Hkv) in ggml order, a
  LayerNorm over each head with that head's own weight, before rope (command-r.cpp: build_norm
  LLM_NORM on Qcur/Kcur shaped (Dh, H, T); HF CohereAttention q_norm = CohereLayerNorm((H, Dh))).
  llama.cpp loads them when n_layer >= 64 (load_arch_tensors: Command-R+ has 64 layers) and the
  graph applies them when loaded; here they are taken when blk.0 has them, and required for 64
  layers or more -- the same for every released file, and tiny test files with q/k norms run too.
- RoPE NORM, adjacent pairs (llama_model_rope_type: LLM_ARCH_COMMAND_R -> NORM; the converter
  (conversion/command_r.py CommandR2Model) does not permute q/k because HF's Cohere rotate_half
  interleaves: CohereRotaryEmbedding repeat_interleave). Attention scale 1/sqrt(head_dim).
- The lm head is the embedding (load_arch_tensors: output = token_embd, TENSOR_DUPLICATED); a
  file with `output.weight` is refused by name, as llama.cpp's loader would not use it.
- logits * `command-r.logit_scale` when the key is there and nonzero (optional: load_arch_hparams
  get_key(..., false); graph: `if (f_logit_scale) ggml_scale`); HF CohereForCausalLM multiplies by
  config.logit_scale.
- SwiGLU MLP (LLM_FFN_SILU, LLM_FFN_PAR), no biases.
"""

from __future__ import annotations

import math

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, attention_heads, ffn_branch, merge_heads, rope_write_attend
from minfer.models.llama import LlamaModel
from minfer.weights import QWeight, load_qweight, load_vector

QK_NORM_LAYERS = 64       # llama_model_command_r::load_arch_tensors: q/k norms when n_layer >= 64


def logit_scale(gf, arch: str, required: bool) -> float:
    """`{arch}.logit_scale`: its value, or 1.0 when absent or 0 (llama.cpp skips a zero scale);
    MinferError naming the key when required and absent, or not a finite number."""
    key = f"{arch}.logit_scale"
    if key not in gf.metadata:
        if required:
            raise MinferError(f"{gf.path}: metadata key '{key}' is missing (needed to build the {arch} model)")
        return 1.0
    v = gf.metadata[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise MinferError(f"{gf.path}: metadata key '{key}' is {v!r}, expected a finite number")
    return float(v) or 1.0


class CommandRModel(LlamaModel):
    """Llama's weights without ffn_norm (Block.ffn_norm None); the forward is the parallel block.
    Per layer: use_rope[i] (all True here; cohere2 rotates its window layers only) and the window
    (0: none)."""

    arch = "command-r"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_COMMAND_R -> NORM
    norm_eps_key = "attention.layer_norm_epsilon"
    logit_scale_required = False
    qk_norm_layers = QK_NORM_LAYERS   # q/k norms: taken when present, required from this many layers (0: never)

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "CommandRModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        for name, why in (("output.weight", f"the {cfg.arch} lm head is the embedding (llama.cpp's loader "
                                            "refuses a file with this unused tensor)"),
                          ("blk.0.attn_qkv.weight", "a fused q/k/v matrix is not supported")):
            if name in gf.tensors:
                raise MinferError(f"{gf.path}: tensor '{name}': {why}")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.logit_scale = logit_scale(gf, cfg.arch, cls.logit_scale_required)
        cls.attention_layout(m, gf)
        return m

    @classmethod
    def attention_layout(cls, m, gf) -> None:
        """m.use_rope, m.is_local (per layer) and m.window: every layer rotates, none has a window."""
        m.use_rope = (True,) * m.cfg.n_layers
        m.is_local = (False,) * m.cfg.n_layers
        m.window = 0

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        p, D, F, Dh = f"blk.{i}.", cfg.d_model, cfg.ffn, cfg.head_dim
        H, Hkv = cfg.n_heads, cfg.n_kv_heads

        def w(name, shape) -> QWeight:
            return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

        blk = Block(attn_norm=load_vector(gf, p + "attn_norm.weight", device, D),
                    attn_q=w("attn_q", (H * Dh, D)), attn_k=w("attn_k", (Hkv * Dh, D)),
                    attn_v=w("attn_v", (Hkv * Dh, D)), attn_output=w("attn_output", (D, H * Dh)),
                    ffn_norm=None, ffn_gate=w("ffn_gate", (F, D)), ffn_up=w("ffn_up", (F, D)),
                    ffn_down=w("ffn_down", (D, F)))
        if cls.qk_norm_layers and ("blk.0.attn_q_norm.weight" in gf.tensors or cfg.n_layers >= cls.qk_norm_layers):
            # (H, Dh): one LayerNorm weight per head (ggml shape (Dh, H))
            blk.attn_q_norm = load_vector(gf, p + "attn_q_norm.weight", device, H * Dh).view(H, Dh)
            blk.attn_k_norm = load_vector(gf, p + "attn_k_norm.weight", device, Hkv * Dh).view(Hkv, Dh)
        return blk

    def _attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """(T, D) normed input -> W_o attn(...) (T, D) in h's dtype: q/k norms, rope where use_rope[i],
        the window where is_local[i]."""
        c = self.cfg
        window = self.window if self.is_local[i] else 0
        if blk.attn_q_norm is None and self.use_rope[i] and not window:
            # the llama attention (layers.attention_heads: the fused decode paths on CUDA)
            return ops.linear(attention_heads(h, blk, c, cache, i, step, ctx), blk.attn_output, None, ctx)
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        if blk.attn_q_norm is not None:
            q = ops.layer_norm(q.reshape(T * H, Dh), blk.attn_q_norm, c.rms_eps)
            k = ops.layer_norm(k.reshape(T * Hkv, Dh), blk.attn_k_norm, c.rms_eps)
        q, k, v = q.reshape(T, H, Dh), k.reshape(T, Hkv, Dh), v.reshape(T, Hkv, Dh)
        o = rope_write_attend(cache, i, q, k, v, step, c.rope if self.use_rope[i] else None, ctx,
                              window=window)                                   # (T, H, Dh)
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, last = self.act_dtype, self.cfg.rms_eps, len(self.blocks) - 1
        x = ops.embedding(tokens, self.token_embd)                           # (T, D) float32
        for i, blk in enumerate(self.blocks):
            h = ops.layer_norm(x, blk.attn_norm, eps, act)                   # (T, D) act
            a = self._attention(h, blk, i, cache, step, ctx)
            if i == last:     # command-r.cpp: the last layer's MLP and adds on the output rows only
                x, h, a = step.rows(x), step.rows(h), step.rows(a)
            x = (ffn_branch(h, blk, ctx).float() + x) + a.float()           # command-r.cpp: (ffn + inpL) + attn
        h = ops.layer_norm(x, self.output_norm, eps, act)                   # (R, D)
        logits = self.head(h, ctx)       # (R, V)
        return logits * self.logit_scale if self.logit_scale != 1.0 else logits
