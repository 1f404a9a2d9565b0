"""Nanbeige4.2 (NanbeigeForCausalLM, Nanbeige/Nanbeige4.2-3B): the GGUF arch `nanbeige`.

    x_0 = E[tokens]                                   token_embd (V, D)
    for loop j in 0 .. num_loops-1:
        for each physical layer i (0 .. block_count-1; cache slot i + j * block_count):
            x = x + W_o attn(rope(W_q n(x)), rope(W_k n(x)), W_v n(x))    n = RMSNorm(attn_norm)
            x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))               n' = RMSNorm(ffn_norm)
        if j + 1 < num_loops and not skip_loop_final_norm:  x = RMSNorm(x; output_norm)
    logits = W_out RMSNorm(x; output_norm)            output (V, D), or token_embd when tied

Llama's layer; what differs, and its source:
- Looped layers: the file's block_count physical layers run `nanbeige.num_loops` times (optional, default 1,
  >= 1) over the same weights (src/models/nanbeige.cpp load_arch_hparams expands n_layer to n_phys * n_loops,
  load_arch_tensors aliases layers[i + j * n_phys] = layers[i]). Each pass has its own KV-cache slot ("each slot
  still has its own KV index"): the model's cfg.n_layers is the slot count n_phys * n_loops (cache_config, also
  the preflight's KV sizing), which sizes every cache of the engine (runtime/kv_cache.py, runtime/paged_kv.py),
  and blocks[i + j * n_phys] is blocks[i].
- Between two loops the residual stream is replaced by its RMSNorm with output_norm's weight (the graph's
  "loop_norm": build_norm(inpL, model.output_norm) after a layer with (il + 1) % n_phys == 0 that is not the
  last), unless `nanbeige.skip_loop_final_norm` (optional bool, default false).
- Everything else is llama's: RMSNorm with attention.layer_norm_rms_epsilon, RoPE NORM (adjacent pairs) on the
  converter's permuted q/k rows (llama_model_rope_type: LLM_ARCH_NANBEIGE -> NORM; conversion/nanbeige.py
  NanbeigeModel(LlamaModel), undo_permute = True), rope_freqs.weight when the converter writes it (llama3
  scaling; read by config.py), scores 1/sqrt(head_dim) (nanbeige.cpp kq_scale: f_attention_scale is never
  read for this arch, so always that), SwiGLU MLP, output.weight or the tied embedding.
- Biases and a fused attn_qkv: llama.cpp's create_tensor_qkv could take them but the converter of the release
  (attention_bias false) writes none; refused by name rather than run without them.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import ffn_branch, ffn_residual_norm, refuse_layer_tensors, refuse_per_layer_shapes
from minfer.models.llama import LlamaModel
from minfer.weights import QWeight

_REFUSED_TENSORS = ("attn_qkv.weight", "attn_qkv.bias", "attn_q.bias", "attn_k.bias", "attn_v.bias",
                    "attn_output.bias")


def read_loops(gf, arch: str) -> tuple[int, bool]:
    """(num_loops, skip_loop_final_norm), the optional keys as nanbeige.cpp load_arch_hparams reads them."""
    n = gf.metadata.get(f"{arch}.num_loops", 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise MinferError(f"{gf.path}: metadata key '{arch}.num_loops' is {n!r}, expected an integer >= 1")
    skip = gf.metadata.get(f"{arch}.skip_loop_final_norm", False)
    if not isinstance(skip, bool):
        raise MinferError(f"{gf.path}: metadata key '{arch}.skip_loop_final_norm' is {skip!r}, expected a bool")
    return n, skip


class NanbeigeModel(LlamaModel):
    """LlamaModel whose physical blocks run num_loops times, each pass in its own cache slot."""

    arch = "nanbeige"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_NANBEIGE -> NORM
    n_phys: int = 0
    n_loops: int = 1
    loop_norm: bool = True

    @classmethod
    def block_passes(cls, gf) -> dict[int, int] | None:
        a = gf.architecture
        n = int(gf.metadata.get(f"{a}.num_loops", 1) or 1)
        return {i: n for i in range(int(gf.metadata.get(f"{a}.block_count", 0)))} if n > 1 else None

    @classmethod
    def cache_config(cls, gf, cfg: ModelConfig) -> ModelConfig:
        """cfg with n_layers the cache's slot count block_count * num_loops (the model's own cfg, and the
        preflight's KV sizing: commands/preflight.py cache_config)."""
        return replace(cfg, n_layers=cfg.n_layers * read_loops(gf, cfg.arch)[0])

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "NanbeigeModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        n_loops, skip = read_loops(gf, cfg.arch)
        refuse_per_layer_shapes(gf, cfg)
        refuse_layer_tensors(gf, cfg, _REFUSED_TENSORS, "the converter writes attn_q/attn_k/attn_v without "
                                                        "biases")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.n_phys, m.n_loops, m.loop_norm = cfg.n_layers, n_loops, not skip
        m.blocks = m.blocks * n_loops                       # slot i + j * n_phys: the same Block as slot i
        m.cfg = cls.cache_config(gf, cfg)                   # the cache's layers: one per pass
        return m

    # ---- declarations: each physical matrix once ----

    def physical(self) -> list:
        return self.blocks[:self.n_phys]

    def qweights(self) -> list[QWeight]:
        ws = [self.token_embd] + [w for b in self.physical() for w in b.matrices()]
        return ws + ([self.output] if self.output is not self.token_embd else [])

    def linear_groups(self) -> list[tuple]:
        return [(b.attn_q, b.attn_k, b.attn_v) for b in self.physical()]

    def decode_groups(self) -> list[tuple]:
        return self.linear_groups() + [(b.ffn_gate, b.ffn_up) for b in self.physical()]

    # ---- the forward ----

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows). LlamaModel's
        loop over the slots, with the loop norm after each loop but the last."""
        act, eps, blocks, n_phys = self.act_dtype, self.cfg.rms_eps, self.blocks, self.n_phys
        x = ops.embedding(tokens, self.token_embd)
        h = ops.rms_norm_cast(x, blocks[0].attn_norm, eps, act, ctx)
        for i, blk in enumerate(blocks):
            x, h = self.attention_residual_norm(h, blk, i, cache, step, ctx, x, eps, act)
            if i + 1 == len(blocks):
                f = ffn_branch(h, blk, ctx)
            elif (i + 1) % n_phys == 0 and self.loop_norm:
                # nanbeige.cpp "loop_norm": inpL = RMSNorm(l_out; output_norm), then the next loop's attn_norm
                _, x = ops.add_rms_norm(x, ffn_branch(h, blk, ctx), self.output_norm, eps, torch.float32, ctx)
                h = ops.rms_norm_cast(x, blocks[i + 1].attn_norm, eps, act, ctx)
            else:
                x, h = ffn_residual_norm(h, blk, x, blocks[i + 1].attn_norm, eps, act, ctx)
        x, f = step.rows(x), step.rows(f)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)
