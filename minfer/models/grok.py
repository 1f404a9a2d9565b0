"""xAI Grok-1 and Grok-2 (HF Grok1ForCausalLM / GrokForCausalLM, remote code): the GGUF arch `grok`.

    x_0 = E[tokens] * es                                             token_embd (V, D); output (V, D), or tied
    for each layer l:
        s = cap_a * tanh((q . k) * as / cap_a)      q, k: rope(W_q n(x)), rope(W_k n(x)); no 1/sqrt(Dh)
        x = x + pa(W_o softmax(s) v)                n = RMSNorm(attn_norm), pa = RMSNorm(attn_output_norm)
        h = n'(x)                                                       n' = RMSNorm(ffn_norm)
        f = moe(h)                                                      GELU experts, top-K renormalized
        f = (f + W_down(gelu(W_gate h) * W_up h)) * sqrt(2)/2           only with a dense MLP (Grok-2)
        x = x + pf(f)                                                   pf = RMSNorm(layer_output_norm | post_ffw_norm)
    logits = (W_out RMSNorm(x; output_norm)) * ls, then cap_f * tanh(logits / cap_f) when cap_f > 0

Each rule and its source (llama.cpp src/models/grok.cpp: load_arch_hparams, load_arch_tensors, the graph;
src/llama-graph.cpp build_inp_embd, build_attn_mha, build_moe_ffn; conversion/grok.py GrokModel):
- The multipliers and their keys, each optional with the default load_arch_hparams sets "for old GGUFs":
  es `grok.embedding_scale` (78.38367176906169; 0 means none: build_inp_embd scales only when != 0), as
  `grok.attention.output_scale` (0.08838834764831845), cap_a `grok.attn_logit_softcapping` (30), ls
  `grok.logit_scale` (0.5773502691896257), cap_f `grok.final_logit_softcapping` (0: none; Grok-2's). The converter
  writes them from HF's embedding_multiplier_scale, attn_output_multiplier (default head_dim**-0.5),
  attn_logit_softcapping (default 30), output_multiplier_scale, final_logit_softcapping.
- Attention scores: build_attn_mha's LLM_ARCH_GROK branch: kq -> cap_a * tanh(kq * as / cap_a) before the mask and a
  softmax of scale 1 (grok.cpp passes kq_scale 1.0). Here q is pre-scaled by as * sqrt(Dh) so the attention's own
  1/sqrt(Dh) gives the same scores, and the cache soft-caps them (cache.attend softcap). llama.cpp forces flash
  attention off for grok (llama-context.cpp) so that branch always runs.
- RoPE NEOX over the whole head (llama_model_rope_type: LLM_ARCH_GROK -> NEOX; the graph asserts n_rot == head size;
  the converter permutes nothing). attn_q and attn_output are {n_embd, n_embd}: H * Dh must be the embedding length.
  YaRN (Grok-2's rope_type "original", which the converter writes as yarn): the per-frequency ramp of
  gpt_oss.yarn_rope(truncate=True) (ggml_rope_yarn_corr_dims floors / ceils) with beta_fast defaulting to 8
  (grok's load_arch_hparams) and beta_slow to 1; cos/sin times 1 + 0.1 ln(factor) (llama-context.cpp resets
  yarn_attn_factor to cancel ggml's own factor, then times rope.scaling.attn_factor), i.e. q times that squared.
  A yarn_ext_factor other than 1 is refused by name (ggml would scale the ramp).
- Norms: RMSNorm pre-norms and two post-norms applied to each branch output before its residual add
  (attn_output_norm after W_o; layer_output_norm (Grok-1, HF rms_norm_3) or, when absent, post_ffw_norm (Grok-2,
  post_moe_norm) after the FFN), eps `grok.attention.layer_norm_rms_epsilon` (required).
- The MoE: build_moe_ffn(..., LLM_FFN_GELU, norm_w = true, expert_weights_scale, SOFTMAX): p = softmax(W_r h) over
  `expert_count`, the top `expert_used_count`, their weights divided by their sum, each expert
  W_down_e(gelu_tanh(W_gate_e h) * W_up_e h) (ggml's GELU: the tanh form). The experts' width is
  `grok.expert_feed_forward_length` when present (Grok-2's moe_intermediate_size), else `grok.feed_forward_length`
  (Grok-1: n_ff_exp == n_ff). grok reads neither expert_weights_norm nor expert_gating_func nor expert_weights_scale
  (hparams keeps 0: no scaling): a file's values are ignored here too. `grok.router_logit_softcapping` is read by
  llama.cpp but applied nowhere: ignored here too. (The released remote code differs: no renormalization in
  Grok-1's, a router soft-cap in Grok-2's; minfer follows llama.cpp, whose files it runs.)
- Grok-2's dense MLP: when blk.N.ffn_up is present, a GELU MLP of `grok.feed_forward_length` (ffn_gate, ffn_up,
  ffn_down: build_ffn(LLM_FFN_GELU, LLM_FFN_PAR)) beside the MoE, the sum times sqrt(2)/2. Only the whole triple is
  taken (the converter writes all three or none); a partial one is refused by name.
- `grok.attention.temperature_length` (Grok-2's attn_temperature_len) is read by llama.cpp but no graph uses it:
  ignored here too.
- output.weight, or token_embd when the file has none (TENSOR_NOT_REQUIRED, then TENSOR_DUPLICATED).
- Refused by name: a fused attn_qkv and q/k/v / output biases (create_tensor_qkv would take them; the converter
  never writes them for grok), ungated experts (ffn_gate_exps is TENSOR_NOT_REQUIRED but always written), any other
  tensor the loader does not create, expert_count 0 (load_arch_tensors throws).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, merge_heads, rope_and_write
from minfer.models.qwen3moe import Qwen3MoeModel
from minfer.weights import load_qweight, load_vector

# llama.cpp llama_model_grok::load_arch_hparams: "defaults for old GGUFs"
DEFAULT_EMBEDDING_SCALE = 78.38367176906169
DEFAULT_ATTN_OUT_SCALE = 0.08838834764831845
DEFAULT_ATTN_SOFTCAP = 30.0
DEFAULT_LOGIT_SCALE = 0.5773502691896257
DEFAULT_YARN_BETA_FAST = 8.0
DEFAULT_YARN_BETA_SLOW = 1.0          # llama-hparams.h yarn_beta_slow

_LAYER = {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
          "attn_output_norm.weight", "ffn_norm.weight", "ffn_gate_inp.weight", "ffn_gate_exps.weight",
          "ffn_up_exps.weight", "ffn_down_exps.weight", "layer_output_norm.weight", "post_ffw_norm.weight",
          "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"}
_DENSE = ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")


def _scale(gf, key: str, default: float, positive: bool = False) -> float:
    v = float(gf.metadata.get(key, default))
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        kind = "positive" if positive else "non-negative"
        raise MinferError(f"{gf.path}: metadata key '{key}' is {v}, expected a {kind} finite number")
    return v


def check_tensors(gf, cfg: ModelConfig) -> None:
    """Refuse, by name, a tensor llama.cpp's grok loader would not create, and a partial dense MLP (module doc)."""
    for name in gf.tensors:
        if name in ("token_embd.weight", "output_norm.weight", "output.weight"):
            continue
        parts = name.split(".", 2)
        ok = len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < cfg.n_layers \
            and parts[2] in _LAYER
        if not ok:
            why = ("a fused q/k/v or a bias: the grok converter writes attn_q/attn_k/attn_v without biases"
                   if name.endswith(".bias") or "attn_qkv" in name else "llama.cpp's grok loader does not create it")
            raise MinferError(f"{gf.path}: tensor '{name}' is not supported for grok ({why})")
    for i in range(cfg.n_layers):
        have = [f"blk.{i}.{t}" in gf.tensors for t in _DENSE]
        if any(have) and not all(have):
            missing = next(f"blk.{i}.{t}" for t, h in zip(_DENSE, have) if not h)
            raise MinferError(f"{gf.path}: tensor '{missing}' is missing: grok's dense MLP (Grok-2) needs ffn_gate, "
                              "ffn_up and ffn_down together")


def grok_yarn(gf, cfg: ModelConfig):
    """(rope, q factor) for a yarn file: YaRN's divisors and mscale^2 (module doc), or (cfg.rope, 1.0)."""
    from minfer.models.gpt_oss import yarn_rope

    md, a = gf.metadata, "grok"
    if md.get(f"{a}.rope.scaling.type", "none") != "yarn":
        return cfg.rope, 1.0
    ext = float(md.get(f"{a}.rope.scaling.yarn_ext_factor", 1.0))
    if ext != 1.0:
        raise MinferError(f"{gf.path}: metadata key '{a}.rope.scaling.yarn_ext_factor' is {ext}, which is not "
                          "supported (only 1.0, YaRN's full ramp)")
    # grok's own defaults for the betas (load_arch_hparams), which yarn_rope's defaults are not
    shim = SimpleNamespace(path=gf.path, metadata={f"{a}.rope.scaling.yarn_beta_fast": DEFAULT_YARN_BETA_FAST,
                                                   f"{a}.rope.scaling.yarn_beta_slow": DEFAULT_YARN_BETA_SLOW, **md})
    rope, mscale = yarn_rope(shim, a, cfg.rope, cfg.rope_attn_factor, truncate=True)
    return rope, mscale * mscale


class GrokModel(Qwen3MoeModel):
    arch = "grok"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_GROK -> NEOX
    qk_norm = False
    qkv_bias = False
    weights_norm = True       # grok.cpp: build_moe_ffn(..., LLM_FFN_GELU, true, ...)
    expert_keys = ("expert_count", "expert_used_count")   # expert_feed_forward_length optional (Grok-1: n_ff)
    dense_moe_scale = math.sqrt(2.0) / 2    # grok.cpp: ggml_scale(ffn_out + moe_out, std::sqrt(2) / 2)

    @classmethod
    def expert_width(cls, cfg: ModelConfig) -> int:
        return cfg.expert_ffn or cfg.ffn   # load_arch_tensors: n_ff_exp ? n_ff_exp : n_ff

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "GrokModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        a, D = cls.arch, cfg.d_model
        if cfg.n_experts <= 0:
            raise MinferError(f"{gf.path}: {a}.expert_count={cfg.n_experts}: grok cannot have zero experts "
                              "(llama.cpp's grok loader refuses it)")
        if cfg.rope.n_rot != cfg.head_dim or cfg.n_heads * cfg.head_dim != D:
            raise MinferError(f"{gf.path}: {a}.rope.dimension_count={cfg.rope.n_rot}, head size {cfg.head_dim}, "
                              f"head_count {cfg.n_heads}, embedding_length {D}: grok rotates the whole head "
                              "(n_rot == head size) and its attn_q / attn_output are n_embd x n_embd")
        check_tensors(gf, cfg)
        es = _scale(gf, f"{a}.embedding_scale", DEFAULT_EMBEDDING_SCALE)
        attn_scale = _scale(gf, f"{a}.attention.output_scale", DEFAULT_ATTN_OUT_SCALE)
        attn_cap = _scale(gf, f"{a}.attn_logit_softcapping", DEFAULT_ATTN_SOFTCAP, positive=True)
        logit_scale = _scale(gf, f"{a}.logit_scale", DEFAULT_LOGIT_SCALE, positive=True)
        final_cap = _scale(gf, f"{a}.final_logit_softcapping", 0.0)
        rope, yarn_q = grok_yarn(gf, cfg)
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.weights_norm = True     # the graph's norm_w is fixed: a file's expert_weights_norm is not read
        F = cfg.ffn
        m.attn_out_norm, m.post_ffn_norm = [], []
        for i, blk in enumerate(m.blocks):
            p = f"blk.{i}."
            m.attn_out_norm.append(load_vector(gf, p + "attn_output_norm.weight", device, D))
            post = p + "layer_output_norm.weight"
            if post not in gf.tensors:     # load_arch_tensors: LAYER_OUT_NORM, else FFN_POST_NORM (required)
                post = p + "post_ffw_norm.weight"
            m.post_ffn_norm.append(load_vector(gf, post, device, D))
            if p + "ffn_up.weight" in gf.tensors:
                blk.ffn_gate = load_qweight(gf, p + "ffn_gate.weight", device, (F, D), dtype=dtype)
                blk.ffn_up = load_qweight(gf, p + "ffn_up.weight", device, (F, D), dtype=dtype)
                blk.ffn_down = load_qweight(gf, p + "ffn_down.weight", device, (D, F), dtype=dtype)
        m.rope = rope
        m.embed_scale = es if es != 0 else 1.0
        m.q_scale = attn_scale * math.sqrt(cfg.head_dim) * yarn_q
        m.attn_softcap, m.logit_scale, m.final_softcap = attn_cap, logit_scale, final_cap
        return m

    def attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """(T, D) normed input -> W_o attn(...) (T, D) with grok's scaled, soft-capped scores."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        q = rope_and_write(cache, i, q.view(T, H, Dh), k.view(T, Hkv, Dh), v.view(T, Hkv, Dh), step, self.rope, ctx)
        o = cache.attend(i, q * self.q_scale, step, ctx, softcap=self.attn_softcap)      # (T, H, Dh)
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)

    def ffn(self, h: torch.Tensor, e, ctx) -> torch.Tensor:
        return ops.moe_ffn(h, e.gate_inp, e.gate_exps, e.up_exps, e.down_exps, self.cfg.n_experts_used,
                           self.weights_norm, ctx, act="geglu")

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd)                         # (T, D) float32
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        for i, (blk, e) in enumerate(zip(self.blocks, self.moe)):
            h = ops.rms_norm(x, blk.attn_norm, eps).to(act)
            a = ops.rms_norm(self.attention(h, blk, i, cache, step, ctx).float(), self.attn_out_norm[i], eps)
            x, h = ops.add_rms_norm(x, a, blk.ffn_norm, eps, act, ctx)
            f = self.ffn(h, e, ctx).float()                                # (T, D)
            if blk.ffn_up is not None:                                     # Grok-2: the dense MLP beside the MoE
                dense = ops.linear(ops.geglu(ops.linear(h, blk.ffn_gate, None, ctx),
                                             ops.linear(h, blk.ffn_up, None, ctx)), blk.ffn_down, None, ctx)
                f = (f + dense.float()) * self.dense_moe_scale
            x = x + ops.rms_norm(f, self.post_ffn_norm[i], eps)
        h = ops.rms_norm(step.rows(x), self.output_norm, eps).to(act)      # (R, D)
        logits = self.head(h, ctx) * self.logit_scale                      # (R, V)
        cap = self.final_softcap
        if cap:
            logits = cap * torch.tanh(logits / cap)
        return logits
