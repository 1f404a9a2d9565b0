"""SmallThinker (PowerInfer SmallThinker-4BA0.6B, SmallThinker-21BA3B; HF SmallThinkerForCausalLM, remote code): the
GGUF arch `smallthinker`.

    x_0 = E[tokens]                                          token_embd (V, D); output, or tied (the releases)
    for each layer l:
        r = x                                                the router's input: the layer's INPUT
        x = x + W_o attn_l(p_l(W_q n(x)), p_l(W_k n(x)), W_v n(x))          n = RMSNorm(attn_norm)
        x = x + sum_k w_k W_down[e_k](relu(W_gate[e_k] n'(x)) * W_up[e_k] n'(x))   n' = RMSNorm(ffn_norm)
            l_r = W_router r; e = the top-k of g(l_r); w = g(l_r)[e] / sum(g(l_r)[e])
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/smallthinker.cpp, conversion/smallthinker.py; HF
modeling_smallthinker.py of the releases):
- Pre-attention routing: the router multiplies the layer's input inpL, before attn_norm and the attention
  (smallthinker.cpp: probs = build_lora_mm(ffn_gate_inp, inpL), handed to build_moe_ffn as probs_in; HF
  SmallThinkerDecoderLayer: router_input = hidden_states before input_layernorm). The experts read the
  ffn_norm'ed residual as usual. ops.moe_ffn's router_in.
- Gating: `expert_gating_func` (the converter always writes it: moe_primary_router_apply_softmax -> softmax (1),
  else sigmoid (2)); softmax or sigmoid over all experts, the top `expert_used_count`, their weights always
  renormalized (build_moe_ffn(..., norm_w = true, ...); HF: softmax over the top-k logits, or sigmoid of them
  divided by their sum: the same weights). A file without the key is refused (llama.cpp's default gating NONE
  has no graph). expert_weights_scale is never read by the loader (0: none): a file's other value is refused.
- Experts: ReGLU relu(gate) * up (build_moe_ffn LLM_FFN_RELU with a gate: ggml_reglu_split; HF
  SmallThinkerExpert: up(x) * relu(gate(x))), width `expert_feed_forward_length` (one value; llama.cpp reads
  get_key_or_arr, minfer takes a per-layer array only when all equal). No shared expert, no dense layer.
- Window and NoPE: only when the file has `attention.sliding_window` > 0 (the converter writes it when any
  sliding_window_layout entry is set). Then llama.cpp FIXES n_swa = 4096 whatever the key says (load_arch_hparams:
  hparams.n_swa = 4096), the SWA layers are il % 4 != 0 (load_swa_pattern(ml, 4, true): dense first, unless the
  file carries `attention.sliding_window_pattern`), and the layers il % 4 == 0 attend WITHOUT rope
  (n_no_rope_layer_step keeps its default 4: use_rope = il % 4 != 0; SmallThinker-21BA3B's rope_layout and
  sliding_window_layout are that pattern). The SWA layers rotate with `rope.freq_base_swa` when the file has it
  (get_rope_freq_base), else the file's base. STANDARD window: a query at p sees keys p - 4096 < j <= p.
  Without the key (SmallThinker-4BA0.6B): every layer global, every layer rotated (n_no_rope_layer_step =
  n_layer). minfer follows llama.cpp's fixed 4096 (the released configs' sliding_window_size is 4096 too).
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_SMALLTHINKER -> NEOX; the converter does not permute q/k, HF's
  rotate_half) over the whole head (the graph asserts n_rot == head size), scale 1/sqrt(head_dim), no biases.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, merge_heads, refuse_expert_weights_scale, rope_write_attend
from minfer.models.qwen3moe import MoeBlock, Qwen3MoeModel

N_SWA = 4096              # smallthinker.cpp load_arch_hparams: hparams.n_swa = 4096 when the file has a window
PATTERN = 4               # load_swa_pattern(ml, 4, true) and n_no_rope_layer_step's default (llama-hparams.h)
EXPERT_ACT = "reglu"      # build_moe_ffn(..., LLM_FFN_RELU, ...) with gate experts


def layer_kinds(gf, cfg: ModelConfig) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """(is_local, use_rope) per layer, llama.cpp's rules (module docstring)."""
    a, n, md = cfg.arch, cfg.n_layers, gf.metadata
    if cfg.sliding_window <= 0:
        return (False,) * n, (True,) * n
    pat = md.get(f"{a}.attention.sliding_window_pattern")
    if isinstance(pat, list):
        if len(pat) < n:
            raise MinferError(f"{gf.path}: metadata key '{a}.attention.sliding_window_pattern' has {len(pat)} "
                              f"entries, expected one per layer ({n})")
        is_local = tuple(bool(v) for v in pat[:n])
    else:
        step = PATTERN if pat is None else int(pat)           # set_swa_pattern(n_pattern, dense_first = true)
        is_local = tuple(step == 0 or i % step != 0 for i in range(n))
    return is_local, tuple(i % PATTERN != 0 for i in range(n))


class SmallThinkerModel(Qwen3MoeModel):
    """Qwen3-MoE's loader (attention blocks without q/k norms or biases, the stacked experts, the router); the
    forward keeps each layer's input for its router."""

    arch = "smallthinker"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_SMALLTHINKER -> NEOX
    qk_norm = False
    qkv_bias = False
    weights_norm = True       # smallthinker.cpp: build_moe_ffn(..., LLM_FFN_RELU, true, ...)
    expert_gatings = ("softmax", "sigmoid")
    expert_keys = ("expert_count", "expert_used_count", "expert_feed_forward_length", "expert_gating_func")

    @classmethod
    def expert_width(cls, cfg: ModelConfig) -> int:
        return cfg.expert_ffn

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "SmallThinkerModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        a = cfg.arch
        refuse_expert_weights_scale(gf, a)
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {a}.rope.dimension_count={cfg.rope.n_rot}, expected the head size "
                              f"{cfg.head_dim} (smallthinker.cpp asserts n_rot == head size)")
        is_local, use_rope = layer_kinds(gf, cfg)
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.weights_norm = True     # the graph passes norm_w = true; the loader reads no expert_weights_norm
        m.is_local, m.use_rope = is_local, use_rope
        m.window = N_SWA if cfg.sliding_window > 0 else 0
        # the window layers' rope: the file's, with rope.freq_base_swa as its base when present (load_arch_hparams:
        # rope_freq_scale_train_swa = rope_freq_scale_train; the converter writes no freq_base_swa)
        m.rope_swa = (replace(cfg.rope, theta=cfg.rope_swa.theta) if f"{a}.rope.freq_base_swa" in gf.metadata
                      else cfg.rope)
        return m

    def attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """Layer i's attention of the normed input h (T, D) -> (T, D): rope where use_rope[i] (the SWA base on a
        window layer), the 4096 window where is_local[i]."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        local = self.is_local[i]
        rope = (self.rope_swa if local else c.rope) if self.use_rope[i] else None
        o = rope_write_attend(cache, i, q.view(T, H, Dh), k.view(T, Hkv, Dh), v.view(T, Hkv, Dh), step, rope, ctx,
                              window=self.window if local else 0)
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)

    def ffn_routed(self, h: torch.Tensor, r: torch.Tensor, e: MoeBlock, ctx) -> torch.Tensor:
        """The MoE of the normed h (T, D), routed by the layer input r (T, D) -> (T, D)."""
        return ops.moe_ffn(h, e.gate_inp, e.gate_exps, e.up_exps, e.down_exps, self.cfg.n_experts_used, True, ctx,
                           gating=self.cfg.expert_gating, act=EXPERT_ACT, router_in=r)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd)                 # (T, D) float32
        h = ops.rms_norm(x, self.blocks[0].attn_norm, eps).to(act)
        for i, (blk, e) in enumerate(zip(self.blocks, self.moe)):
            r = x                                                  # the layer's input routes its tokens
            x, h = ops.add_rms_norm(x, self.attention(h, blk, i, cache, step, ctx), blk.ffn_norm, eps, act, ctx)
            f = self.ffn_routed(h, r, e, ctx)                      # (T, D)
            if i + 1 < len(self.blocks):
                x, h = ops.add_rms_norm(x, f, self.blocks[i + 1].attn_norm, eps, act, ctx)
        x, f = step.rows(x), step.rows(f)                          # (R, D)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)      # (R, V)
