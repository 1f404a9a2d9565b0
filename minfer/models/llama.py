"""Llama (and its many relatives, e.g. SmolLM2): the GGUF arch `llama`.

    x_0 = E[tokens]                                   token_embd      (V, D)
    for each layer l:
        x = x + W_o attn(rope(W_q n(x)), rope(W_k n(x)), W_v n(x))    n = RMSNorm(attn_norm)
        x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))               n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm)            output (V, D), or token_embd when tied

RoPE: ggml NORM mode (adjacent pairs); the converter permuted attn_q/attn_k rows so this
equals HF's rotate_half on the original weights (see minfer/config.py).
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.models.layers import Block, feed_forward, load_block, self_attention
from minfer.weights import QWeight, load_qweight, load_vector


class LlamaModel:
    arch = "llama"
    has_qkv_bias = False  # qwen2 overrides

    def __init__(self, cfg: ModelConfig, token_embd: QWeight, blocks: list[Block],
                 output_norm: torch.Tensor, output: QWeight):
        self.cfg = cfg
        self.token_embd = token_embd      # (V, D)
        self.blocks = blocks
        self.output_norm = output_norm    # (D,)
        self.output = output              # (V, D); the same object as token_embd when tied

    @property
    def device(self) -> torch.device:
        return self.output_norm.device

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True) -> "LlamaModel":
        from tqdm import tqdm

        cfg = cfg or ModelConfig.from_gguf(gf)
        V, D = cfg.vocab, cfg.d_model
        bar = tqdm(total=cfg.n_layers + 2, desc=f"loading {gf.path.name}", unit="layer",
                   disable=not progress, leave=False)
        # An untied embedding is only gathered row by row: keep it quantized on the CPU
        # (saves V*D*4 bytes: 545 MB for Qwen2.5-0.5B).
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        bar.update()
        blocks = []
        for i in range(cfg.n_layers):
            blocks.append(load_block(gf, cfg, i, device, dtype, biases=cls.has_qkv_bias))
            bar.update()
        output_norm = load_vector(gf, "output_norm.weight", device, D)
        output = token_embd if cfg.tied_output else load_qweight(gf, "output.weight", device, (V, D), dtype=dtype)
        bar.update()
        bar.close()
        return cls(cfg, token_embd, blocks, output_norm, output)

    def forward(self, tokens: torch.Tensor, start_pos: int, cache, last_only: bool = False) -> torch.Tensor:
        """tokens (T,) int64 at positions start_pos.. -> logits (T, V) float32, or (1, V) with
        last_only. Appends the tokens' keys/values to `cache`."""
        T = tokens.shape[0]
        positions = torch.arange(start_pos, start_pos + T, device=tokens.device)
        x = ops.embedding(tokens, self.token_embd)                 # (T, D)
        for i, blk in enumerate(self.blocks):
            x = self_attention(x, blk, self.cfg, cache, i, start_pos, positions)
            x = feed_forward(x, blk, self.cfg)
        if last_only:
            x = x[-1:]
        x = ops.rms_norm(x, self.output_norm, self.cfg.rms_eps)
        return ops.linear(x, self.output).float()                  # (T, V)
