"""DeciLM / NVIDIA's NAS-pruned Llamas (Llama-3.1-Nemotron-Nano-8B, -51B, Llama-3.3-Nemotron-Super-49B, DeciLM-7B):
the GGUF arch `deci`, a Llama whose layers differ one from another.

    x_0 = E[tokens]                                         token_embd (V, D); output (V, D), or tied
    for each layer l, by its kind (H_l = head_count[l], Hkv_l = head_count_kv[l], F_l = feed_forward_length[l]):
        attention  (Hkv_l > 0):           x = x + W_o attn(rope(W_q n(x)), rope(W_k n(x)), W_v n(x))   H_l / Hkv_l heads
        linear     (H_l > 0, Hkv_l = 0):  x = x + W_o n(x)                          W_o = attn_output (D, D)
        no attention (H_l = 0):           x unchanged (no attn_norm)
        FFN        (F_l > 0):             x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))    width F_l
        no FFN     (F_l = 0):             x unchanged (no ffn_norm)
    logits = W_out RMSNorm(x; output_norm)                  n = RMSNorm(attn_norm), n' = RMSNorm(ffn_norm)

Each rule and its source (llama.cpp src/models/deci.cpp: load_arch_tensors, the graph; the converter
conversion/deci.py DeciModel; HF modeling_decilm.py DeciLMDecoderLayer, remote code):
- The per-layer arrays: DeciModel.__init__ maps HF block_configs to head_count_kv[l] = H // n_heads_in_group
  (0 for a no-op or a "linear attention" layer), head_count[l] = H (0 for a no-op layer: attention.no_op, no
  replace_with_linear) and feed_forward_length[l] = the DeciLM ffn_mult rounding to a multiple of 256 (0 where
  ffn_mult is null: a no-op FFN). DeciLM-7B's files carry one head_count and a head_count_kv array
  (num_key_value_heads_per_layer); plain scalars read as every layer alike.
- The kinds: the graph's `n_head == 0` (cur = inpL: no norm, no add), `n_head > 0 && n_head_kv == 0` ("linear
  attention" of Nemotron-51B: build_lora_mm(wo, attn_norm(x)), no bias, then the residual add; HF
  DeciLMLinearAttention, one nn.Linear D -> D named self_attn.linear_attn, which the converter maps to attn_output),
  else Llama self-attention: RoPE NORM (llama_model_rope_type: LLM_ARCH_DECI -> NORM; the converter permutes q/k rows
  with each layer's own kv count, DeciModel.permute), rope_freqs (llama3 scaling, DeciModel.generate_extra_tensors),
  kq_scale 1/sqrt(head size) (deci.cpp: attention.scale when written, which the converter never does: refused
  here otherwise), GQA with that layer's kv heads.
- n_ff == 0: the graph `continue`s before `inpL = cur`, so the layer's output is its input. That equals HF (no-op
  FFN: nothing added) only when the layer's attention is a no-op too (Nemotron-Ultra's "dummy" layers, the converter's
  comment); for a layer with attention (or linear attention) and no FFN, llama.cpp drops the attention's output where
  HF adds it (tools/gen_deci_fixture.py measured it: llama.cpp's logits of such a variant equal the layer skipped
  whole; with the last layer so, llama.cpp aborts). minfer refuses such a file by name rather than pick one; the
  converter's own comment describes Nemotron-Ultra's FFN-free layers as attention-free too ("dummy layer").
- The FFN: SwiGLU (build_ffn LLM_FFN_SILU, LLM_FFN_PAR) of the layer's own width.
- Refused by name: bias tensors (optional in load_arch_tensors, absent from the released models: HF attention_bias /
  mlp_bias false), ffn_gate_inp (the graph's MoE branch, which no deci converter writes), attention.scale.

The cache: each attention layer keeps (Hkv_l, Dh, Dh) rows, the others none (gemma4.with_kv_layers: the per-layer
geometry of runtime/kv_cache.py and the paged cache).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.gemma4 import with_kv_layers
from minfer.models.granite import refuse_biases
from minfer.models.layers import Block, attention_heads, ffn_branch, load_head
from minfer.models.llama import LlamaModel
from minfer.weights import load_qweight, load_vector

ATTENTION, LINEAR, NONE = "attention", "linear", "none"
_BIASES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def layer_plan(gf, cfg: ModelConfig) -> tuple[tuple, tuple, tuple, tuple]:
    """Per layer: (kind, H_l, Hkv_l, F_l) as tuples, read as deci.cpp reads them (module doc), checked."""
    L = cfg.n_layers
    heads = cfg.heads_per_layer or (cfg.n_heads,) * L
    kv = cfg.kv_heads_per_layer or (cfg.n_kv_heads,) * L
    ff = cfg.ffn_per_layer or (cfg.ffn,) * L
    kinds = tuple(NONE if h == 0 else LINEAR if k == 0 else ATTENTION for h, k in zip(heads, kv))
    if ATTENTION not in kinds:
        raise MinferError(f"{gf.path}: {cfg.arch}.attention.head_count {list(heads)} / head_count_kv {list(kv)}: no "
                          "layer with attention (minfer runs deci files with at least one)")
    for i, (k, f) in enumerate(zip(kinds, ff)):
        if f == 0 and k != NONE:
            raise MinferError(f"{gf.path}: layer {i} has {k} attention and {cfg.arch}.feed_forward_length 0: llama.cpp's "
                              "deci graph drops that attention's output (its `continue` on n_ff == 0) where DeciLM adds "
                              "it; minfer refuses such a file rather than pick one")
    return kinds, tuple(heads), tuple(kv), tuple(ff)


def check_supported(gf, cfg: ModelConfig) -> None:
    refuse_biases(gf, cfg, _BIASES)
    for i in range(cfg.n_layers):
        if f"blk.{i}.ffn_gate_inp.weight" in gf.tensors:
            raise MinferError(f"{gf.path}: tensor 'blk.{i}.ffn_gate_inp.weight': deci files with MoE layers are not "
                              "supported")
    if f"{cfg.arch}.attention.scale" in gf.metadata:
        raise MinferError(f"{gf.path}: metadata key '{cfg.arch}.attention.scale' is not supported for deci (the "
                          "converter writes none: scores are scaled by 1/sqrt(head size))")


class DeciModel(LlamaModel):
    """blocks[i]: layer i's weights, None where its kind has none (attn_q/k/v on attention layers, attn_output on
    attention and linear layers, the FFN where F_l > 0); kinds[i], layer_cfg[i] (attention layers: the config with
    that layer's head counts, for layers.attention_heads)."""

    arch = "deci"
    rope_style = "normal"          # llama_model_rope_type: LLM_ARCH_DECI -> NORM
    per_layer_counts = True        # head_count, head_count_kv, feed_forward_length may be arrays (ModelConfig)
    attention_free_layers = True   # head_count_kv 0: a no-op or "linear attention" layer

    @classmethod
    def cache_config(cls, gf, cfg: ModelConfig):
        """cfg with the caches' per-layer geometry: (Hkv_l, Dh, Dh) on attention layers, none elsewhere."""
        kinds, _, kv, _ = layer_plan(gf, cfg)
        return with_kv_layers(cfg, [(h, cfg.head_dim, cfg.head_dim) if k == ATTENTION else None
                                    for k, h in zip(kinds, kv)])

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "DeciModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        check_supported(gf, cfg)
        kinds, heads, kv, ff = layer_plan(gf, cfg)
        cache_cfg = cls.cache_config(gf, cfg)
        V, D, Dh = cfg.vocab, cfg.d_model, cfg.head_dim
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        blocks = []
        for i in range(cfg.n_layers):
            p, kind, F = f"blk.{i}.", kinds[i], ff[i]

            def w(name, shape):
                return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

            blk = Block(attn_norm=None, attn_q=None, attn_k=None, attn_v=None, attn_output=None, ffn_norm=None,
                        ffn_gate=None, ffn_up=None, ffn_down=None)
            if kind != NONE:
                blk.attn_norm = load_vector(gf, p + "attn_norm.weight", device, D)
            if kind == LINEAR:         # load_arch_tensors: wo {n_embd, n_embd}
                blk.attn_output = w("attn_output", (D, D))
            elif kind == ATTENTION:
                blk.attn_q, blk.attn_k = w("attn_q", (heads[i] * Dh, D)), w("attn_k", (kv[i] * Dh, D))
                blk.attn_v, blk.attn_output = w("attn_v", (kv[i] * Dh, D)), w("attn_output", (D, heads[i] * Dh))
            if F > 0:
                blk.ffn_norm = load_vector(gf, p + "ffn_norm.weight", device, D)
                blk.ffn_gate, blk.ffn_up, blk.ffn_down = w("ffn_gate", (F, D)), w("ffn_up", (F, D)), w("ffn_down", (D, F))
            blocks.append(blk)
        output_norm, output = load_head(gf, cfg, token_embd, device, dtype)
        m = cls(cache_cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.kinds, m.ffn_widths = kinds, ff
        m.layer_cfg = [replace(cache_cfg, n_heads=heads[i], n_kv_heads=kv[i]) if kinds[i] == ATTENTION else None
                       for i in range(cfg.n_layers)]
        return m

    # ---- the forward ----

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd)          # (T, D) float32, the residual stream
        d = None                                             # a branch output not yet added to x

        def norm(weight):
            # the pending residual add together with the norm that follows it (ops.add_rms_norm)
            nonlocal x, d
            if d is None:
                return ops.rms_norm_cast(x, weight, eps, act, ctx)
            x, h = ops.add_rms_norm(x, d, weight, eps, act, ctx)
            d = None
            return h

        for i, blk in enumerate(self.blocks):
            kind = self.kinds[i]
            if kind == LINEAR:                               # deci.cpp: build_lora_mm(wo, attn_norm(x))
                d = ops.linear(norm(blk.attn_norm), blk.attn_output, None, ctx)
            elif kind == ATTENTION:
                h = norm(blk.attn_norm)
                d = ops.linear(attention_heads(h, blk, self.layer_cfg[i], cache, i, step, ctx), blk.attn_output,
                               None, ctx)
            if self.ffn_widths[i] > 0:
                d = ffn_branch(norm(blk.ffn_norm), blk, ctx)
        x = step.rows(x)
        if d is not None:
            d = step.rows(d)
        return self.head(norm(self.output_norm), ctx)     # (R, V)
