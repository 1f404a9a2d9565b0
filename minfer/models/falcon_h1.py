"""TII Falcon-H1 (0.5B, 1.5B, 1.5B-Deep, 3B, 7B, 34B): the GGUF arch `falcon-h1`, attention and a Mamba-2
mixer side by side in every layer, then a SwiGLU MLP.

    x_0 = E[tokens]                                        token_embd (V, D); output, or tied
    for each layer l:
        h = RMSNorm(x; attn_norm)
        x = x + W_o attn(rope(W_q h), rope(W_k h), W_v h) + mamba2(h)     both on the same h
        n = RMSNorm(x; ffn_norm)
        x = x + W_down(silu(W_gate n) * W_up n)
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/falcon-h1.cpp; the converter conversion/falcon_h1.py
FalconH1Model on conversion/mamba.py Mamba2Model; HF modeling_falcon_h1):
- Every layer has both mixers (load_arch_hparams: is_recr true for all layers; the graph runs
  build_attn and build_mamba2_layer on the same attn_norm output and adds both to the residual;
  HF FalconH1DecoderLayer: residual + mamba(h) * ssm_out_multiplier + attn(h * attention_in_multiplier)
  * attention_out_multiplier).
- The muP multipliers are not in the file: the converter folds each into the f16 weights
  (FalconH1Model.modify_tensors): embedding_multiplier into token_embd, lm_head_multiplier into
  output, mlp_multipliers into ffn_gate (inside the SiLU: act(W_g x * m) = act((m W_g) x)) and
  ffn_down, attention_in_multiplier into q/k/v with key_multiplier on k too, attention_out_multiplier
  into attn_output, ssm_in_multiplier and the five ssm_multipliers (HF's mup_vector over z, x, B, C,
  dt) into ssm_in's row blocks, ssm_out_multiplier into ssm_out. So the graph is multiplier-free,
  as llama.cpp's. (A tied file, whose converter output has no output.weight, gets the scaled
  embedding as its head, as in llama.cpp.)
- Attention: GQA with NEOX rope (llama_model_rope_type: LLM_ARCH_FALCON_H1 -> NEOX; HF rotate_half
  on unpermuted q/k: the converter does not permute them), `rope.freq_base`, head size
  `attention.key_length`, scores 1/sqrt(head_dim) (kq_scale; falcon-h1 reads no attention.scale).
- The Mamba-2 mixer is mamba2.py's with an inner size `ssm.inner_size` = HF mamba_d_ssm (not tied to
  2 * D: the converter skips that assertion for Falcon-H1) and heads `ssm.time_step_rank` =
  d_ssm / mamba_d_head; the gated group norm only where `ssm_norm.weight` is present (llama.cpp:
  TENSOR_NOT_REQUIRED, build_mamba2_layer skips it; HF mamba_rms_norm false -> y * silu(z), the
  released 0.5B/1.5B), else gate first then the group norm (HF FalconH1RMSNormGated with
  mamba_norm_before_gate false; with true HF norms first, which llama.cpp does not: the flag is not
  in the file), eps `attention.layer_norm_rms_epsilon`.
- The MLP: SwiGLU (build_ffn LLM_FFN_SILU, LLM_FFN_PAR; HF LlamaMLP), its norm the tensor
  `blk.N.ffn_norm` without a `.weight` suffix (load_arch_tensors: tn(LLM_TENSOR_FFN_NORM, i)).
- Refused by name: bias tensors (optional in llama.cpp; the released models have none: HF
  attention_bias / mlp_bias / projectors_bias / mamba_proj_bias false).

The cache: every layer keeps K/V rows (one geometry) and its Mamba-2 state (runtime/kv_cache.py
`state_layers`); `recurrent = True` (the engine's prefix rule) and `paged_kv = True` (the batch
engine's state slots, runtime/paged_state.py), as granitehybrid.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.models.base import Step
from minfer.models.granite import refuse_biases
from minfer.models.layers import Block, ffn_branch, merge_heads, rope_write_attend
from minfer.models.llama import LlamaModel
from minfer.models.mamba2 import load_mamba2, mamba2_mixer, read_dims, recurrent_state
from minfer.weights import QWeight, load_qweight, load_vector

_BIASES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "ssm_in", "ssm_out")


@dataclass(frozen=True)
class StateCacheConfig(ModelConfig):
    """One cache geometry for every layer, plus each layer's recurrent state (runtime/kv_cache.py
    reads state_layers: per layer the Mamba-2 conv ring and SSM ring shapes)."""

    state_layers: tuple = ()


def check_supported(gf, cfg: ModelConfig) -> None:
    refuse_biases(gf, cfg, _BIASES)


class FalconH1Model(LlamaModel):
    """blocks[i]: the norms, q/k/v/o and the SwiGLU MLP of every layer; mamba[i]: its Mamba-2 weights."""

    arch = "falcon-h1"
    rope_style = "neox"            # llama_model_rope_type: LLM_ARCH_FALCON_H1 -> NEOX
    paged_kv = True                # the paged cache's state slots (runtime/paged_state.py)
    recurrent = True               # the engine's prefix rule (granitehybrid's)

    @classmethod
    def cache_config(cls, gf, cfg: ModelConfig) -> StateCacheConfig:
        """cfg with every layer's Mamba-2 state (the memory preflight's config): the rows as any
        model's, the state once per sequence."""
        shapes = read_dims(gf, cfg.arch, cfg.d_model, inner_twice=False).state_shapes()
        return StateCacheConfig(**{f.name: getattr(cfg, f.name) for f in fields(ModelConfig)},
                                state_layers=(shapes,) * cfg.n_layers)

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "FalconH1Model":
        from tqdm import tqdm

        cfg = cfg or ModelConfig.from_gguf(gf)
        check_supported(gf, cfg)
        cache_cfg = cls.cache_config(gf, cfg)
        dims = read_dims(gf, cfg.arch, cfg.d_model, inner_twice=False)
        V, D = cfg.vocab, cfg.d_model
        bar = tqdm(total=cfg.n_layers + 2, desc=f"loading {gf.path.name}", unit="layer",
                   disable=not progress, leave=False)
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        blocks, mamba = [], []
        for i in range(cfg.n_layers):
            blocks.append(cls.load_layer(gf, cfg, i, device, dtype))
            mamba.append(load_mamba2(gf, i, dims, D, device, dtype, norm_required=False))
            bar.update()
        output_norm = load_vector(gf, "output_norm.weight", device, D)
        output = token_embd if cfg.tied_output else load_qweight(gf, "output.weight", device, (V, D), dtype=dtype)
        bar.close()
        m = cls(cache_cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.mamba, m.dims = mamba, dims
        return m

    @classmethod
    def load_layer(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        p, D, F, Dh = f"blk.{i}.", cfg.d_model, cfg.ffn, cfg.head_dim
        q_out, kv_out = cfg.n_heads * Dh, cfg.n_kv_heads * Dh

        def w(name, shape):
            return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

        return Block(attn_norm=load_vector(gf, p + "attn_norm.weight", device, D),
                     attn_q=w("attn_q", (q_out, D)), attn_k=w("attn_k", (kv_out, D)),
                     attn_v=w("attn_v", (kv_out, D)), attn_output=w("attn_output", (D, q_out)),
                     ffn_norm=load_vector(gf, p + "ffn_norm", device, D),     # no .weight suffix (module doc)
                     ffn_gate=w("ffn_gate", (F, D)), ffn_up=w("ffn_up", (F, D)), ffn_down=w("ffn_down", (D, F)))

    # ---- declarations ----

    def qweights(self) -> list[QWeight]:
        ws = super().qweights()
        out = ws.pop() if self.output is not self.token_embd else None
        for mb in self.mamba:
            ws += [mb.ssm_in, mb.ssm_out]
        return ws + ([out] if out is not None else [])

    # ---- the forward ----

    def attention(self, h: torch.Tensor, i: int, cache, step: Step, ctx) -> torch.Tensor:
        c, blk = self.cfg, self.blocks[i]
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        o = rope_write_attend(cache, i, q.view(T, H, Dh), k.view(T, Hkv, Dh), v.view(T, Hkv, Dh), step, c.rope, ctx)
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)

    def ssm(self, h: torch.Tensor, i: int, cache, step: Step, ctx) -> torch.Tensor:
        state = recurrent_state(cache, self.arch)
        return mamba2_mixer(h, self.mamba[i], self.dims, state(i), step.positions, self.cfg.rms_eps, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, blocks = self.act_dtype, self.cfg.rms_eps, self.blocks
        x = ops.embedding(tokens, self.token_embd)                           # (T, D) float32
        h = ops.rms_norm_cast(x, blocks[0].attn_norm, eps, act, ctx)
        f = None
        for i, blk in enumerate(blocks):
            mix = self.attention(h, i, cache, step, ctx).float() + self.ssm(h, i, cache, step, ctx).float()
            x, h = ops.add_rms_norm(x, mix, blk.ffn_norm, eps, act, ctx)
            f = ffn_branch(h, blk, ctx)
            if i + 1 < len(blocks):
                x, h = ops.add_rms_norm(x, f, blocks[i + 1].attn_norm, eps, act, ctx)
        x, f = step.rows(x), step.rows(f)                                    # (R, D)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)     # (R, V)
