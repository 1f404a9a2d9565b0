"""gpt-oss (OpenAI's gpt-oss-20b / -120b): the GGUF arch `gpt-oss` (llama.cpp LLM_ARCH_OPENAI_MOE).

    x_0 = E[tokens]                                                     token_embd (V, D)
    for each layer l:
        q, k, v = W_q n(x) + b_q, W_k n(x) + b_k, W_v n(x) + b_v        n  = RMSNorm(attn_norm)
        a = W_o attn_l(rope(q), rope(k), v; sinks_l) + b_o
        x = x + a
        x = x + moe(n'(x))                                              n' = RMSNorm(post_attention_norm)
    logits = W_out RMSNorm(x; output_norm)                              output (V, D), untied

Each rule and its source (llama.cpp src/models/openai-moe.cpp, conversion/gpt_oss.py; HF
transformers models/gpt_oss/modeling_gpt_oss.py):
- Attention sinks: one learned logit per query head, `blk.N.attn_sinks.weight` (H,), added to
  each softmax's denominator and given no value: p_j = exp(s_j) / (exp(sink) + sum_i exp(s_i)),
  s the scaled scores 1/sqrt(Dh) q.k (llama-graph.cpp build_attn_mha ggml_soft_max_add_sinks;
  HF eager_attention_forward concatenates the sink column to the scaled scores and drops it).
- Biases on q, k, v and o (attn_{q,k,v,output}.bias; HF attention_bias=True).
- Sliding window on alternating layers: load_swa_pattern(ml, 2), LLAMA_SWA_TYPE_STANDARD ->
  layer l local when l % 2 == 0 (HF layer_types: 'sliding_attention' when (i + 1) % 2), window
  `gpt-oss.attention.sliding_window` (required: openai-moe.cpp get_key without a default). A
  `sliding_window_pattern` key, when present, overrides the pattern (load_swa_pattern). The local
  layers' rope base is `rope.freq_base_swa`, default the global base (load_arch_hparams).
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_OPENAI_MOE; HF _apply_rotary_emb splits halves;
  the converter does not permute q/k).
- The FFN norm is `post_attention_norm` (LLM_TENSOR_ATTN_POST_NORM: HF post_attention_layernorm
  is the pre-MLP norm here, not a norm of the attention's output).
- MoE (build_moe_ffn with LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT, norm_w false; HF
  GptOssTopKRouter): logits = W_r h + b_r (ffn_gate_inp weight and bias), the K largest kept,
  their weights softmax over those K logits only (not over all experts, and no renormalisation).
- Experts: g = W_gate[e] h + b_gate[e], u = W_up[e] h + b_up[e] (ffn_{gate,up}_exps weight and
  bias; HF's interleaved gate_up_proj split [::2] / [1::2] by the converter),
  y = W_down[e] swiglu_oai(g, u) + b_down[e], where (ggml_compute_forward_swiglu_oai_f32; HF
  GptOssExperts._apply_gate)
      g' = min(g, limit), u' = clamp(u, -limit, limit), swiglu_oai = g' * sigmoid(alpha g') * (u' + 1)
  with alpha 1.702 and limit 7.0: constants in llama.cpp (build_moe_ffn LLM_FFN_SWIGLU_OAI_MOE),
  not in the GGUF.
- YaRN rope scaling (the released files: rope.scaling.type yarn, factor 32, original context
  4096, beta_fast 32, beta_slow 1). Written as rope frequency divisors plus a score scale
  (yarn_rope below): per rotated pair i, with r_i = clamp((i - lo) / (hi - lo), 0, 1) and
  lo, hi = the correction dims of beta_fast, beta_slow,
      inv_freq_i = theta^(-2i/n) * ((1 - r_i) + r_i / factor)
  and cos/sin both times mscale = (1 + 0.1 ln factor) * rope.scaling.attn_factor, i.e. the scores
  times mscale^2 (ggml rope_yarn, llama-context.cpp yarn_attn_factor; HF _compute_yarn_parameters).
  lo and hi are NOT rounded: HF gpt-oss sets truncate=False (OpenAI's reference); llama.cpp's
  ggml_rope_yarn_corr_dims floors/ceils them (a small difference from this file). minfer/config.py
  lets yarn through for this architecture only (config.YARN_ARCHITECTURES, freq_scale 1).
- CUDA: the attention carries the sinks (the decode kernel's SINK variant, T > 1 in torch:
  tests/ops/test_sinks_attention_interpreted.py) and the MoE is ops.moe_ffn with its gpt-oss
  options (router bias, gating "topk_softmax", expert biases, act "swiglu_oai": ops/cuda/moe.py,
  moe_act.py), with no host value, so the engine's decode CUDA graph can capture the step.
  Proven in Triton's interpreter only (tests/ops/test_gpt_oss_interpreted.py), never yet on a
  GPU. The batch engine's paged cache applies the sinks too (runtime/paged_kv.py: the paged decode
  kernel's SINK variant, its WINDOW + SINK variant on the sliding layers), so `minfer serve` batches it (tests/runtime/
  test_paged_sinks.py: batched greedy identical to single-sequence greedy).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.gemma3 import swa_layers
from minfer.models.layers import Block, load_head, merge_heads, rope_and_write
from minfer.models.qwen3moe import Qwen3MoeModel, load_experts
from minfer.ops.reference import swiglu_oai  # noqa: F401  (the expert activation, by name for the tests)
from minfer.weights import QWeight, load_qweight, load_vector

SWIGLU_ALPHA = 1.702      # llama-graph.cpp build_moe_ffn, LLM_FFN_SWIGLU_OAI_MOE (HF swiglu_alpha)
SWIGLU_LIMIT = 7.0        # (HF swiglu_limit)
DEFAULT_SWA_PATTERN = 2   # openai-moe.cpp load_swa_pattern(ml, 2)


def yarn_rope(gf, arch: str, rope, attn_factor: float = 1.0, truncate: bool = False):
    """(rope with YaRN's per-frequency divisors, mscale) from the file's rope.scaling keys."""
    import math

    md = gf.metadata

    def key(suffix, default=None):
        v = md.get(f"{arch}.rope.scaling.{suffix}", default)
        if v is None:
            raise MinferError(f"{gf.path}: metadata key '{arch}.rope.scaling.{suffix}' is missing (YaRN needs it)")
        return float(v)

    factor, orig = key("factor"), key("original_context_length")
    beta_fast, beta_slow = key("yarn_beta_fast", 32.0), key("yarn_beta_slow", 1.0)
    if factor < 1 or orig <= 0:
        raise MinferError(f"{gf.path}: {arch}.rope.scaling.factor={factor}, original_context_length={orig}: "
                          "expected factor >= 1 and a positive context")
    n = rope.n_rot

    def corr_dim(rotations):   # the pair index that turns `rotations` times over the original context
        return n * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    lo, hi = corr_dim(beta_fast), corr_dim(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0.0), min(hi, n - 1.0)
    span = max(hi - lo, 0.001)
    divisors = []
    for i in range(n // 2):
        r = min(1.0, max(0.0, (i - lo) / span))          # 0: extrapolate (as trained), 1: interpolate
        divisors.append(1.0 / ((1.0 - r) + r / factor))
    if rope.freq_factors is not None:
        divisors = [a * b for a, b in zip(divisors, rope.freq_factors)]
    mscale = (1.0 + 0.1 * math.log(factor)) * attn_factor if factor > 1 else attn_factor
    return replace(rope, freq_factors=tuple(divisors)), mscale


@dataclass
class OssMoe:
    """One layer's router and experts, each with its bias."""

    router: torch.Tensor       # (E, D) float32
    router_bias: torch.Tensor  # (E,)
    gate_exps: QWeight         # (E*Fe, D)
    up_exps: QWeight           # (E*Fe, D)
    down_exps: QWeight         # (E*D, Fe)
    gate_bias: torch.Tensor    # (E, Fe)
    up_bias: torch.Tensor      # (E, Fe)
    down_bias: torch.Tensor    # (E, D)


class GptOssModel(Qwen3MoeModel):
    arch = "gpt-oss"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_OPENAI_MOE -> NEOX
    qk_norm = False
    qkv_bias = True
    expert_keys = ("expert_count", "expert_used_count", "expert_feed_forward_length", "attention.sliding_window")

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "GptOssModel":
        from tqdm import tqdm

        cfg = cfg or ModelConfig.from_gguf(gf)
        md = gf.metadata
        for key in cls.expert_keys:
            if f"{cls.arch}.{key}" not in md:
                raise MinferError(f"{gf.path}: metadata key '{cls.arch}.{key}' is missing "
                                  f"(needed to build the {cls.arch} model)")
        V, D, Dh, H, E, Fe = cfg.vocab, cfg.d_model, cfg.head_dim, cfg.n_heads, cfg.n_experts, cfg.expert_ffn
        if E <= 0 or not 0 < cfg.n_experts_used <= E or Fe <= 0:
            raise MinferError(f"{gf.path}: {cls.arch}.expert_count={E}, expert_used_count={cfg.n_experts_used}, "
                              f"expert_feed_forward_length={Fe}: expected 0 < used <= count and a positive length")
        q_out, kv_out = H * Dh, cfg.n_kv_heads * Dh
        bar = tqdm(total=cfg.n_layers + 2, desc=f"loading {gf.path.name}", unit="layer",
                   disable=not progress, leave=False)
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        blocks, moe, o_bias, sinks = [], [], [], []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."

            def w(name, shape):
                return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

            def vec(name, n):
                return load_vector(gf, p + name, device, n)

            blocks.append(Block(
                attn_norm=vec("attn_norm.weight", D),
                attn_q=w("attn_q", (q_out, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
                attn_output=w("attn_output", (D, q_out)),
                ffn_norm=vec("post_attention_norm.weight", D),        # the pre-MLP norm (ATTN_POST_NORM)
                ffn_gate=None, ffn_up=None, ffn_down=None,
                attn_q_bias=vec("attn_q.bias", q_out), attn_k_bias=vec("attn_k.bias", kv_out),
                attn_v_bias=vec("attn_v.bias", kv_out)))
            o_bias.append(vec("attn_output.bias", D))
            sinks.append(vec("attn_sinks.weight", H))                              # (H,)
            moe.append(OssMoe(
                router=vec("ffn_gate_inp.weight", E * D).view(E, D), router_bias=vec("ffn_gate_inp.bias", E),
                gate_exps=load_experts(gf, p + "ffn_gate_exps.weight", device, (E, Fe, D), dtype),
                up_exps=load_experts(gf, p + "ffn_up_exps.weight", device, (E, Fe, D), dtype),
                down_exps=load_experts(gf, p + "ffn_down_exps.weight", device, (E, D, Fe), dtype),
                gate_bias=vec("ffn_gate_exps.bias", E * Fe).view(E, Fe),
                up_bias=vec("ffn_up_exps.bias", E * Fe).view(E, Fe),
                down_bias=vec("ffn_down_exps.bias", E * D).view(E, D)))
            bar.update()
        output_norm, output = load_head(gf, cfg, token_embd, device, dtype)
        bar.update()
        bar.close()
        m = cls(cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.moe, m.attn_output_bias, m.sinks = moe, o_bias, sinks
        m.window = int(md[f"{cls.arch}.attention.sliding_window"])
        pattern = cfg.swa_pattern if cfg.swa_pattern is not None else DEFAULT_SWA_PATTERN
        m.is_local = swa_layers(cfg.n_layers, m.window, pattern)
        rope_swa = replace(cfg.rope, theta=float(md[f"{cls.arch}.rope.freq_base_swa"])) \
            if f"{cls.arch}.rope.freq_base_swa" in md else cfg.rope
        rope, m.q_scale = cfg.rope, 1.0
        if md.get(f"{cls.arch}.rope.scaling.type") == "yarn":   # the same YaRN on every layer (HF, llama.cpp)
            rope, mscale = yarn_rope(gf, cls.arch, cfg.rope, cfg.rope_attn_factor)
            rope_swa = rope if rope_swa is cfg.rope else yarn_rope(gf, cls.arch, rope_swa, cfg.rope_attn_factor)[0]
            m.q_scale = mscale * mscale
        m.layer_rope = [rope_swa if loc else rope for loc in m.is_local]
        return m

    def attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """Layer i's attention of the normed input h (T, D) -> (T, D), o bias included."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v),
                                  (blk.attn_q_bias, blk.attn_k_bias, blk.attn_v_bias), ctx)
        q = rope_and_write(cache, i, q.view(T, H, Dh), k.view(T, Hkv, Dh), v.view(T, Hkv, Dh), step,
                           self.layer_rope[i], ctx)
        if self.q_scale != 1.0:      # YaRN's mscale on cos and sin of both q and k
            q = q * self.q_scale
        o = cache.attend(i, q, step, ctx, window=self.window if self.is_local[i] else 0, sinks=self.sinks[i])
        return ops.linear(merge_heads(o), blk.attn_output, self.attn_output_bias[i], ctx)

    def ffn(self, h: torch.Tensor, e: OssMoe, ctx=None) -> torch.Tensor:
        """The layer's MoE of the normed input h (T, D) -> (T, D): ops.moe_ffn with the router bias,
        the softmax over the top-k logits, the experts' biases and the clamped SwiGLU (the
        reference expert by expert; on CUDA with no host value, so a decode step is capturable).
        The constants are read at call time (tests change SWIGLU_LIMIT)."""
        return ops.moe_ffn(h, e.router, e.gate_exps, e.up_exps, e.down_exps, self.cfg.n_experts_used, False, ctx,
                           router_bias=e.router_bias, gating="topk_softmax", gate_bias=e.gate_bias,
                           up_bias=e.up_bias, down_bias=e.down_bias, act="swiglu_oai", alpha=SWIGLU_ALPHA,
                           limit=SWIGLU_LIMIT)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd)                         # (T, D) float32
        for i, (blk, e) in enumerate(zip(self.blocks, self.moe)):
            h = ops.rms_norm(x, blk.attn_norm, eps).to(act)
            x, h = ops.add_rms_norm(x, self.attention(h, blk, i, cache, step, ctx).float(), blk.ffn_norm, eps, act,
                                    ctx)
            x = x + self.ffn(h, e, ctx).float()
        h = ops.rms_norm(step.rows(x), self.output_norm, eps).to(act)      # (R, D)
        return self.head(h, ctx)          # (R, V)

    def qweights(self) -> list[QWeight]:
        ws = [self.token_embd]
        for b, e in zip(self.blocks, self.moe):
            ws += [b.attn_q, b.attn_k, b.attn_v, b.attn_output, e.gate_exps, e.up_exps, e.down_exps]
        return ws + [self.output]
